"""Which prewarms completed, under which fingerprint: `jaxwarm-prewarms.json` in the cache dir.

A launch with `--prewarm auto` skips its prewarm job when a prewarm recorded here ran under
the very fingerprint the launcher computes now (`jaxwarm.submit.fingerprint`) and every
entry it left is intact. The prewarm job records itself when it completed; a training job
that then misses one of those entries (something the login node could not see changed the
key: a GPU driver, a source file the fingerprint does not reach) forgets the record, so the
next launch runs its prewarm again. Kept next to the manifest, under a lock, written whole.
"""

from __future__ import annotations

import logging
from pathlib import Path

from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import RefusedFile, atomic_write, locked, modes_in, read_bounded
from jaxwarm.core.jsonio import dumps, from_json, parse_json
from jaxwarm.core.records import PrewarmRecord

log = logging.getLogger(__name__)

PREWARMS_NAME = "jaxwarm-prewarms.json"
# Old records of other fingerprints are of no use once many newer ones exist.
KEEP = 200
# KEEP records of a fingerprint each (its packages and source files): a few MB at most.
PREWARMS_CAP = 64 << 20


def read_prewarms(path: Path) -> dict[str, PrewarmRecord]:
    """The prewarms recorded at `path` by fingerprint digest, oldest first; empty when there
    are none. A broken file reads as empty, with one line: the launch then runs its prewarm,
    which is never wrong, and records it afresh."""
    try:
        text = read_bounded(path, PREWARMS_CAP, "a prewarm record file")
    except FileNotFoundError:
        return {}
    except RefusedFile as exc:
        log.warning("%s; every launch runs its prewarm", exc)
        return {}
    except OSError as exc:
        log.warning("%s: cannot read it (%s); every launch runs its prewarm", path,
                    exc.strerror)
        return {}
    try:
        records = from_json(list[PrewarmRecord], parse_json(text, str(path)), str(path))
    except ConfigError as exc:
        log.warning("%s; reading it as empty (the next prewarm rewrites it)", exc)
        return {}
    return {record.fingerprint.digest: record for record in records}


def _write(path: Path, records: dict[str, PrewarmRecord]) -> None:
    kept = sorted(records.values(), key=lambda record: record.time)[-KEEP:]
    atomic_write(path, dumps(kept, indent=1) + "\n", mode=modes_in(path.parent)[0],
                 what="the record of completed prewarms")


def record_prewarm(path: Path, record: PrewarmRecord) -> None:
    """Add (or renew) the record of a prewarm that completed under its fingerprint."""
    with locked(str(path) + ".lock", "prewarm records"):
        records = read_prewarms(path)
        records[record.fingerprint.digest] = record
        _write(path, records)


def forget_prewarm(path: Path, digest: str, key: str, why: str) -> None:
    """Drop the record of fingerprint `digest` when it promised the entry `key`: a job
    launched with that very fingerprint missed it anyway."""
    with locked(str(path) + ".lock", "prewarm records"):
        records = read_prewarms(path)
        record = records.get(digest)
        if record is None or key not in record.keys:
            return
        del records[digest]
        _write(path, records)
    log.warning("%s; the next launch with its fingerprint runs its prewarm again", why)
