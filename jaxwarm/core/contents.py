"""Which files the `--prewarm auto` fingerprint signs, how, and which it leaves to the
versions of the installed distributions (`jaxwarm.submit.fingerprint`'s `packages` part).

Shared by the login node (the step factory's sources, the files a recorded prewarm's
factory read) and the prewarm job (which records what its factory read,
`jaxwarm.job.record.reads`): both sides must draw the line in the same place.

A file up to FULL_HASH_BYTES is signed by its content; a larger one (a dataset, a
checkpoint the factory peeks into) by its size, modification and change times and inode,
one `fstat`: every `--prewarm auto` launch signs them again on the login node, and hashing
a file there costs about a second per 100 MB-1 GB (an 8 GiB file the factory read the
first KB of took 15 s a launch). A file the factory reached through a symlink is recorded
by the link too (`LINK` and its target), so a retargeted link is a change.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from importlib.metadata import Distribution
from pathlib import Path

from jaxwarm.core.files import open_regular

BLOCK_BYTES = 1 << 20
# The largest file signed by its content (sha256); a larger one by `stat_signature`.
FULL_HASH_BYTES = 8 << 20
# A link's record: this, then the path it leads to (`link_record`).
LINK = "link:"


def stat_signature(info: os.stat_result) -> str:
    """What changes when a file is rewritten, replaced or touched, for one stat: its size,
    modification and change times (a change time cannot be set back) and inode."""
    return f"stat:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}:{info.st_ino}"


def file_signature(path: str | Path) -> str:
    """The short sha256 of a file's bytes (read in blocks) up to FULL_HASH_BYTES, else its
    `stat_signature`; OSError when it cannot be read or is no regular file (a FIFO planted
    in its place is refused, never waited on)."""
    digest = hashlib.sha256()
    with open_regular(path, None, "a file the fingerprint signs", follow=True) as source:
        info = os.fstat(source.fileno())
        if info.st_size > FULL_HASH_BYTES:
            return stat_signature(info)
        while block := source.read(BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()[:16]


def link_record(path: str | Path) -> str:
    """What a path that goes through a symlink is recorded as: the path it leads to now."""
    return LINK + os.path.realpath(path)


def library_dirs() -> list[Path]:
    """Where the standard library and installed distributions live: what versions cover."""
    paths = sysconfig.get_paths()
    return [Path(paths[name]).resolve() for name in ("stdlib", "platstdlib", "purelib",
                                                     "platlib") if name in paths]


def installed_tops(libraries: list[Path],
                   installed: list[Distribution]) -> dict[Path, set[str]]:
    """Each dir outside LIBRARIES holding installed distributions (a `pip install --target`
    dir on PYTHONPATH, an HPC module's prefix) -> the top-level names their RECORDs (what
    the installer wrote) list there: files the `packages` part covers by name and version.
    An editable install's RECORD lists only its hook, so the user's source stays hashed."""
    tops: dict[Path, set[str]] = {}
    for dist in installed:
        where = Path(str(dist.locate_file(""))).resolve()
        if any(where.is_relative_to(library) for library in libraries):
            continue
        if dist.read_text("RECORD") is None:  # not installed: a source tree's egg-info
            continue
        names = {file.parts[0] for file in dist.files or () if file.parts}
        names = {name for name in names
                 if name != ".." and not name.endswith((".dist-info", ".pth"))}
        if names:
            tops.setdefault(where, set()).update(names)
    return tops


def covered(path: Path, libraries: list[Path], tops: dict[Path, set[str]]) -> bool:
    """Whether `path` (resolved) belongs to the standard library or an installed
    distribution: its version covers it, so it is not hashed."""
    return any(path.is_relative_to(library) for library in libraries) or \
        any(path.is_relative_to(where) and path.relative_to(where).parts[0] in names
            for where, names in tops.items())
