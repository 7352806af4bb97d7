"""A bundle cannot write outside the cache, and an import is all or nothing: crafted bundles
(path keys, link members, bad checksums, malformed metadata) through the real CLI."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
import zlib
from dataclasses import asdict
from pathlib import Path

import pytest

from jaxwarm.jaxkey.versions import required
from jaxwarm.store.bundle import BUNDLE_META
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore
from tests.conftest import DEMO, run_cli
from tests.hostile import assert_refused, snapshot

pytestmark = pytest.mark.e2e


def key(n: int) -> str:
    return f"jit_f{n}-{hashlib.sha256(str(n).encode()).hexdigest()}"


def entry_bytes(n: int) -> bytes:
    return zlib.compress(bytes(4) + bytes([n]) * 200)


def meta(entries: object) -> dict:
    here = required()
    return {"version": 1, "jax_version": here.jax, "jaxlib_version": here.jaxlib,
            "platform": "cpu", "cache_dir": "/elsewhere", "xla_caches": "none",
            "created": time.time(), "entries": entries}


def item(data: bytes, record: dict | None = None) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "manifest": record}


def record(n: int, names: str | None = None, run: str = "exporter") -> dict:
    """The manifest record a prewarm of run `run` would have written for entry `n`'s key (or
    for the key `names`)."""
    return asdict(ManifestEntry(function=f"jit_f{n}", key=names or key(n), run=run,
                                config="/c.yaml", compile_s=1.5, lower_s=0.1, written=True,
                                jax_version="0", process_count=1,
                                sha256=hashlib.sha256(entry_bytes(n)).hexdigest(),
                                size=len(entry_bytes(n))))


def write_bundle(path: Path, metadata: dict, members: list[tarfile.TarInfo | tuple[str, bytes]]
                 ) -> Path:
    with tarfile.open(path, "w") as tar:
        data = json.dumps(metadata).encode()
        info = tarfile.TarInfo(BUNDLE_META)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                name, payload = member
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return path


def good(n: int) -> tuple[str, bytes]:
    return f"entries/{key(n)}-cache", entry_bytes(n)


def import_into(tmp_path: Path, bundle: Path):
    return run_cli("cache", "import", str(bundle), str(DEMO), f"run.out_dir={tmp_path / 'runs'}",
                   f"cache.dir={tmp_path / 'cache'}", "cache.xla_caches=none")


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A user's file an attacker's bundle aims at, beside the cache."""
    target = tmp_path / "x"
    target.mkdir()
    (target / "abspwn-cache").write_text("precious\n")
    return target


def hostile_bundles(tmp_path: Path, victim: Path) -> dict[str, tuple[dict, list, str]]:
    payload = entry_bytes(9)
    climbing = "/.." * 12 + f"{victim}/abspwn"
    link = tarfile.TarInfo(f"entries/{key(3)}-cache")
    link.type, link.linkname = tarfile.SYMTYPE, str(victim / "abspwn-cache")
    hard = tarfile.TarInfo(f"entries/{key(3)}-cache")
    hard.type, hard.linkname = tarfile.LNKTYPE, f"entries/{key(1)}-cache"
    three = {key(n): item(entry_bytes(n)) for n in (1, 2, 3)}
    return {
        "absolute climbing key": (meta({climbing: item(payload)}),
                                  [(f"entries/{climbing}-cache", payload)],
                                  "is not a JAX cache key"),
        "relative climbing key": (meta({"../../x/abspwn": item(payload)}),
                                  [("entries/../../x/abspwn-cache", payload)],
                                  "is not a JAX cache key"),
        "symlink member, third of three": (meta(three), [good(1), good(2), link],
                                           "is not a regular file"),
        "hard link member": (meta(three), [good(1), good(2), hard], "is not a regular file"),
        "bad checksum, second of three": (
            meta({**three, key(2): {**item(entry_bytes(2)), "sha256": "0" * 64}}),
            [good(1), good(2), good(3)], "does not match its checksum"),
        "size differs": (meta({**three, key(3): {**item(entry_bytes(3)), "size": 5}}),
                         [good(1), good(2), good(3)], "the bundle lists 5"),
        "entries is a list": (meta([]), [], "entries: expected a mapping, got list"),
        "entry without sha256": (meta({key(1): {"size": 3}}), [good(1)],
                                 f"missing required key 'entries.{key(1)}.sha256'"),
        "sha256 not hex": (meta({key(1): {**item(entry_bytes(1)), "sha256": "../x"}}),
                           [good(1)], "expected 64 hex digits"),
        "unknown field": (meta({key(1): {**item(entry_bytes(1)), "owner": "me"}}), [good(1)],
                          f"unknown key 'entries.{key(1)}.owner'"),
        "manifest of the wrong shape": (
            meta({key(1): {**item(entry_bytes(1)), "manifest": {"function": 3}}}), [good(1)],
            "manifest.function: expected a string"),
        "listed but missing": (meta(three), [good(1), good(2)], "listed but missing"),
        "manifest record of another key": (
            meta({key(1): item(entry_bytes(1), record(1, names=key(2)))}), [good(1)],
            f"entries.{key(1)}.manifest.key: '{key(2)}' is not the key of its entry"),
    }


