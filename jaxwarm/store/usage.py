"""The cache's usage log, `jaxwarm-usage.jsonl`: who looked up, hit or wrote which key.

Append-only, one JSON line per job's process 0 once its init is over (after its first step;
at its exit when the first step was only guessed), and one per entry jaxwarm quarantined,
pruned, or (a prewarm) fully checked, and one per entry a job missed. It is what
`jaxwarm cache ls` shows as "made by / used by",
what prune reads as a last use, and where `cache verify` finds the checksum of an entry a
job (not a prewarm) wrote.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxwarm.core.files import RefusedFile, append_line, locked, modes_in
from jaxwarm.core.jsonio import dumps, read_lines, to_json, warn_once
from jaxwarm.core.records import (
    EntryChecked,
    EntryMissed,
    EntryQuarantined,
    JobUsage,
    UsageRecord,
    parse_usage_line,
)

log = logging.getLogger(__name__)

USAGE_LOG = "jaxwarm-usage.jsonl"
# One line per job (a few hundred bytes per function it looked up) and per checked, missed,
# quarantined or pruned entry: a million jobs' worth.
USAGE_CAP = 512 << 20


def _compact(data: Any) -> Any:
    """Without the unset (None) fields: a hit carries no checksum, and a line without
    "sha256" is one a warm check of its key need not parse (`records_entry`)."""
    if isinstance(data, dict):
        return {key: _compact(value) for key, value in data.items() if value is not None}
    if isinstance(data, list):
        return [_compact(item) for item in data]
    return data


def append_usage(path: Path, record: UsageRecord) -> None:
    """One JSON line, appended to the log at `path` under a lock so concurrent jobs never
    interleave lines. After a torn last line (a writer killed mid-line) it starts a new
    line, so that one bad line does not take this record with it. Where something other than
    a regular file was planted under its name, the record is not written (one line says
    so)."""
    line = dumps(_compact(to_json(record)), sort_keys=True) + "\n"
    with locked(str(path) + ".lock", "usage log"):
        try:
            append_line(path, line, modes_in(path.parent)[0],
                        "a record to the cache's usage log")
        except RefusedFile as exc:  # planted there: the record is lost, the command goes on
            warn_once(f"skipping {exc}")


def read_usage(path: Path, keep: Callable[[str], bool] | None = None) -> list[UsageRecord]:
    """The usage log at `path` in order, streamed within USAGE_CAP; a line that is not a
    usage record (or a log that is not a regular file within the cap) is skipped with one
    log line (`jsonio.read_lines`). With `keep`, only the lines it accepts are parsed: a warm
    check of one key must not pay for parsing a log with one line per job ever run."""
    return read_lines(path, parse_usage_line, USAGE_CAP, "a usage log", keep)


def records_entry(key: str) -> Callable[[str], bool]:
    """Accepts the lines that can change what is recorded of `key`'s entry: its writes (with
    a sha256), checks, quarantines and prunes; not the many lines of jobs that only hit it."""
    return lambda line: key in line and ('"sha256"' in line or '"event"' in line)


@dataclass
class KeyHistory:
    """What the usage log says about one key."""

    last_used: float | None = None
    hits: int = 0
    misses: int = 0
    used_by: list[str] = field(default_factory=list)
    written_by: str | None = None
    # The checksum and size of the entry as last written (or fully checked, when no writer
    # recorded it); None once it was quarantined or pruned.
    sha256: str | None = None
    size: int | None = None
    removed: bool = False
    # A job missed the entry although it was there, and nothing checked it in full since.
    missed: bool = False
    # Why it was quarantined, when its last removal was a quarantine and nothing wrote it
    # since: a miss on it says that, not that it was pruned or deleted.
    quarantined: str | None = None


def key_histories(records: list[UsageRecord]) -> dict[str, KeyHistory]:
    histories: dict[str, KeyHistory] = {}
    for record in records:
        if isinstance(record, JobUsage):
            for function in record.functions:
                history = histories.setdefault(function.key, KeyHistory())
                history.last_used = record.time
                history.hits += function.hit
                history.misses += not function.hit
                if record.user not in history.used_by:
                    history.used_by.append(record.user)
                if function.sha256:
                    history.written_by, history.sha256, history.size, history.removed = \
                        record.user, function.sha256, function.size, False
                    history.missed, history.quarantined = False, None
            continue
        history = histories.setdefault(record.key, KeyHistory())
        if isinstance(record, EntryMissed):
            history.missed = True
        elif isinstance(record, EntryChecked):
            history.sha256, history.size, history.removed = record.sha256, record.size, False
            history.missed, history.quarantined = False, None
        else:  # quarantined or pruned
            history.sha256, history.size, history.removed = None, None, True
            history.missed = False
            history.quarantined = (record.problem or "a problem") \
                if isinstance(record, EntryQuarantined) else None
    return histories
