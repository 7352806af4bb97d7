"""`jaxwarm cache export` and `cache import` (jaxwarm/store/bundle.py). A bundle cannot write
outside the cache, and an import is all or nothing: crafted bundles (path keys, link members,
bad checksums, malformed metadata) through the real CLI. What a bundle claims never sets
what jaxwarm spends (class 1 of issue 17): sparse and compressed bundles, oversized imports
and zlib bombs are refused with one line, within a bound, and write nothing. A bundle whose
entries would all miss where it goes is refused, and a real bundle round trip hits."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.jaxkey.versions import JaxVersions, required
from jaxwarm.store.bundle import BUNDLE_META, BundleMeta
from jaxwarm.store.entries import CACHE_SUFFIX
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import LocalStore
from tests.conftest import DEMO, Cli, run_cli
from tests.hostile import assert_refused, entry_bytes, key, snapshot, zlib_bomb
from tests.test_store_commands import (
    TINY,
    assert_ok,
    config_args,
    init_report,
    job_args,
    step_record,
)


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


# import_into(TMP_PATH, BUNDLE): `jaxwarm cache import BUNDLE` into TMP_PATH/cache.
Importer = Callable[[Path, Path], subprocess.CompletedProcess[str]]


@pytest.fixture
def import_into(cli: Cli) -> Importer:
    """The import in this process (conftest's `cli`): it starts no job and imports no JAX."""
    def call(tmp_path: Path, bundle: Path) -> subprocess.CompletedProcess[str]:
        return cli("cache", "import", str(bundle), str(DEMO), f"run.out_dir={tmp_path / 'runs'}",
                   f"cache.dir={tmp_path / 'cache'}", "cache.xla_caches=none")
    return call


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


@pytest.mark.e2e
@pytest.mark.hostile
def test_hostile_bundles_are_refused_with_one_line_and_nothing_is_written(
        tmp_path: Path, victim: Path, import_into: Importer) -> None:
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


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_good_bundle_publishes_every_entry_with_its_atime_file_and_no_temp_file(
        tmp_path: Path, import_into: Importer) -> None:
    bundle = write_bundle(tmp_path / "b.tar", meta({key(n): item(entry_bytes(n))
                                                    for n in (1, 2, 3)}),
                          [good(1), good(2), good(3)])
    result = import_into(tmp_path, bundle)
    assert result.returncode == 0, result.stderr
    assert "imported 3 entries" in result.stdout
    cache = LocalStore(tmp_path / "cache")
    names = sorted(p.name for p in cache.path.iterdir() if not p.name.endswith("lockfile"))
    assert names == sorted([cache.entry_path(key(n)).name for n in (1, 2, 3)]
                           + [cache.atime_path(key(n)).name for n in (1, 2, 3)])
    assert cache.entry_path(key(2)).read_bytes() == entry_bytes(2)


@pytest.mark.e2e
@pytest.mark.hostile
def test_the_same_bundle_twice_imports_nothing_new_and_says_so(
        tmp_path: Path, import_into: Importer) -> None:
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


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_bundle_cannot_rewrite_the_record_of_an_entry_it_does_not_bring(
        tmp_path: Path, import_into: Importer) -> None:
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


def assert_refused_into_an_empty_cache(tmp_path: Path, import_into: Importer, bundle: Path,
                                       *fragments: str) -> None:
    """`cache import` of `bundle` into an empty cache dir is refused in one line naming the
    bundle (and `fragments`), and nothing under `tmp_path` changes."""
    (tmp_path / "cache").mkdir(mode=0o700)
    before = snapshot(tmp_path)
    assert_refused(import_into(tmp_path, bundle), str(bundle), *fragments)
    assert snapshot(tmp_path) == before


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_sparse_member_claiming_2_gib_is_refused_before_anything_is_written(
        tmp_path: Path, import_into: Importer) -> None:
    holes = tmp_path.parent / f"{tmp_path.name}-sparse"
    holes.mkdir()
    member = holes / "entries" / f"{key(1)}-cache"
    member.parent.mkdir()
    with member.open("wb") as out:
        out.truncate(2 << 30)  # 2 GiB of holes, no data
    header = holes / BUNDLE_META
    write_bundle(holes / "meta.tar", meta({key(1): {"sha256": "0" * 64, "size": 2 << 30,
                                                    "manifest": None}}), [])
    subprocess.run(["tar", "-xf", "meta.tar"], cwd=holes, check=True)
    bundle = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "--format=gnu", "-cf", str(bundle), header.name,
                    f"entries/{member.name}"], cwd=holes, check=True)
    member.unlink()
    assert bundle.stat().st_size < 1 << 20
    assert_refused_into_an_empty_cache(tmp_path, import_into, bundle, "sparse member")


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_member_claiming_more_than_the_file_holds_is_refused(
        tmp_path: Path, import_into: Importer) -> None:
    bundle = write_bundle(tmp_path / "b.tar", meta({key(1): item(entry_bytes(1))}), [good(1)])
    with tarfile.open(bundle) as tar:
        cut = tar.getmember(f"entries/{key(1)}-cache").offset_data + 4
    with bundle.open("r+b") as data:
        data.truncate(cut)  # the header claims bytes the file does not hold
    assert_refused_into_an_empty_cache(tmp_path, import_into, bundle)


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_compressed_bundle_is_refused_unread(tmp_path: Path, import_into: Importer) -> None:
    """A 60 KB gzip that would expand to 64 MiB of tar: refused by its first bytes."""
    bundle = tmp_path / "bomb.tar.gz"
    with gzip.open(bundle, "wb") as out:
        out.write(bytes(64 << 20))
    assert_refused_into_an_empty_cache(tmp_path, import_into, bundle, "gzip-compressed")