def test_hostile_bundles_are_refused_with_one_line_and_nothing_is_written(
        tmp_path: Path, victim: Path) -> None:
    (tmp_path / "cache").mkdir(mode=0o700)
    for name, (metadata, members, fragment) in hostile_bundles(tmp_path, victim).items():
        bundle = write_bundle(tmp_path / "b.tar", metadata, members)
        before = snapshot(tmp_path)
        result = import_into(tmp_path, bundle)
        try:
            assert_refused(result, str(bundle), fragment)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
        assert snapshot(tmp_path) == before, name
        bundle.unlink()
    assert (victim / "abspwn-cache").read_text() == "precious\n"
    assert not list((tmp_path / "cache").iterdir())


def test_a_good_bundle_publishes_every_entry_with_its_atime_file_and_no_temp_file(
        tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b.tar", meta({key(n): item(entry_bytes(n))
                                                    for n in (1, 2, 3)}),
                          [good(1), good(2), good(3)])
    result = import_into(tmp_path, bundle)
    assert result.returncode == 0, result.stderr
    assert "imported 3 entries" in result.stdout
    cache = tmp_path / "cache"
    names = sorted(p.name for p in cache.iterdir() if not p.name.endswith("lockfile"))
    assert names == sorted([f"{key(n)}-cache" for n in (1, 2, 3)]
                           + [f"{key(n)}-atime" for n in (1, 2, 3)])
    assert (cache / f"{key(2)}-cache").read_bytes() == entry_bytes(2)


def test_the_same_bundle_twice_imports_nothing_new_and_says_so(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b.tar", meta({key(n): item(entry_bytes(n), record(n))
                                                    for n in (1, 2)}), [good(1), good(2)])
    first = import_into(tmp_path, bundle)
    assert first.returncode == 0, first.stderr
    assert "imported 2 entries (0 already there)" in first.stdout
    before = snapshot(tmp_path)
    again = import_into(tmp_path, bundle)
    assert again.returncode == 0, again.stderr
    assert "imported 0 entries (2 already there)" in again.stdout
    assert "Traceback" not in again.stderr
    assert snapshot(tmp_path) == before


def test_a_bundle_cannot_rewrite_the_record_of_an_entry_it_does_not_bring(
        tmp_path: Path) -> None:
    """The target holds entry 1 with its prewarm's record; a bundle brings entry 2 with a
    record that names entry 1's key (another checksum, size, run): refused, nothing written,
    and entry 1's record is the one its prewarm wrote."""
    mine = write_bundle(tmp_path / "mine.tar", meta({key(1): item(entry_bytes(1), record(1))}),
                        [good(1)])
    assert import_into(tmp_path, mine).returncode == 0
    store = LocalStore(tmp_path / "cache")
    recorded = store.manifest()[key(1)]
    forged = {**record(2, names=key(1), run="attacker"), "compile_s": 999.0}
    hostile = write_bundle(tmp_path / "b.tar", meta({key(2): item(entry_bytes(2), forged)}),
                           [good(2)])
    before = snapshot(tmp_path)
    assert_refused(import_into(tmp_path, hostile), str(hostile),
                   f"entries.{key(2)}.manifest.key: '{key(1)}' is not the key of its entry")
    assert snapshot(tmp_path) == before
    assert store.manifest() == {key(1): recorded}
    assert recorded.run == "exporter" and store.manifest_file.is_file()
