"""How jaxwarm's one-line messages and logs say a count: one helper, so every line agrees
("1 entry", "2 entries"; "rank 3", "ranks 0-3"). Imports nothing, so every layer may use it."""

from __future__ import annotations


def plural(count: int, one: str, many: str | None = None) -> str:
    """The word for `count` things: `one`, else `many` (`one` + "s" when not given); for a
    verb too (`plural(len(names), "is", "are")`)."""
    if count == 1:
        return one
    return many if many is not None else one + "s"
