"""The cache's usage log, `jaxwarm-usage.jsonl`: who looked up, hit or wrote which key.

Append-only, one JSON line per job's process 0 after its first step, and one per entry
jaxwarm quarantined or pruned, or fully checked when nobody had recorded it. It is what
`jaxwarm cache ls` shows as "made by / used by",
what prune reads as a last use, and where `cache verify` finds the checksum of an entry a
job (not a prewarm) wrote.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.files import locked

log = logging.getLogger("jaxwarm.store")

USAGE_LOG = "jaxwarm-usage.jsonl"


def usage_path(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / USAGE_LOG


def append_usage(cache_dir: str | Path, record: dict[str, Any]) -> None:
    """One JSON line, appended under a lock so concurrent jobs never interleave lines."""
    path = usage_path(cache_dir)
    line = json.dumps({"time": time.time(), **record}, sort_keys=True) + "\n"
    with locked(str(path) + ".lock", "usage log"):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def read_usage(cache_dir: str | Path,
               keep: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
    """The usage log in order; a torn last line (a job killed mid-write) is skipped. With
    `keep`, only the lines it accepts are parsed: a warm check of one key must not pay for
    parsing a log with one line per job ever run."""
    try:
        lines = usage_path(cache_dir).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        if keep is not None and not keep(line):
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.debug("skipping a torn line in %s", usage_path(cache_dir))
    return records


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


def key_histories(records: list[dict[str, Any]]) -> dict[str, KeyHistory]:
    histories: dict[str, KeyHistory] = {}
    for record in records:
        if record.get("event") in ("quarantined", "pruned"):
            history = histories.setdefault(record["key"], KeyHistory())
            history.sha256, history.size, history.removed = None, None, True
            continue
        if record.get("event") == "checked":
            history = histories.setdefault(record["key"], KeyHistory())
            history.sha256, history.size, history.removed = \
                record["sha256"], record["size"], False
            continue
        user = f"{record.get('run', '?')} ({record.get('job', '?')} r{record.get('restart', 0)})"
        for function in record.get("functions", []):
            if not function.get("key"):
                continue
            history = histories.setdefault(function["key"], KeyHistory())
            history.last_used = record["time"]
            history.hits += bool(function.get("hit"))
            history.misses += not function.get("hit")
            if user not in history.used_by:
                history.used_by.append(user)
            if function.get("sha256"):
                history.written_by, history.sha256, history.size, history.removed = \
                    user, function["sha256"], function.get("size"), False
    return histories
