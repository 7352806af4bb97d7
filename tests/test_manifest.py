"""The cache's manifest (jaxwarm/store/manifest.py): the record of every entry a prewarm
wrote, and of every run that uses it, old manifests included. A broken manifest is one
line naming it from every cache command and changes nothing; a prewarm that records sets it
aside with a note. Real files, the CLI in this process; no JAX."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxwarm.store.manifest import (
    ManifestEntry,
)
from jaxwarm.store.store import LocalStore
from tests.conftest import Cli
from tests.hostile import assert_refused, snapshot
from tests.test_integrity import KEY, a_cache, recorded


@pytest.mark.hostile
def test_the_manifest_records_every_run_that_uses_a_key(tmp_path: Path) -> None:
    store = a_cache(tmp_path)
    first = recorded(store, run="a")
    store.uses_entries([first], "b")
    manifest = store.manifest()
    assert [e.key for e in manifest.for_run("b")] == [KEY]
    assert manifest[KEY].run == "a" and manifest[KEY].runs == ["b"]
    store.record_entries([first])  # a rewrite by run a (after a quarantine) keeps b
    assert store.manifest()[KEY].runs == ["b"]


@pytest.mark.hostile
def test_a_manifest_without_runs_still_reads(tmp_path: Path) -> None:
    store = a_cache(tmp_path)
    recorded(store, run="a")
    data = json.loads(store.manifest_file.read_text())
    del data["entries"][KEY]["runs"]  # as an older jaxwarm wrote it
    store.manifest_file.write_text(json.dumps(data))
    manifest = store.manifest()
    assert manifest[KEY].runs == [] and manifest.for_run("a")[0].key == KEY


@pytest.mark.hostile
@pytest.mark.parametrize("manifest", ["{not json", "[]", '{"version": 1, "entries": []}',
                                      '{"version": 9, "entries": {}}',
                                      '{"version": 1, "entries": {"jit_f-' + "0" * 64 +
                                      '": {"function": "jit_f", "surprise": 1}}}'])
def test_a_broken_manifest_is_one_line_naming_it_and_changes_nothing(
        tmp_path: Path, manifest: str, cli: Cli) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    path = LocalStore(cache).manifest_file
    path.write_text(manifest)
    before = snapshot(tmp_path)
    for argv in (["ls"], ["stats"], ["verify"], ["prune", "--max-size", "0"]):
        assert_refused(cli("cache", argv[0], str(cache), *argv[1:]), str(path))
    assert snapshot(tmp_path) == before


@pytest.mark.hostile
def test_a_broken_manifest_is_set_aside_with_a_note_when_a_prewarm_records(
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    store = LocalStore(cache)
    store.manifest_file.write_text("[]")
    key = "jit_f-" + "a" * 64
    store.record_entries([ManifestEntry(function="jit_f", key=key, run="r", config="c",
                                        compile_s=1.0, lower_s=0.1, written=True,
                                        jax_version="0", process_count=1)])
    assert list(store.manifest()) == [key]
    aside, = cache.glob(f"{store.manifest_file.name}.broken-*[0-9]")
    assert aside.read_text() == "[]"
    note = aside.with_name(aside.name + ".why").read_text()
    assert "not a jaxwarm manifest" in note
