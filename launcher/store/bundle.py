"""Portable cache bundles: the entries a config needs, with their manifest, in one tar file.

An entry only loads under the jax/jaxlib version and platform that wrote it (both are in the
key, so another version would simply miss). Before jax 0.11, unless `cache.xla_caches` is
`none`, the key also hashes the cache dir path string (XLA's autotune dir is in the compile
options): such entries only hit in a cache at the same path. From jax 0.11 on the path is
not in the key, and a bundle imports into a cache anywhere. Import refuses each mismatch
up front instead of filling a cache with entries no run will ever load.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from launcher.config import Config
from launcher.files import atomic_path
from launcher.store.integrity import entry_problem
from launcher.store.manifest import ManifestEntry, read_manifest, record_entries
from launcher.store.entries import (CACHE_SUFFIX, atime_path, entry_path, jax_lock, scan,
                                    sha256_file)
from prewarm.jaxkey.entryformat import encode_atime
from prewarm.jaxkey.versions import cache_path_in_key

BUNDLE_META = "jaxwarm-bundle.json"
BUNDLE_VERSION = 1
ENTRIES = "entries"


class BundleError(Exception):
    """A bundle that cannot be exported or imported; the message is one line."""


@dataclass(frozen=True)
class BundleMeta:
    version: int
    jax_version: str
    jaxlib_version: str
    platform: str
    cache_dir: str
    xla_caches: str
    created: float
    entries: dict[str, dict[str, Any]]


def installed_versions() -> tuple[str, str]:
    return metadata.version("jax"), metadata.version("jaxlib")


def path_independent(xla_caches: str, jax_version: str) -> bool:
    return not cache_path_in_key(jax_version, xla_caches)


def export_bundle(config: Config, output: Path, keys: list[str]) -> BundleMeta:
    """Write the entries `keys` of the config's cache, checked intact, to `output`."""
    cache_dir = config.cache.dir
    manifest = read_manifest(cache_dir)
    jax_version, jaxlib_version = installed_versions()
    entries = {}
    for key in keys:
        path = entry_path(cache_dir, key)
        expected = manifest[key].sha256 if key in manifest else None
        problem = entry_problem(path, expected)
        if problem:
            raise BundleError(f"{path}: {problem}; run `jaxwarm cache verify` and prewarm again")
        known = asdict(manifest[key]) if key in manifest else None
        entries[key] = {"sha256": sha256_file(path), "size": path.stat().st_size,
                        "manifest": known}
    meta = BundleMeta(version=BUNDLE_VERSION, jax_version=jax_version,
                      jaxlib_version=jaxlib_version, platform=config.topology.platform,
                      cache_dir=cache_dir, xla_caches=config.cache.xla_caches,
                      created=time.time(), entries=entries)
    with atomic_path(output) as tmp, tarfile.open(tmp, "w") as tar:
        data = json.dumps(asdict(meta), indent=1).encode()
        info = tarfile.TarInfo(BUNDLE_META)
        info.size, info.mtime = len(data), int(meta.created)
        tar.addfile(info, io.BytesIO(data))
        for key in keys:
            tar.add(entry_path(cache_dir, key), arcname=f"{ENTRIES}/{key}{CACHE_SUFFIX}")
    return meta


def read_meta(tar: tarfile.TarFile, source: Path) -> BundleMeta:
    try:
        member = tar.extractfile(BUNDLE_META)
        meta = BundleMeta(**json.loads(member.read()))
    except (KeyError, AttributeError, TypeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{source}: not a jaxwarm bundle (no valid {BUNDLE_META}: "
                          f"{exc})") from None
    if meta.version != BUNDLE_VERSION:
        raise BundleError(f"{source}: bundle format {meta.version}, this jaxwarm reads "
                          f"{BUNDLE_VERSION}")
    return meta


def refusal(meta: BundleMeta, config: Config) -> str | None:
    """Why the bundle's entries could never hit for this config; None when they can. Pure
    apart from reading the installed versions."""
    jax_version, jaxlib_version = installed_versions()
    if (meta.jax_version, meta.jaxlib_version) != (jax_version, jaxlib_version):
        return (f"made with jax {meta.jax_version} / jaxlib {meta.jaxlib_version}, this "
                f"environment has jax {jax_version} / jaxlib {jaxlib_version}")
    if meta.platform != config.topology.platform:
        return f"made for platform {meta.platform}, the config runs on {config.topology.platform}"
    if meta.cache_dir == config.cache.dir:
        return None
    if not path_independent(meta.xla_caches, meta.jax_version):
        return (f"its keys include the cache path {meta.cache_dir} (cache.xla_caches is "
                f"{meta.xla_caches!r} and jax {meta.jax_version} < 0.11 hashes XLA's autotune "
                f"dir), so they cannot hit in {config.cache.dir}; export from a config with "
                f"cache.xla_caches: none to make a portable bundle")
    if not path_independent(config.cache.xla_caches, jax_version):
        return (f"the config's cache.xla_caches is {config.cache.xla_caches!r}, which on jax "
                f"{jax_version} (< 0.11) puts the cache path in every key; set it to none, as "
                f"the exporting config did")
    return None


def import_bundle(source: Path, config: Config) -> tuple[list[str], list[str]]:
    """Copy the bundle's entries into the config's cache; returns (added, already present).

    Each entry is checked against the bundle's checksum before it becomes visible, and
    published by rename under JAX's lock with its atime file, so a running job never sees a
    partial entry and a size-capped writer finds the atime file it expects.
    """
    cache_dir = Path(config.cache.dir)
    try:
        tar = tarfile.open(source)
    except (OSError, tarfile.TarError) as exc:
        raise BundleError(f"{source}: cannot read bundle ({exc})") from None
    with tar:
        meta = read_meta(tar, source)
        reason = refusal(meta, config)
        if reason:
            raise BundleError(f"{source}: refusing to import: {reason}")
        present = {entry.key for entry in scan(cache_dir, histories={})}
        added, skipped, recorded = [], [], []
        for key, item in meta.entries.items():
            if key in present:
                skipped.append(key)
                continue
            member = tar.extractfile(f"{ENTRIES}/{key}{CACHE_SUFFIX}")
            if member is None:
                raise BundleError(f"{source}: entry {key} is listed but missing")
            tmp = cache_dir / f".{key}.import{os.getpid()}"
            tmp.write_bytes(member.read())
            if sha256_file(tmp) != item["sha256"]:
                tmp.unlink()
                raise BundleError(f"{source}: entry {key} does not match its checksum "
                                  f"(damaged bundle)")
            with jax_lock(cache_dir):
                os.replace(tmp, entry_path(cache_dir, key))
                atime_path(cache_dir, key).write_bytes(encode_atime(time.time_ns()))
            added.append(key)
            if item.get("manifest"):
                recorded.append(ManifestEntry(**{**item["manifest"], "sha256": item["sha256"],
                                                 "size": item["size"]}))
    if recorded:
        record_entries(cache_dir, recorded)
    return added, skipped
