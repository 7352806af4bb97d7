"""Portable cache bundles: the entries a config needs, with their manifest, in one tar file.

An entry only loads under the jax/jaxlib version and platform that wrote it (both are in the
key, so another version would simply miss). Before jax 0.11, unless `cache.xla_caches` is
`none`, the key also hashes the cache dir path string (XLA's autotune dir is in the compile
options): such entries only hit in a cache at the same path. From jax 0.11 on the path is
not in the key, and a bundle imports into a cache anywhere. Import refuses each mismatch
up front instead of filling a cache with entries no run will ever load.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxwarm.core.config import Config, NonNegativeInt
from jaxwarm.core.decode import convert
from jaxwarm.core.errors import UserError
from jaxwarm.core.files import atomic_path, modes_in, staged_files
from jaxwarm.core.jsonio import load_json
from jaxwarm.jaxkey.entryformat import BLOCK_BYTES, CACHE_SUFFIX, encode_atime
from jaxwarm.jaxkey.versions import cache_path_in_key, required
from jaxwarm.store.entries import MAX_ENTRY_BYTES, is_entry_key, scan, sha256_file
from jaxwarm.store.integrity import entry_problem
from jaxwarm.store.manifest import ManifestEntry

if TYPE_CHECKING:
    from jaxwarm.store.store import LocalStore

BUNDLE_META = "jaxwarm-bundle.json"
BUNDLE_VERSION = 1
ENTRIES = "entries"
MAX_META_BYTES = 64 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
# What one import may add unless `--max-bytes` says more: well above a model's executables.
DEFAULT_IMPORT_LIMIT = 16 << 30
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"),
               (b"\x28\xb5\x2f\xfd", "zstd"))


class BundleError(UserError):
    """A bundle that cannot be exported or imported; the message is one line."""


@dataclass(frozen=True)
class BundleItem:
    sha256: str
    size: NonNegativeInt
    # The manifest record of the entry in the exporting cache, when a prewarm wrote it.
    manifest: dict[str, Any] | None = None


@dataclass(frozen=True)
class BundleMeta:
    version: int
    jax_version: str
    jaxlib_version: str
    platform: str
    cache_dir: str
    xla_caches: str
    created: float
    entries: dict[str, BundleItem]

    @property
    def portable(self) -> bool:
        """Whether its keys hold no cache path, so they hit at any cache dir: the XLA caches
        off, or jax >= 0.11 (`cache_path_in_key`)."""
        return not cache_path_in_key(self.jax_version, self.xla_caches)

    def refusal(self, config: Config) -> str | None:
        """Why the bundle's entries could never hit for this config; None when they can.
        Pure apart from reading the installed versions."""
        here = required()
        if (self.jax_version, self.jaxlib_version) != (here.jax, here.jaxlib):
            return (f"made with jax {self.jax_version} / jaxlib {self.jaxlib_version}, this "
                    f"environment has jax {here.jax} / jaxlib {here.jaxlib}")
        if self.platform != config.topology.platform:
            return (f"made for platform {self.platform}, the config runs on "
                    f"{config.topology.platform}")
        if self.cache_dir == config.cache.dir:
            return None
        if not self.portable:
            return (f"its keys include the cache path {self.cache_dir} (cache.xla_caches is "
                    f"{self.xla_caches!r} and jax {self.jax_version} < 0.11 hashes XLA's "
                    f"autotune dir), so they cannot hit in {config.cache.dir}; export from a "
                    f"config with cache.xla_caches: none to make a portable bundle")
        if cache_path_in_key(here.jax, config.cache.xla_caches):
            return (f"the config's cache.xla_caches is {config.cache.xla_caches!r}, which on "
                    f"jax {here.jax} (< 0.11) puts the cache path in every key; set it to "
                    f"none, as the exporting config did")
        return None


def export_bundle(store: LocalStore, config: Config, output: Path,
                  keys: list[str]) -> BundleMeta:
    """Write the entries `keys` of the config's cache (`store`), checked intact, to
    `output`."""
    manifest = store.manifest()
    here = required()
    entries = {}
    for key in keys:
        path = store.entry_path(key)
        expected = manifest[key].sha256 if key in manifest else None
        problem = entry_problem(path, expected)
        if problem:
            raise BundleError(f"{path}: {problem}; run `jaxwarm cache verify` and prewarm again")
        known = asdict(manifest[key]) if key in manifest else None
        entries[key] = BundleItem(sha256_file(path), path.stat().st_size, known)
    meta = BundleMeta(version=BUNDLE_VERSION, jax_version=here.jax,
                      jaxlib_version=here.jaxlib, platform=config.topology.platform,
                      cache_dir=store.dir, xla_caches=config.cache.xla_caches,
                      created=time.time(), entries=entries)
    with atomic_path(output) as tmp, tarfile.open(tmp, "w") as tar:
        data = json.dumps(asdict(meta), indent=1).encode()
        info = tarfile.TarInfo(BUNDLE_META)
        info.size, info.mtime = len(data), int(meta.created)
        tar.addfile(info, io.BytesIO(data))
        for key in keys:
            tar.add(store.entry_path(key), arcname=f"{ENTRIES}/{key}{CACHE_SUFFIX}")
    return meta


def read_meta(tar: tarfile.TarFile, source: Path) -> BundleMeta:
    """The bundle's metadata, every field checked (keys against JAX's key pattern, so no key
    can name a path outside the cache), or a one-line BundleError."""
    try:
        member = tar.getmember(BUNDLE_META)
    except KeyError:
        raise BundleError(f"{source}: not a jaxwarm bundle (no {BUNDLE_META})") from None
    if not member.isreg() or member.size > MAX_META_BYTES:
        raise BundleError(f"{source}: {BUNDLE_META} is not a regular file of at most "
                          f"{MAX_META_BYTES} bytes")
    try:
        reader = tar.extractfile(member)
        assert reader is not None  # a regular file, checked above
        meta = convert(BundleMeta, load_json(reader.read()), "", BUNDLE_META)
    except (ValueError, tarfile.TarError) as exc:  # ConfigError: a ValueError
        raise BundleError(f"{source}: not a valid jaxwarm bundle ({exc})") from None
    if meta.version != BUNDLE_VERSION:
        raise BundleError(f"{source}: bundle format {meta.version}, this jaxwarm reads "
                          f"{BUNDLE_VERSION}")
    for key, item in meta.entries.items():
        if not is_entry_key(key):
            raise BundleError(f"{source}: entries: {key!r} is not a JAX cache key "
                              f"(<function>-<64 hex digits>); refusing the bundle")
        if not _SHA256.fullmatch(item.sha256):
            raise BundleError(f"{source}: entries.{key}.sha256: expected 64 hex digits")
        manifest_record(source, key, item)
    return meta


def manifest_record(source: Path, key: str, item: BundleItem) -> ManifestEntry | None:
    """The manifest record a bundle carries for an entry, checked like the manifest's own.
    It must be the record of that entry: one naming another key would rewrite that key's
    record (its checksum, size, run) in the target cache, an entry the bundle did not bring."""
    if item.manifest is None:
        return None
    try:
        record = convert(ManifestEntry, {**item.manifest, "sha256": item.sha256,
                                         "size": item.size}, f"entries.{key}.manifest",
                         BUNDLE_META)
    except ValueError as exc:
        raise BundleError(f"{source}: not a valid jaxwarm bundle ({exc})") from None
    if record.key != key:
        raise BundleError(f"{source}: {BUNDLE_META}: entries.{key}.manifest.key: "
                          f"{record.key!r} is not the key of its entry; refusing the bundle")
    return record


def import_bundle(source: Path, store: LocalStore, config: Config,
                  max_bytes: int = DEFAULT_IMPORT_LIMIT) -> tuple[list[str], list[str]]:
    """Copy the bundle's entries into the config's cache (`store`); returns (added, already
    present).

    Bounded by what the bundle is, not by what it claims: only a plain tar is read (a
    compressed one could expand without limit), every member must lie within the file (no
    sparse member), and each entry's size and the total are checked against the limits and
    the free space before any byte is written. All or nothing: every entry is staged next
    to its place, copied in blocks and checked (size, checksum, a full decompression under
    the entry's payload cap); only when all passed are they published, by rename under
    JAX's lock with their atime files, so a running job never sees a partial entry and a
    size-capped writer finds the atime file it expects.
    """
    if not source.is_file():  # a FIFO or a device would be read forever
        raise BundleError(f"{source}: not a regular file; expected a bundle from "
                          f"`jaxwarm cache export`")
    refuse_compressed(source)
    try:
        tar = tarfile.open(source, "r:")
        tar.getmembers()  # every header read (and checked) once, here
    except (OSError, tarfile.TarError) as exc:
        raise BundleError(f"{source}: cannot read bundle ({exc})") from None
    with tar:
        meta = read_meta(tar, source)
        reason = meta.refusal(config)
        if reason:
            raise BundleError(f"{source}: refusing to import: {reason}")
        present = {entry.key for entry in scan(store, histories={})}
        todo = {key: item for key, item in meta.entries.items() if key not in present}
        members = {key: checked_member(tar, source, key, item) for key, item in todo.items()}
        check_total(source, store.path, sum(item.size for item in todo.values()), max_bytes)
        targets = [path for key in todo
                   for path in (store.entry_path(key), store.atime_path(key))]
        with staged_files(targets, modes_in(store.path)[0] | 0o044,
                          publish_under=store.jax_lock(),
                          what=f"the entries of {source}") as temps:
            for (key, item), entry_tmp, atime_tmp in zip(todo.items(), temps[::2], temps[1::2],
                                                         strict=True):
                copy_member(tar, members[key], entry_tmp, source, key, item)
                atime_tmp.write_bytes(encode_atime(time.time_ns()))
    recorded = [record for key, item in todo.items()
                if (record := manifest_record(source, key, item)) is not None]
    if recorded:
        store.record_entries(recorded)
    return list(todo), sorted(present & set(meta.entries))


def refuse_compressed(source: Path) -> None:
    """A bundle is a plain tar (its entries are compressed already): a gzip, bzip2, xz or
    zstd stream around it could expand without bound, so it is refused, not read."""
    with source.open("rb") as head:
        start = head.read(6)
    kind = next((name for magic, name in _COMPRESSED if start.startswith(magic)), None)
    if kind:
        raise BundleError(f"{source}: a {kind}-compressed file; `jaxwarm cache import` reads "
                          f"the plain tar `cache export` writes (decompress it first)")


def checked_member(tar: tarfile.TarFile, source: Path, key: str,
                   item: BundleItem) -> tarfile.TarInfo:
    """The tar member of an entry: a regular, non-sparse file of the listed size, no bigger
    than any JAX entry, whose bytes lie within the bundle file (a header cannot claim more
    data than the file holds). Checked before anything is written."""
    name = f"{ENTRIES}/{key}{CACHE_SUFFIX}"
    try:
        member = tar.getmember(name)
    except KeyError:
        raise BundleError(f"{source}: entry {key} is listed but missing") from None
    if not member.isreg() or member.issparse():
        raise BundleError(f"{source}: {name} is not a regular file (a link, device or sparse "
                          f"member); refusing the bundle")
    if member.size != item.size:
        raise BundleError(f"{source}: {name} is {member.size} bytes, the bundle lists "
                          f"{item.size} (damaged bundle)")
    if item.size > MAX_ENTRY_BYTES:
        raise BundleError(f"{source}: {name} is {item.size} bytes, more than any JAX entry "
                          f"({MAX_ENTRY_BYTES} bytes); refusing the bundle")
    if member.offset_data + member.size > source.stat().st_size:
        raise BundleError(f"{source}: {name} claims {member.size} bytes, more than the file "
                          f"holds (damaged or crafted bundle)")
    return member


def check_total(source: Path, cache_dir: Path, total: int, max_bytes: int) -> None:
    if total > max_bytes:
        raise BundleError(f"{source}: its new entries are {total} bytes, more than the import "
                          f"limit of {max_bytes} bytes (raise it with --max-bytes)")
    free = shutil.disk_usage(cache_dir).free
    if total > free:
        raise BundleError(f"{source}: its new entries are {total} bytes, {cache_dir} has "
                          f"{free} bytes free")


def copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, source: Path,
                key: str, item: BundleItem) -> None:
    """Copy an entry from the bundle to `target` in blocks (nothing beyond the listed size is
    read), then check it in full: the listed checksum, and a decompression within the
    entry's payload cap (a zlib bomb is refused, not imported)."""
    reader = tar.extractfile(member)
    assert reader is not None  # a regular file (`checked_member`)
    digest = hashlib.sha256()
    left = item.size
    with target.open("wb") as out:
        while left and (block := reader.read(min(left, BLOCK_BYTES))):
            digest.update(block)
            out.write(block)
            left -= len(block)
    if digest.hexdigest() != item.sha256:
        raise BundleError(f"{source}: entry {key} does not match its checksum (damaged bundle)")
    problem = entry_problem(target, item.sha256)
    if problem:
        raise BundleError(f"{source}: entry {key}: {problem}; refusing the bundle")
