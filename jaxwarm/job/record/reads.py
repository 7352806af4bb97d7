"""The files a step factory reads while it builds the step (a JSON of model sizes, a
tokenizer's vocabulary), recorded by the prewarm job with the fingerprint it completed
under: what they hold can change the program, and the login node cannot know them before a
prewarm ran. The next `--prewarm auto` launch hashes them again and runs its prewarm when
one changed (`jaxwarm.submit.fingerprint.changed_reads`).

An audit hook (`sys.addaudithook`, on "open") notes every file opened for reading while the
factory runs, in any thread; after it returns, each regular file outside the standard
library and the installed distributions (their versions are in the fingerprint) and outside
jaxwarm's own dirs is hashed by content. A module the factory imports on the way is read
from its bytecode: its source is what is hashed. Files it reads later (in a step, in a
thread it left running) are not seen, nor what it learns other than from a file.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from importlib.metadata import distributions
from pathlib import Path
from types import TracebackType

from jaxwarm.core.contents import content_hash, covered, installed_tops, library_dirs

log = logging.getLogger(__name__)

# The most files recorded: a bound on what one prewarm hashes, not one a factory should reach.
MAX_FILES = 5000
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

_open: list[set[str]] = []  # the paths each active recorder saw opened (innermost last)
_hooked = False


def _audit(event: str, args: tuple[object, ...]) -> None:
    """Called by Python on every audited event, in the thread that caused it: it must be
    cheap and must never raise (an exception here would fail the factory's `open`)."""
    if event != "open" or not _open:
        return
    try:
        path, _, flags = args
        if isinstance(path, int) or not isinstance(flags, int) or flags & _WRITES:
            return
        _open[-1].add(os.path.abspath(os.fsdecode(path)))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 -- see the docstring
        return


class FactoryReads:
    """`with FactoryReads(exclude):` around the factory call; `files` is then the hash of
    each file it read, by resolved path. `exclude`: dirs whose files are jaxwarm's (the
    cache dir, the run dir), not the factory's input."""

    def __init__(self, exclude: list[str | Path]) -> None:
        self.exclude = [Path(path).resolve() for path in exclude]
        self.files: dict[str, str] = {}
        self._seen: set[str] = set()

    def __enter__(self) -> FactoryReads:
        global _hooked
        if not _hooked:
            sys.addaudithook(_audit)
            _hooked = True
        _open.append(self._seen)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        _open.remove(self._seen)
        if kind is None:  # a copy taken at once: a thread may still be adding to it
            self.files = hashed(list(self._seen), self.exclude)


def source_of(path: str) -> Path:
    """The file whose content matters: a module's source for its cached bytecode."""
    if "__pycache__" in path and path.endswith(".pyc"):
        try:
            return Path(importlib.util.source_from_cache(path))
        except ValueError:
            pass
    return Path(path)


def hashed(paths: list[str], exclude: list[Path]) -> dict[str, str]:
    """The content hash of each regular file of `paths` that nothing else in the
    fingerprint covers (by resolved path, sorted)."""
    libraries = library_dirs()
    candidates = sorted(path for path in {source_of(path).resolve() for path in paths}
                        if not any(path.is_relative_to(folder)
                                   for folder in [*libraries, *exclude]))
    tops = installed_tops(libraries, list(distributions())) if candidates else {}
    files: dict[str, str] = {}
    for path in candidates:
        if covered(path, libraries, tops):
            continue
        if len(files) == MAX_FILES:
            log.warning("the step factory read more than %d files: only the first are "
                        "recorded for --prewarm auto", MAX_FILES)
            break
        try:
            files[str(path)] = content_hash(path)
        except OSError:  # gone, unreadable, or no regular file (a device, a FIFO)
            continue
    return files
