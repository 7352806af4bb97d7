"""The in-job books (jaxwarm/job/start/books.py): what a training job records in the cache's
usage log of the entries it missed, so the next prewarm checks them in full
(tests/test_integrity.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from jaxwarm.core.config import load_config
from jaxwarm.core.records import FunctionRecord, InitReport
from tests.conftest import DEMO
from tests.test_integrity import KEY, a_cache, recorded


@pytest.mark.hostile
def test_a_training_miss_on_a_present_entry_is_recorded(tmp_path: Path) -> None:
    from jaxwarm.job.start.books import note_missed_entries
    store = a_cache(tmp_path)
    cache = store.path
    recorded(store)
    old = time.time() - 60
    os.utime(store.entry_path(KEY), (old, old))
    config = load_config(DEMO, [f"cache.dir={cache}", f"run.out_dir={tmp_path}"])
    report = InitReport(job="train", restart_count=0, process_index=0, process_count=1,
                        cache_dir=str(cache), init_budget_s=1.0,
                        functions=[FunctionRecord(name="jit_train_step", key=KEY, hit=False),
                                   FunctionRecord(name="jit_init", key=KEY.replace(
                                       "train_step", "init"), hit=False)])
    note_missed_entries(config, store, store, report, since=time.time())
    assert store.warm_check(KEY).missed
    lines = store.usage_file.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["event"] == "missed"  # only the present one
