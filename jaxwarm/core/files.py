"""The file primitives every other module uses: an atomic write, a bounded lock, an append,
a bounded read.

Run dirs and cache dirs live on shared file systems that many jobs read while others write,
and jobs get killed at any moment. So a file is either absent, or the old one, or the whole
new one (`atomic_write`), and no lock is ever waited on forever: a holder that does not let
go within the timeout is named in a one-line `LockTimeout` (`locked`). Whoever can write
there (a member of a cache's trusted group, a job gone wrong) can also plant a link to
/dev/zero, a FIFO or a huge file under a name jaxwarm reads back: every such state file is
read through `open_regular` (`read_bounded`, `stream_lines`, `read_tail`), so it is a regular
file within its kind's cap or a one-line `RefusedFile`, never a hang; a log is appended to
(`append_line`) only as a regular file, never through a link, and a file written afresh
(a job's log) is created exclusively after what was there is removed (`fresh_file`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock, Timeout

from jaxwarm.core.errors import UserError

log = logging.getLogger(__name__)

# Metadata locks (manifest, usage log, JAX's own .lockfile) are held for milliseconds to a
# directory scan; a minute without progress means a stuck holder, not a slow one.
LOCK_TIMEOUT_S = 60.0
HOLDER_SUFFIX = ".holder"
# A holder note is one short JSON line.
HOLDER_CAP = 64 << 10
# What jaxwarm reads of a job's log or a trainer's metrics: their end, where a failed
# process's one line, srun's account and the last step are.
LOG_TAIL_BYTES = 1 << 20


PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700
GROUP_FILE, GROUP_DIR = 0o660, 0o2770
# The umask of a job on a group-shared cache: what JAX itself creates there gets group rw.
GROUP_UMASK = 0o007


def canonical_path(path: str | Path, base: Path | None = None) -> str:
    """Absolute, symlink-free path string: the form every job must see for the cache dir.

    Works for paths that do not exist yet (realpath resolves the existing prefix).
    """
    path = Path(path).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return os.path.realpath(path)


def modes_in(directory: str | Path) -> tuple[int, int]:
    """(file mode, dir mode) for what jaxwarm creates in `directory`. A dir shared with its
    group on purpose (setgid and group-writable, as a cache with `cache.trusted_group` is
    made) gets group read/write files and setgid dirs, so every member can read, lock,
    append to and replace them; any other gets private ones."""
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        return PRIVATE_FILE, PRIVATE_DIR
    if mode & stat.S_ISGID and mode & stat.S_IWGRP:
        return GROUP_FILE, GROUP_DIR
    return PRIVATE_FILE, PRIVATE_DIR


def make_dir(path: Path) -> Path:
    """Create `path` (if missing) with the mode `modes_in` gives its parent; the mode is set
    explicitly, since mkdir's is filtered by the umask."""
    try:
        path.mkdir(mode=modes_in(path.parent)[1])
    except FileExistsError:
        return path
    os.chmod(path, modes_in(path.parent)[1])
    return path


def make_dirs(path: Path) -> Path:
    """`make_dir` for `path` and each missing parent, from the top: every dir it creates gets
    its mode set explicitly (`Path.mkdir(parents=True)` leaves the parents to the umask,
    group-writable under umask 002)."""
    for directory in [*reversed(path.parents), path]:
        if not directory.is_dir():
            make_dir(directory)
    return path


class WriteFailed(UserError, OSError):
    """A write the system refused (full disk, quota, read-only, permission), phrased as the
    one line the user sees: the file and what was being written."""

    def __str__(self) -> str:
        return str(self.args[1])


@contextmanager
def writing(path: str | Path, what: str) -> Iterator[None]:
    """Name `path` and `what` in an OSError of the block that names no file (os.write on a
    full disk says only "No space left on device")."""
    try:
        yield
    except WriteFailed:
        raise
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise WriteFailed(exc.errno, f"{path}: {exc.strerror} while writing {what}") from exc


# Seconds this process has waited for jaxwarm's locks, by kind (`locked`'s `what` without the
# path or key it names): kept in the init report, so a job whose ranks queue on the manifest
# or the usage log says so.
_waited: dict[str, float] = {}


def lock_waits() -> dict[str, float]:
    """Seconds waited so far in this process for each kind of lock."""
    return {kind: round(seconds, 6) for kind, seconds in _waited.items()}


class LockTimeout(UserError, RuntimeError):
    """A lock was not released within its timeout; the message names the holder."""


