"""How JAX's file cache lays out an entry on disk. No jax import.

The same on every tested version (0.8.3 to 0.12.0.1; `jax._src.lru_cache` and
`compilation_cache`): `<key>-cache` holds zstd (when `zstandard` is importable) or zlib of a
4-byte big-endian compile time followed by the serialized executable; with a size cap,
`<key>-atime` holds the last use as 8-byte little-endian nanoseconds, and every read, write
and eviction holds `<dir>/.lockfile`.
"""

from __future__ import annotations

import zlib

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
JAX_LOCK = ".lockfile"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# JAX prefixes the serialized executable with its compile time as a 4-byte integer.
TIME_BYTES = 4


def decompress(data: bytes) -> bytes:
    """JAX's entry payload, whichever compressor wrote it (zstd when importable, else zlib)."""
    if data.startswith(ZSTD_MAGIC):
        try:
            import zstandard
        except ImportError:
            raise ValueError("zstd-compressed, and the zstandard package is not installed "
                             "here to check it") from None
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 34)
    return zlib.decompress(data)


# Enough of an entry's first bytes to tell whether it starts like what JAX writes.
HEAD_BYTES = len(ZSTD_MAGIC)


def looks_like_entry(head: bytes) -> bool:
    """Does an entry's first `HEAD_BYTES` start a zstd frame or a zlib stream (CMF/FLG
    header: deflate, checksum a multiple of 31)?"""
    return head.startswith(ZSTD_MAGIC) or (
        len(head) >= 2 and head[0] & 0x0F == 8 and int.from_bytes(head[:2], "big") % 31 == 0)


def encode_atime(ns: int) -> bytes:
    return ns.to_bytes(8, "little")


def decode_atime(data: bytes) -> float:
    """Seconds since the epoch from an atime file's bytes."""
    return int.from_bytes(data, "little") / 1e9