@pytest.mark.e2e
@pytest.mark.hostile
def test_an_import_beyond_the_limit_needs_max_bytes(tmp_path: Path, cli: Cli) -> None:
    entries = {key(n): item(entry_bytes(n)) for n in (1, 2)}
    bundle = write_bundle(tmp_path / "b.tar", meta(entries), [good(1), good(2)])
    total = sum(e["size"] for e in entries.values())
    (tmp_path / "cache").mkdir(mode=0o700)
    before = snapshot(tmp_path)
    args = ("cache", "import", str(bundle), str(DEMO), f"run.out_dir={tmp_path / 'runs'}",
            f"cache.dir={tmp_path / 'cache'}", "cache.xla_caches=none")
    assert_refused(cli(*args, "--max-bytes", str(total - 1)), str(bundle),
                   f"{total} bytes", "--max-bytes")
    assert snapshot(tmp_path) == before
    result = cli(*args, "--max-bytes", str(total))
    assert result.returncode == 0, result.stderr
    assert "imported 2 entries" in result.stdout


@pytest.mark.e2e
@pytest.mark.hostile
def test_a_zlib_bomb_in_a_bundle_is_refused(tmp_path: Path, import_into: Importer) -> None:
    bomb = key(7)
    bundle = write_bundle(tmp_path / "b.tar", meta({key(1): item(entry_bytes(1)),
                                                    bomb: item(zlib_bomb())}),
                          [good(1), (f"entries/{bomb}-cache", zlib_bomb())])
    assert_refused_into_an_empty_cache(tmp_path, import_into, bundle, bomb,
                                       "decompression bomb")


def bundle_meta(**changes: object) -> BundleMeta:
    base = BundleMeta(version=1, jax_version="0.10.2", jaxlib_version="0.10.2",
                      platform="cpu", cache_dir="/a/cache", xla_caches="none", created=0.0,
                      entries={})
    return dataclasses.replace(base, **changes)


def test_bundle_refusals_name_what_would_make_every_entry_miss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # jax < 0.11, where the cache path is in the key (tests/test_jax_guard.py: 0.11 on).
    monkeypatch.setattr("jaxwarm.store.bundle.required", lambda: JaxVersions("0.10.2", "0.10.2"))
    config = load_config(DEMO, ["cache.dir=/b/cache", "cache.xla_caches=none"])
    assert bundle_meta().refusal(config) is None
    assert "jax 0.0.1" in bundle_meta(jax_version="0.0.1").refusal(config)
    assert "platform gpu" in bundle_meta(platform="gpu").refusal(config)
    bound = bundle_meta(xla_caches="xla_gpu_per_fusion_autotune_cache_dir")
    assert "include the cache path /a/cache" in bound.refusal(config)
    assert bound.refusal(dataclasses.replace(
        config, cache=dataclasses.replace(config.cache, dir="/a/cache"))) is None
    with_autotune = load_config(DEMO, ["cache.dir=/b/cache"])
    assert "puts the cache path in every key" in bundle_meta().refusal(with_autotune)


@pytest.mark.e2e
def test_bundle_round_trip_into_an_empty_cache_then_hit(tmp_path: Path, cli: Cli) -> None:
    portable = ("cache.xla_caches=none",)
    source, target = tmp_path / "source-cache", tmp_path / "target-cache"
    assert_ok(run_cli("prewarm", *job_args(tmp_path, source, *TINY, *portable)))
    bundle = tmp_path / "demo-bundle.tar"
    exported = cli("cache", "export", *config_args(tmp_path, source, *TINY, *portable),
                   "-o", str(bundle))
    assert_ok(exported)
    assert "exported 2 entries" in exported.stdout and "portable" in exported.stdout
    elsewhere = config_args(tmp_path, target, *TINY, *portable, run="elsewhere")
    imported = cli("cache", "import", str(bundle), *elsewhere)
    assert_ok(imported)
    assert "imported 2 entries" in imported.stdout
    run = run_cli("launch", *elsewhere, "--local", "--no-prewarm")
    assert_ok(run)
    assert step_record(init_report(tmp_path, "elsewhere"))["hit"]
    # The imported entries keep their checksums: `cache verify` checks them.
    checked = cli("cache", "verify", str(target))
    assert_ok(checked)
    assert "against a recorded checksum" in checked.stdout

    # A bundle whose keys hold its cache path cannot hit anywhere else: refused.
    pinned_to_path = tmp_path / "path-bound.tar"
    assert_ok(run_cli("prewarm", *job_args(tmp_path, source, *TINY, run="bound")))
    assert_ok(cli("cache", "export", *config_args(tmp_path, source, *TINY, run="bound"),
                  "-o", str(pinned_to_path)))
    third = config_args(tmp_path, tmp_path / "third", *TINY)
    refused = cli("cache", "import", str(pinned_to_path), *third)
    assert refused.returncode == 2 and "include the cache path" in refused.stderr

    # Another jax version: refused, and nothing is added.
    other_version = tmp_path / "other-jax.tar"
    with tarfile.open(bundle) as tar, tarfile.open(other_version, "w") as out:
        for member in tar.getmembers():
            data = tar.extractfile(member).read()
            if member.name == BUNDLE_META:
                meta = json.loads(data)
                meta["jax_version"] = "0.0.1"
                data = json.dumps(meta).encode()
                member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    empty = tmp_path / "empty-cache"
    refused = cli("cache", "import", str(other_version),
                  *config_args(tmp_path, empty, *TINY, *portable))
    assert refused.returncode == 2 and "jax 0.0.1" in refused.stderr
    assert not list(empty.glob(f"*{CACHE_SUFFIX}"))