@contextmanager
def staged_files(paths: Sequence[Path], mode: int = 0o644,
                 publish_under: AbstractContextManager[object] | None = None,
                 what: str = "it") -> Iterator[list[Path]]:
    """Temp paths next to each of `paths` to write to. When the block succeeds, each is
    synced and renamed over its path (inside `publish_under`, e.g. a lock, held only for
    the renames); when it fails, every temp is removed and no path changed: all or nothing.
    No paths: nothing to stage, publish or lock (an import that brings nothing new)."""
    if not paths:
        yield []
        return
    temps: list[Path] = []
    try:
        for path in paths:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            temps.append(Path(name))
        with writing(paths[0] if len(paths) == 1 else paths[0].parent, what):
            yield temps
            for tmp in temps:
                with tmp.open("rb+") as written:  # on disk before it becomes visible
                    os.fsync(written.fileno())
                os.chmod(tmp, mode)
        with publish_under or nullcontext():
            for tmp, path in zip(temps, paths, strict=True):
                os.replace(tmp, path)
    except BaseException:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | Path, mode: int = 0o644, what: str = "it") -> Iterator[Path]:
    """A temp path next to `path` to write to; renamed over `path` when the block succeeds,
    removed when it fails, so `path` is the old file or the whole new one, never torn.
    For writers that need a file name (tarfile); `atomic_write` is the short form."""
    with staged_files([Path(path)], mode, what=what) as (tmp,):
        yield tmp


def atomic_write(path: str | Path, data: str | bytes, mode: int = 0o644,
                 what: str = "it") -> Path:
    """Write `data` to `path` so readers see the old file or the new one, never a torn one
    (a full disk or a kill leaves the old file and no temp file behind)."""
    with atomic_path(path, mode, what) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(path)


def append_line(path: str | Path, line: str, mode: int, what: str) -> None:
    """Append one line (a JSON record) in one write. After a torn last line (a writer killed
    mid-line) it starts a new line, so that one bad line does not take this one with it.
    Concurrent writers must hold a lock around it (one write of a short line is not torn
    by another on a local file system, but the check of the last byte is not atomic).
    Only to a regular file, never through a final symlink or into a FIFO: anything else
    planted under the name is a RefusedFile, and nothing is written."""
    fd = regular_fd(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, None,
                    what, mode)
    try:
        end = os.fstat(fd).st_size
        if end and os.pread(fd, 1, end - 1) != b"\n":
            line = "\n" + line
        with writing(path, what):
            os.write(fd, line.encode())
    finally:
        os.close(fd)


