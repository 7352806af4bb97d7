"""`jaxwarm verify --trainer`, in the trainer's own process: will the run hit, asked of the
trainer's code instead of the step factory.

The real entrypoint runs with its real arguments (the training job's argv and environment,
every launch form), and `watch_trainer`, installed with the recorder when it imports jax,
hears the key of each compile its own lowering gives (`jaxwarm.jaxkey.lookup.watch_keys`).
The first lookup of each function this run's prewarm compiled is judged as verify judges
(`jaxwarm.job.warm.judge`); the process ends once the last one's key is known, before
that function compiles, or at the time limit (`init_budget_s`, from the trainer's start)
with one line. It never lets the trainer train: at the key of the first prewarmed step (a
function its prewarm recorded as a step), whose dispatch follows its compile, it ends too,
and what was not looked up by then is UNKNOWN (first called after the first step), unless
`--until-all-looked-up` lets the trainer run on (it then trains and writes its outputs).
Until then it compiles nothing it can avoid and writes nothing into the
cache dir: a WARM prewarmed function it needs on the way (an init) loads (where the cache
has no size cap, whose LRU stamps a load); anything else it needs on the way, a COLD init
included, compiles without the cache, its time part of the cost. Process 0 answers for the
run, as verify's does.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Collection
from pathlib import Path

from jaxwarm.core.config import Config
from jaxwarm.core.environment import VERIFY_INVOCATION
from jaxwarm.core.errors import EXIT_ERROR, ConfigError
from jaxwarm.core.files import atomic_write, make_dirs
from jaxwarm.core.jsonio import dumps
from jaxwarm.core.records import AFTER_FIRST_STEP, VERIFY, Verdict, VerifyResult, not_looked_up
from jaxwarm.core.rundir import verify_result_path
from jaxwarm.jaxkey.globalopts import snapshot as global_options
from jaxwarm.jaxkey.kvstore import KVStore, StoreError
from jaxwarm.jaxkey.lookup import watch_keys
from jaxwarm.jaxkey.predict import KeyPrediction
from jaxwarm.job.record.recorder import InitRecorder
from jaxwarm.job.start.jaximport import arm_verify_limit, on_verify_limit
from jaxwarm.job.start.pinned import config_from_env
from jaxwarm.job.warm import (
    Asker,
    LoweredTarget,
    WarmDecision,
    fingerprint_keys,
    judge,
    launch_fingerprint,
    say,
)
from jaxwarm.store.store import open_store

log = logging.getLogger(__name__)

# Where each other process says it heard its last prewarmed key (jax.distributed's store).
DONE = "jaxwarm/verify-trainer-done"


def write_result(path: Path, verdicts: list[Verdict], trainer_s: float | None = None) -> None:
    """Process 0's verdicts, the run's, marked with this verify's invocation id."""
    make_dirs(path.parent)
    atomic_write(path, dumps(VerifyResult(0, verdicts, trainer_s,
                                          os.environ.get(VERIFY_INVOCATION, "")),
                             indent=1) + "\n")


