"""How jaxwarm's one-line messages and logs say a count, a set of ranks and a length of time:
one helper each, so every line agrees ("1 entry", "2 entries"; "ranks 0-3"; "23 min 10 s").
Imports nothing, so every layer may use it."""

from __future__ import annotations


def plural(count: int, one: str, many: str | None = None) -> str:
    """The word for `count` things: `one`, else `many` (`one` + "s" when not given); for a
    verb too (`plural(len(names), "is", "are")`)."""
    if count == 1:
        return one
    return many if many is not None else one + "s"


def ranges(indices: list[int], prefix: str = "") -> str:
    """Process indices as runs, each named once: `[0, 1, 2, 4, 7, 8]` -> `0-2, 4, 7-8`
    (with prefix `p`: `p0-p2, p4, p7-p8`). How 64 ranks read in one line."""
    spans: list[list[int]] = []
    for index in sorted(set(indices)):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ", ".join(f"{prefix}{a}" if a == b else f"{prefix}{a}-{prefix}{b}" for a, b in spans)


def duration(seconds: float) -> str:
    """`12.3 s`, `23 min 10 s`, `1 h 5 min`: how long, for a person."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    return f"{minutes // 60} h {minutes % 60} min"


def human_size(size: float) -> str:
    unit = "B"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            break
        size /= 1024
    return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"


def human_age(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"
