"""How JAX's file cache lays out an entry on disk. No jax import.

The same on every tested version (0.8.3 to 0.12.0.1; `jax._src.lru_cache` and
`compilation_cache`): `<key>-cache` holds zstd (when `zstandard` is importable) or zlib of a
4-byte big-endian compile time followed by the serialized executable; with a size cap,
`<key>-atime` holds the last use as 8-byte little-endian nanoseconds, and every read, write
and eviction holds `<dir>/.lockfile`.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from typing import Protocol

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
JAX_LOCK = ".lockfile"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# JAX prefixes the serialized executable with its compile time as a 4-byte integer.
TIME_BYTES = 4


def split_key(key: str) -> tuple[str, str]:
    """JAX's cache key as its two parts: `jit_train_step-<sha256 hex>` -> ('jit_train_step',
    '<sha256 hex>'), JAX naming the key after the module compiled. A key without a dash
    (none of JAX's) is ('', key)."""
    name, _, digest = key.rpartition("-")
    return name, digest


def function_of(key: str) -> str:
    """The function (module) name a key starts with: what the manifest, the report and
    `jaxwarm cache ls` group entries by; a key without one names itself."""
    return split_key(key)[0] or key


# Decompression runs in blocks of this many output bytes, so checking an entry holds at most
# a block in memory whatever the entry claims.
BLOCK_BYTES = 1 << 20


class PayloadTooBig(ValueError):
    """The stream decompresses to more than the cap: a decompression bomb, not an entry."""


class Readable(Protocol):
    """What an entry is read from: an open file, or a reader that passes its bytes through
    (`jaxwarm.store.integrity` hashes them on the way)."""

    def read(self, size: int = -1, /) -> bytes: ...


def payload_size(source: Readable, limit: int) -> int:
    """How many bytes JAX's entry payload decompresses to, read from `source` block by block
    (whichever compressor wrote it: zstd when importable, else zlib). Raises PayloadTooBig
    past `limit` output bytes, ValueError (or the compressor's error) for a broken stream."""
    size = 0
    for block in _payload_blocks(source):
        size += len(block)
        _within(size, limit)
    return size


def read_payload(source: Readable, limit: int) -> tuple[bytes, int]:
    """The serialized executable and the compile time JAX stored in an entry read from
    `source`, as JAX's `decompress_executable` and `extract_executable_and_time` give them,
    but inflated block by block: PayloadTooBig as soon as the payload passes `limit` bytes,
    before the rest is inflated (an entry of 1 GiB inflated stops at a 100 MB limit)."""
    payload = bytearray()
    for block in _payload_blocks(source):
        payload += block
        _within(len(payload), limit)
    return bytes(payload[TIME_BYTES:]), int.from_bytes(payload[:TIME_BYTES], "big")


def _payload_blocks(source: Readable) -> Iterator[bytes]:
    """An entry's payload, decompressed in blocks of at most BLOCK_BYTES; ValueError (or the
    compressor's error) for a broken stream, once it is found."""
    head = source.read(len(ZSTD_MAGIC))
    if head == ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raise ValueError("zstd-compressed, and the zstandard package is not installed "
                             "here to check it") from None
        reader = zstandard.ZstdDecompressor().stream_reader(_Prefixed(head, source))
        yield from iter(lambda: reader.read(BLOCK_BYTES), b"")
        return
    decompressor = zlib.decompressobj()
    for chunk in itertools.chain([head], iter(lambda: source.read(BLOCK_BYTES), b"")):
        pending = chunk
        while True:
            out = decompressor.decompress(pending, BLOCK_BYTES)
            yield out
            pending = decompressor.unconsumed_tail
            if not pending and len(out) < BLOCK_BYTES:
                break
    if not decompressor.eof:
        raise ValueError("incomplete or truncated stream")


def _within(size: int, limit: int) -> None:
    if size > limit:
        raise PayloadTooBig(f"decompresses to more than {limit} bytes (a decompression "
                            f"bomb, not a JAX entry)")


class _Prefixed:
    """`source` with `head`, already read from it, put back in front."""

    def __init__(self, head: bytes, source: Readable) -> None:
        self.head, self.source = head, source

    def read(self, size: int = -1) -> bytes:
        if self.head:
            data, self.head = self.head, b""
            return data
        return self.source.read(size)


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
