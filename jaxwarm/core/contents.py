"""Which files the `--prewarm auto` fingerprint hashes by content, and which it leaves to the
versions of the installed distributions (`jaxwarm.submit.fingerprint`'s `packages` part).

Shared by the login node (the step factory's sources, the files a recorded prewarm's
factory read) and the prewarm job (which records what its factory read,
`jaxwarm.job.record.reads`): both sides must draw the line in the same place.
"""

from __future__ import annotations

import hashlib
import sysconfig
from importlib.metadata import Distribution
from pathlib import Path

from jaxwarm.core.files import open_regular

BLOCK_BYTES = 1 << 20


def content_hash(path: str | Path) -> str:
    """The short sha256 of a file's bytes, read in blocks; OSError when it cannot be read or
    is no regular file (a FIFO planted in its place is refused, never waited on)."""
    digest = hashlib.sha256()
    with open_regular(path, None, "a file the fingerprint hashes", follow=True) as source:
        while block := source.read(BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()[:16]


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
