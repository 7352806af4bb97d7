"""The files a step factory reads while it builds the step (a JSON of model sizes, a
tokenizer's vocabulary), recorded by the prewarm job with the fingerprint it completed
under: what they hold can change the program, and the login node cannot know them before a
prewarm ran. The next `--prewarm auto` launch hashes them again and runs its prewarm when
one changed (`jaxwarm.submit.fingerprint.changed_reads`).

An audit hook (`sys.addaudithook`, on "open") notes every file opened for reading while the
factory runs, in any thread, with its `stat` at the open; after it returns, each regular
file outside the standard library and the installed distributions (their versions are in
the fingerprint) and outside jaxwarm's own dirs is signed (`jaxwarm.core.contents`: its
content up to 8 MiB, else size, times and inode). A file whose stat is not the one it had
when the factory opened it changed while the factory ran: what the factory read is not
what is there now, so it is recorded as changed (`CHANGED`), which no later signature
matches, and the next `--prewarm auto` launch runs its prewarm again. A file reached
through a symlink is recorded by the link too. A module the factory imports on the way is
read from its bytecode: its source is what is signed.

Not seen: files it reads later (in a step, in a thread it left running), files read by
native code (libc's `fopen` in a C++ tokenizer: no Python audit event), a file it only
looked for (`os.path.exists`) and did not find, which may appear later, and what it learns
other than from a file. `step.inputs` names such files for the launcher to sign itself
(`jaxwarm.submit.fingerprint`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from importlib.metadata import distributions
from pathlib import Path
from types import TracebackType

from jaxwarm.core.contents import (
    covered,
    file_signature,
    installed_tops,
    library_dirs,
    link_record,
    stat_signature,
)

log = logging.getLogger(__name__)

# The most files recorded: a bound on what one prewarm hashes, not one a factory should reach.
MAX_FILES = 5000
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# The record of a file that changed while the factory ran: no signature is ever this.
CHANGED = "changed while the step factory ran"

# The paths each active recorder saw opened (innermost last), with their stat signature
# at the first open (None: none could be taken).
_open: list[dict[str, str | None]] = []
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
        name = os.path.abspath(os.fsdecode(path))  # type: ignore[arg-type]
        seen = _open[-1]
        if name not in seen:
            try:
                seen[name] = stat_signature(os.stat(name))
            except OSError:
                seen[name] = None
    except Exception:  # noqa: BLE001 -- see the docstring
        return


class FactoryReads:
    """`with FactoryReads(exclude):` around the factory call; `files` is then the signature
    of each file it read, by resolved path (and each link it read through, by its path).
    `exclude`: dirs whose files are jaxwarm's (the cache dir, the run dir), not the
    factory's input."""

    def __init__(self, exclude: list[str | Path]) -> None:
        self.exclude = [Path(path).resolve() for path in exclude]
        self.files: dict[str, str] = {}
        self._seen: dict[str, str | None] = {}

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
            self.files = signed(dict(self._seen), self.exclude)


def source_of(path: str) -> Path:
    """The file whose content matters: a module's source for its cached bytecode."""
    if "__pycache__" in path and path.endswith(".pyc"):
        try:
            return Path(importlib.util.source_from_cache(path))
        except ValueError:
            pass
    return Path(path)


def signed(opened: dict[str, str | None], exclude: list[Path]) -> dict[str, str]:
    """The signature of each regular file `opened` (path -> stat at the open) that nothing
    else in the fingerprint covers, by resolved path, sorted; CHANGED for one whose stat is
    not the one it had at the open; each path through a symlink by its `link_record`."""
    libraries = library_dirs()
    candidates: dict[Path, list[str]] = {}  # resolved path -> the paths it was opened by
    for name in opened:
        path = source_of(name).resolve()
        if not any(path.is_relative_to(folder) for folder in [*libraries, *exclude]):
            candidates.setdefault(path, []).append(name)
    tops = installed_tops(libraries, list(distributions())) if candidates else {}
    files: dict[str, str] = {}
    changed = []
    for path in sorted(candidates):
        if covered(path, libraries, tops):
            continue
        if len(files) >= MAX_FILES:
            log.warning("the step factory read more than %d files: only the first are "
                        "recorded for --prewarm auto", MAX_FILES)
            break
        try:
            files[str(path)] = file_signature(path)
            now = stat_signature(os.stat(path))
        except OSError:  # gone, unreadable, or no regular file (a device, a FIFO)
            files.pop(str(path), None)
            continue
        for name in candidates[path]:
            source = str(source_of(name))
            if name == source and opened[name] not in (None, now) and \
                    files[str(path)] != CHANGED:  # a bytecode's stat is not its source's
                files[str(path)] = CHANGED
                changed.append(str(path))
            if source != str(path):
                files[source] = link_record(source)
    if changed:
        log.warning("jaxwarm: the step factory read %s, which changed while it ran: the "
                    "next --prewarm auto launch runs the prewarm again", ", ".join(changed))
    return dict(sorted(files.items()))