class RefusedFile(UserError, OSError):
    """A state file jaxwarm will not read or append to: not a regular file (a symlink, a
    FIFO, a directory, a device) or bigger than the cap of its kind. `why` says which, without the
    path; the message is `<path>: <why>`."""

    def __init__(self, path: str | Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = Path(path), why

    def __str__(self) -> str:
        return str(self.args[0])


def file_kind(mode: int) -> str:
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISLNK, "a symlink"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def open_regular(path: str | Path, cap: int | None, what: str,
                 follow: bool = False) -> BinaryIO:
    """`path` opened for reading if it is a regular file of at most `cap` bytes (any size
    with None: a log read from its end). The last component is not followed (O_NOFOLLOW;
    `follow` for a file the user names, such as a config kept as a link) and the open never
    blocks (O_NONBLOCK: a FIFO), and the kind and size are those of the file opened
    (fstat), not of a name that may be swapped. Raises FileNotFoundError, another OSError
    (permission), or RefusedFile naming `what` ("a usage log") and its cap."""
    flags = os.O_RDONLY | (0 if follow else os.O_NOFOLLOW)
    return os.fdopen(regular_fd(path, flags, cap, what), "rb")


def regular_fd(path: str | Path, flags: int, cap: int | None, what: str,
               mode: int = PRIVATE_FILE) -> int:
    """`os.open(path, flags)`, never blocking (O_NONBLOCK), checked on the descriptor: a
    regular file of at most `cap` bytes, or RefusedFile (the descriptor closed)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        kinds = {errno.ELOOP: "a symlink", errno.EISDIR: "a directory"}
        if exc.errno in kinds:
            raise RefusedFile(path, f"not a regular file ({kinds[exc.errno]})") from None
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP, errno.ENODEV):  # a socket, a device
            raise RefusedFile(path, f"not a regular file ({exc.strerror})") from None
        raise
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = f"not a regular file ({file_kind(info.st_mode)})"
    elif cap is not None and info.st_size > cap:
        problem = f"{info.st_size} bytes, more than {what} may be ({cap} bytes)"
    if problem:
        os.close(fd)
        raise RefusedFile(path, problem)
    return fd


def fresh_file(path: str | Path, what: str, mode: int = 0o644) -> BinaryIO:
    """`path` created anew for writing (a job's log, written from its start): what was
    there is removed first (a link itself, never what it points to), then the file is
    created exclusively without following a link (O_EXCL | O_NOFOLLOW), so a link or file
    planted in between is refused, not written through. Raises RefusedFile for a directory
    there or a file planted in between."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise RefusedFile(path, "not a regular file (a directory)") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode)
    except FileExistsError:
        raise RefusedFile(path, f"created by another process while jaxwarm made {what} "
                                f"afresh; not written through") from None
    return os.fdopen(fd, "wb")


def read_capped(path: str | Path, cap: int, what: str, follow: bool = False) -> bytes:
    """The bytes of a regular file of at most `cap` bytes (`open_regular`); one that grew
    past the cap while it was read is refused too."""
    with open_regular(path, cap, what, follow) as source:
        data = source.read(cap + 1)
    if len(data) > cap:
        raise RefusedFile(path, f"more than {what} may be ({cap} bytes)")
    return data


def read_bounded(path: str | Path, cap: int, what: str) -> str:
    """`read_capped` as text; undecodable bytes are replaced."""
    return read_capped(path, cap, what).decode(errors="replace")


def stream_lines(path: str | Path, cap: int, what: str) -> Iterator[str]:
    """The lines of a log (a file many writers append to), streamed: never more than `cap`
    bytes in all are read, and never a whole file at once (`open_regular`)."""
    with open_regular(path, cap, what) as source:
        left = cap
        for raw in source:
            left -= len(raw)
            if left < 0:
                raise RefusedFile(path, f"more than {what} may be ({cap} bytes)")
            yield raw.decode(errors="replace").rstrip("\r\n")


def read_tail(path: str | Path, size: int = LOG_TAIL_BYTES) -> str:
    """The last `size` bytes of a log that may be any size (a job's output, a trainer's
    metrics), from its first whole line: what its end says, without reading the rest
    (`open_regular`: a regular file, or RefusedFile)."""
    with open_regular(path, None, "a log") as source:
        end = os.fstat(source.fileno()).st_size
        source.seek(max(end - size, 0))
        data = source.read(size)
    if end > size:
        data = data.partition(b"\n")[2]
    return data.decode(errors="replace")


def _holder_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + HOLDER_SUFFIX)


def describe_holder(lock_path: str | Path) -> str:
    """Who holds a lock, as recorded by `locked` (JAX's own lock records nobody)."""
    try:
        info = json.loads(read_bounded(_holder_path(Path(lock_path)), HOLDER_CAP,
                                       "a lock's holder note"))
        since = time.strftime("%H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on {info['host']} ({info['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "a process that did not record itself (JAX, or an older jaxwarm)"


def is_held(lock_path: str | Path) -> bool:
    """Whether some process holds the lock now: a probe that takes and drops it at once (a
    waiter in `locked` just retries), and creates no lock file that was not there."""
    if not Path(lock_path).exists():
        return False
    lock = FileLock(str(lock_path), timeout=0, mode=modes_in(Path(lock_path).parent)[0])
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False


@contextmanager
def locked(lock_path: str | Path, what: str, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the file lock at `lock_path` (filelock: flock, released when the holder dies).

    Waits at most `timeout_s`, logging once who it waits for, then raises LockTimeout naming
    the holder (at once with `timeout_s=0`: for locks that mean "busy", not "wait"). The
    holder is recorded next to the lock while it is held.
    """
    lock_path = Path(lock_path)
    lock = FileLock(str(lock_path), timeout=0, mode=modes_in(lock_path.parent)[0])
    started = time.monotonic()
    deadline = started + timeout_s
    announced = False
    kind = re.sub(r" (of|/).*", "", what)
    while True:
        try:
            lock.acquire()
            _waited[kind] = _waited.get(kind, 0.0) + time.monotonic() - started
            break
        except Timeout:
            if timeout_s == 0:
                raise LockTimeout(f"{lock_path}: the {what} is in use by "
                                  f"{describe_holder(lock_path)}") from None
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"{lock_path}: waited {timeout_s:g} s for the {what} lock, held by "
                    f"{describe_holder(lock_path)}; if that process is stuck, stop it") from None
            if not announced and time.monotonic() > deadline - timeout_s + 2:
                log.info("waiting for the %s lock %s, held by %s", what, lock_path,
                         describe_holder(lock_path))
                announced = True
            time.sleep(0.05)
    holder = _holder_path(lock_path)
    try:
        try:
            holder.unlink(missing_ok=True)  # a stale note, maybe another group member's
            fd = os.open(holder, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         modes_in(holder.parent)[0])
            with os.fdopen(fd, "w") as note:
                note.write(json.dumps({
                    "pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                    "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:3]])}))
        except OSError:
            pass  # a read-only holder note must not stop the work the lock protects
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()
