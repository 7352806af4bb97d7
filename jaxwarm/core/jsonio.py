"""JSON in and out for every record jaxwarm keeps (`jaxwarm.core.records`): standard JSON
written (`dumps`: no NaN or Infinity, which other tools cannot read), text parsed within a
nesting cap (`load_json`), records rebuilt through the config's converter (`from_json`:
`jaxwarm.core.decode.convert`, so a file with a missing key or a wrong type is one line
naming the file and the key), files read within a size cap (`jaxwarm.core.files`: a regular
file, never a link to /dev/zero or a FIFO).

Readers of files that many jobs write are lenient per record (`read_record`, `read_lines`):
a bad report or log line is skipped with one line logged, never fatal to the command reading
the others. Apart from the schema so that the schema reads as the list of what is kept, and
this as the one place that says how it is kept.

Pure: both the submit side and the code inside a job import it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jaxwarm.core.decode import convert
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import RefusedFile, read_bounded, stream_lines

log = logging.getLogger(__name__)

R = TypeVar("R")


def to_json(data: Any) -> Any:
    """Records (alone, or in lists and dicts) as plain JSON data, derived fields included."""
    if hasattr(data, "to_json"):  # a record with derived fields (`InitReport`) adds them
        return data.to_json()
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.asdict(data)
    if isinstance(data, (list, tuple)):
        return [to_json(item) for item in data]
    if isinstance(data, dict):
        return {key: to_json(value) for key, value in data.items()}
    return data


def dumps(data: Any, **options: Any) -> str:
    """Standard JSON text of records or plain data: a NaN or infinity is a ValueError here,
    not a file other tools cannot parse."""
    return json.dumps(to_json(data), allow_nan=False, **options)


def _reject_constant(name: str) -> Any:
    # json.loads asks this for NaN, Infinity and -Infinity, which it would otherwise accept.
    raise ValueError(f"{name} is not standard JSON")


# No record jaxwarm writes nests a tenth as deep; Python's parser gives up near 1000 levels.
JSON_MAX_DEPTH = 64
# Every record jaxwarm keeps in a run dir (an init report, verify's result, the prewarm
# decision and progress, a node's staging note, the submitted jobs): its biggest, a report
# of thousands of functions, is far below this.
RECORD_CAP = 16 << 20


def load_json(text: str | bytes) -> Any:
    """JSON text as data, or ValueError: not JSON, NaN or Infinity (not standard JSON), or
    nested more than JSON_MAX_DEPTH levels deep (never a RecursionError)."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:  # deeper than the parser goes: said as too deep, below
        level: list[Any] = [[]]
    else:
        level, depth = _containers([data]), 0
        while level and depth < JSON_MAX_DEPTH:  # level by level: no recursion here either
            depth += 1
            level = _containers([child for node in level for child in
                                 (node.values() if isinstance(node, dict) else node)])
    if level:
        raise ValueError(f"nested more than {JSON_MAX_DEPTH} levels deep")
    return data


def _containers(nodes: list[Any]) -> list[Any]:
    return [node for node in nodes if isinstance(node, (dict, list))]


def parse_json(text: str, source: str) -> Any:
    """JSON text as data, or ConfigError naming `source` (`load_json`)."""
    try:
        return load_json(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc})") from None


def from_json(cls: type[R], data: Any, source: str) -> R:
    """A record of type `cls` from parsed JSON, through the config's converter (ConfigError
    naming `source` and the key when it does not fit); derived fields are dropped first."""
    if isinstance(data, dict):
        # Written for the reader's convenience and recomputed from the rest: not fields.
        derived = getattr(cls, "DERIVED", ())
        data = {k: v for k, v in data.items() if k not in derived}
    return convert(cls, data, "", source)


# What `warn_once` said in this process.
_warned: set[str] = set()


def read_lines(path: Path, parse: Callable[[str, str], R], cap: int, what: str,
               keep: Callable[[str], bool] | None = None) -> list[R]:
    """The records of a JSON-lines file that many jobs append to, in order: `parse(line,
    source)` each, streamed (`files.stream_lines`: a regular file of at most `cap` bytes).
    A line that is not a record (a torn last line of a job killed mid-write, a line from
    another tool) is skipped with one log line naming the file and line, and a file that is
    not a regular one within its cap is read as empty with one line, once per command.
    With `keep`, only the lines it accepts are parsed."""
    records = []
    try:
        for number, line in enumerate(stream_lines(path, cap, what), 1):
            if keep is not None and not keep(line):
                continue
            try:
                records.append(parse(line, f"{path}:{number}"))
            except ConfigError as exc:
                warn_once(f"skipping {exc}")
    except FileNotFoundError:
        return []
    except RefusedFile as exc:
        warn_once(f"skipping {exc}")  # the line of a refused append (`usage.append_usage`)
        return []
    except OSError as exc:
        warn_once(f"skipping {path}: cannot read it ({exc.strerror})")
        return []
    return records


def warn_once(line: str) -> None:
    """Log `line` once per process: one command (or job) reads a log, or a broken manifest,
    more than once, and says what is wrong with it once."""
    if line not in _warned:
        _warned.add(line)
        log.warning("%s", line)


def read_record(cls: type[R], path: Path, cap: int = RECORD_CAP,
                what: str = "a jaxwarm record") -> R | None:
    """The record in the file at `path`, or None: silently when there is none, with one
    line naming the file and what is wrong when it is unreadable, not a regular file within
    `cap` bytes (`files.read_bounded`), or not a `cls`: one bad file among many (a job killed
    while writing, a file from another version, a planted link) never stops the reader."""
    try:
        return from_json(cls, parse_json(read_bounded(path, cap, what), str(path)), str(path))
    except FileNotFoundError:
        pass  # not written yet (or never): the caller's None, nothing wrong
    except RefusedFile as exc:
        log.warning("skipping %s", exc)
    except OSError as exc:
        log.warning("skipping %s: cannot read it (%s)", path, exc.strerror)
    except ConfigError as exc:
        log.warning("skipping %s", exc)
    return None