class TrainerWatch:
    """verify --trainer in the trainer's process: the prewarmed functions still to hear
    of, which of them are steps (the first one's key is the last thing heard before the
    first step runs, unless `until_all`), the answers so far, and the end (module
    docstring)."""

    def __init__(self, config: Config, recorder: InitRecorder, prewarmed: set[str],
                 steps: Collection[str] = (), until_all: bool = False) -> None:
        self.config, self.recorder = config, recorder
        self.pending = set(prewarmed)
        self.steps, self.until_all = steps, until_all
        self.verdicts: list[Verdict] = []
        self.lock = threading.Lock()
        # A hit may load only where JAX's LRU (a size cap) would not stamp its access time.
        self.may_load = config.cache.max_size == -1

    def elapsed(self) -> float:
        return time.time() - self.recorder.start_time

    def on_key(self, found: KeyPrediction) -> bool:
        import jax

        with self.lock:
            if found.module_name not in self.pending:
                return False  # not prewarmed, or heard already: compiled without the cache
            self.pending.discard(found.module_name)
        # The dir JAX looks it up in: jaxwarm's, or (cache.enforce off) one the trainer set.
        looked_in = jax.config.jax_compilation_cache_dir or self.config.cache.dir
        decision = judge(
            LoweredTarget(found.module_name, None, 0.0, found, global_options=global_options()),
            open_store(str(looked_in)),
            Asker(self.config.run.name, VERIFY, jax.process_count(),
                  self.config.cache.max_size, launch_fingerprint(self.config.run_dir, VERIFY)),
            signature=self.recorder.signature(found.module_name),
            inputs=self.recorder.inputs(found.module_name))
        if jax.process_index() == 0:
            say(decision)
        with self.lock:
            self.verdicts.append(self.verdict(decision))
            done = not self.pending
            stop = not done and not self.until_all and found.module_name in self.steps
            if stop:  # the step's dispatch follows its compile: nothing of it runs
                self.verdicts += not_looked_up(
                    list(self.pending), f"{AFTER_FIRST_STEP} ({found.module_name}), which "
                    f"verify --trainer stops before; --until-all-looked-up runs the trainer on "
                    f"to it (it trains and writes its outputs)", unknown=True)
        if done or stop:
            self.end(0)  # the launcher prints the answer and its cost
        return decision.warm and self.may_load

    def verdict(self, decision: WarmDecision) -> Verdict:
        prediction = decision.target.prediction
        assert prediction is not None
        return Verdict(function=prediction.module_name, key=prediction.key,
                       warm=decision.warm, lower_s=0.0, predict_s=0.0,
                       explanation=decision.why, components=prediction.components,
                       reached_s=self.elapsed())

    def let_the_others_end(self) -> None:
        """Process 0 runs jax.distributed's coordination service, and another process whose
        client loses it aborts (SIGABRT), even on its way out after its answer: so process 0
        waits until every other process has heard its own last key (within the time limit),
        then all leave through `jax.distributed.shutdown()`, whose barrier stops process 0's
        service only once every other process has let go of it."""
        import jax

        store = KVStore.of_job()
        if store is None or jax.process_count() == 1:
            return
        if jax.process_index() != 0:
            store.set(f"{DONE}/{jax.process_index()}", "done")
        else:
            for other in range(1, jax.process_count()):
                try:
                    store.get(f"{DONE}/{other}",
                              max(self.config.init_budget_s - self.elapsed(), 1.0))
                except StoreError:  # one ended at its time limit, or failed: it said so
                    return
        try:
            jax.distributed.shutdown()
        except Exception as exc:  # JaxRuntimeError: the service is gone; this ends anyway
            log.warning("verify --trainer: leaving jax.distributed: %s", exc)

    def on_time_limit(self) -> None:
        names = ", ".join(sorted(self.pending))
        line = (f"verify --trainer: stopped at the time limit (init_budget_s "
                f"{self.config.init_budget_s:g} s): the trainer had not looked up {names}; "
                f"their answer is unknown")
        with self.lock:
            self.verdicts += not_looked_up(list(self.pending), "the trainer had not looked it "
                                                               "up at the time limit",
                                           unknown=True)
        self.end(EXIT_ERROR, line)

    def at_exit(self) -> None:
        """The trainer ended (or failed) before it looked every prewarmed function up."""
        if not self.pending:
            return
        with self.lock:
            self.verdicts += not_looked_up(list(self.pending),
                                           "the trainer never looked it up: it ended first")
        self.write()

    def write(self) -> None:
        import jax

        if jax.process_index() == 0:
            write_result(verify_result_path(self.config.run_dir), self.verdicts,
                         self.elapsed())

    def end(self, code: int, line: str | None = None) -> None:
        """Write the answer and end the process now: nothing of the trainer runs on (no
        compile, no step, none of its exit handlers that could write a checkpoint)."""
        self.write()
        if code == 0:
            self.let_the_others_end()
        if line is not None:
            print(f"jaxwarm: {line}", file=sys.stderr, flush=True)
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)


def watch_trainer(recorder: InitRecorder, until_all: bool = False) -> None:
    """Start verify --trainer in this process (the trainer's, under its recorder): what
    this run's prewarm compiled (else another run's: `Manifest.compared_functions`) is read
    from the cache's manifest, with which of them are steps; none is one line.
    `until_all`: past the first step."""
    config = config_from_env()
    store = open_store(config.cache.dir)
    manifest = store.manifest(strict=False)
    same = fingerprint_keys(store, launch_fingerprint(config.run_dir, VERIFY))
    prewarmed = manifest.compared_functions(config.run.name, same)
    compared = manifest.compared(config.run.name, same)
    steps = {name for name in prewarmed if compared[name].is_step}
    if not prewarmed:
        raise ConfigError(f"{config.source}: verify --trainer: the cache {config.cache.dir} "
                          f"records no prewarm: it answers for the functions a prewarm "
                          f"compiled (run `jaxwarm prewarm` first)")
    watch = TrainerWatch(config, recorder, prewarmed, steps, until_all)
    watch_keys(watch.on_key)
    atexit.register(watch.at_exit)
    on_verify_limit(watch.on_time_limit)
    # Armed at the trainer's start already under a wrapper (`jaximport`); else from here.
    arm_verify_limit(recorder.start_time + config.init_budget_s, config.init_budget_s)

