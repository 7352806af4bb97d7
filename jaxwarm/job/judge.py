"""One warm decision, for the prewarm job and the verify job: will each compile target hit?

Both jobs lower the run's targets the same way (`lower_targets`: the risky-input warnings,
`lower()` inside the target's context, JAX's own key for it) and decide the same way
(`decide`): process 0 checks each target's entry (`CacheStore.warm_check`), explains a COLD
one against the manifest (`CacheStore.explain_miss`: the same target only), and
broadcasts WARM or COLD to every process (`jaxwarm.jaxkey.agree`: through jax.distributed's
key-value store, since a collective would itself be compiled into the cache). Process 0
decides because its verdict is the run's: on GPU every rank shares its key, and ranks that
compile while others load can wait on each other forever; on CPU only process 0 can hit.

The decision writes nothing: `jaxwarm verify` leaves the cache dir as it found it. What the
checks call for (quarantining a torn entry, pinning an intact entry nobody recorded,
recording a full check and which run uses an entry) is the prewarm job's alone: it hands
`decide` its `repair`, which process 0 runs on the same checks before the broadcast.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from jaxwarm.core.config import Config
from jaxwarm.jaxkey.agree import broadcast_flags
from jaxwarm.jaxkey.globalopts import snapshot as global_options
from jaxwarm.jaxkey.predict import KeyNotComputed, KeyPrediction, predict_key
from jaxwarm.jaxkey.versions import UnsupportedJaxVersion
from jaxwarm.job.record.recorder import InitRecorder
from jaxwarm.job.start.gpu import mocked_topology
from jaxwarm.job.warm import LoweredTarget, WarmDecision, judge, launch_fingerprint, say
from jaxwarm.specs import warn_risky_inputs
from jaxwarm.step import CompileTarget, lower_target
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.store import open_store

log = logging.getLogger(__name__)



def predicted(name: str, lowered: Any, lower_s: float, *, strict: bool = True,
              compiler_options: dict[str, Any] | None = None,
              is_step: bool = True) -> LoweredTarget:
    """A lowered function with its predicted key. `strict` (verify, whose answer is the
    key) lets a failed prediction through; otherwise (the prewarm) it is said in one line
    and the target is compiled without the key cross-check."""
    start = time.perf_counter()
    try:
        prediction: KeyPrediction | None = predict_key(lowered, compiler_options)
    except (UnsupportedJaxVersion, KeyNotComputed) as exc:
        if strict:
            raise
        log.warning("%s; prewarming without the key cross-check", exc)
        prediction = None
    return LoweredTarget(name, lowered, lower_s, prediction, time.perf_counter() - start, is_step,
                  compiler_options, global_options())


def lower_targets(targets: list[CompileTarget], source: str, *,
                  strict: bool = True) -> list[LoweredTarget]:
    """Lower each target the way both jobs do, and predict its key (see `predicted`)."""
    lowered = []
    for target in targets:
        warn_risky_inputs(target.args, target.name, target.kwargs, target.uncommitted)
        start = time.perf_counter()
        item = lower_target(target, source)
        lowered.append(predicted(target.name, item, time.perf_counter() - start, strict=strict,
                                 compiler_options=target.compiler_options,
                                 is_step=target.is_step))
    return lowered


Repair = Callable[[CacheStore, list[WarmDecision]], None]

# How long the other processes wait for process 0's decision: its checks read entries in
# full where they must (big ones take minutes) and its repairs wait on the manifest's lock.
DECISION_TIMEOUT_S = 3600.0


def decide(targets: list[LoweredTarget], config: Config, recorder: InitRecorder,
           *, job: str, repair: Repair | None = None) -> list[WarmDecision]:
    """The run's decision for every target, the same on every process: process 0 judges
    (and, for the prewarm, `repair`s from its checks), then broadcasts. Each process logs
    the answer; process 0 says why, with the target's signature and inputs as the job's
    `recorder` saw them lowered."""
    import jax

    if jax.process_index() == 0:
        store = open_store(config.cache.dir)
        found = launch_fingerprint(config.run_dir, job)
        decisions = [judge(target, store, run=config.run.name,
                           max_size=config.cache.max_size,
                           signature=recorder.signature(target.prediction.module_name)
                           if target.prediction else None,
                           process_count=jax.process_count(), job=job,
                           recheck_missed=repair is not None,
                           inputs=recorder.lowered_inputs(target.prediction.module_name,
                                                          target.lowered)
                           if target.prediction else None, fingerprint=found)
                     for target in targets]
        if repair is not None:
            repair(store, decisions)
    else:
        decisions = [WarmDecision(target, False) for target in targets]
    # A mocked prewarm is one process: the others JAX counts are its mock, nobody to tell.
    warm = [d.warm for d in decisions] if mocked_topology() else broadcast_flags(
        [d.warm for d in decisions], what="warm-decision", timeout_s=DECISION_TIMEOUT_S)
    if jax.process_index() != 0:
        decisions = [WarmDecision(d.target, flag) for d, flag in zip(decisions, warm, strict=True)]
    for decision in decisions:
        say(decision)
    return decisions

