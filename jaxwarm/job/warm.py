"""The one warm decision: will each compile target hit? Every job that answers WARM or COLD
asks it here: the prewarm and verify jobs, which lower the run's targets through the step
factory (`lower_targets`) and decide for the run (`decide`), and `verify --trainer`, which
judges the keys the trainer's own lowering gives (`jaxwarm.job.trainerverify`); a target's
answer from its entry is `judge`.

Both jobs lower the run's targets the same way (`lower_targets`: the risky-input warnings,
`lower()` inside the target's context, JAX's own key for it) and decide the same way
(`decide`): process 0 checks each target's entry (`CacheStore.warm_check`), explains a COLD
one against the manifest (`CacheStore.explain_miss`), and broadcasts WARM or COLD to every
process (`jaxwarm.jaxkey.agree`: through jax.distributed's key-value store, since a
collective would itself be compiled into the cache). Process 0 decides because its verdict
is the run's: on GPU every rank shares its key, and ranks that compile while others load can
wait on each other forever; on CPU only process 0 can hit.

The decision writes nothing: `jaxwarm verify` leaves the cache dir as it found it. What the
checks call for (quarantining a torn entry, pinning an intact entry nobody recorded,
recording a full check and which run uses an entry) is the prewarm job's alone: it hands
`decide` its `repair`, which process 0 runs on the same checks before the broadcast.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxwarm.core.config import Config
from jaxwarm.core.inputdiff import input_differences
from jaxwarm.core.jsonio import read_record
from jaxwarm.core.records import (
    VERIFY,
    Fingerprint,
    FunctionRecord,
    InputSignature,
    PrewarmDecision,
    Verdict,
)
from jaxwarm.core.rundir import prewarm_decision_path, verify_fingerprint_path
from jaxwarm.jaxkey.agree import broadcast_flags
from jaxwarm.jaxkey.globalopts import snapshot as global_options
from jaxwarm.jaxkey.predict import KeyNotComputed, KeyPrediction, predict_key
from jaxwarm.jaxkey.versions import UnsupportedJaxVersion
from jaxwarm.job.record.recorder import InitRecorder
from jaxwarm.job.start.gpu import mocked_topology
from jaxwarm.specs import warn_risky_inputs
from jaxwarm.step import CompileTarget, lower_target
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.integrity import MISSED_NOTE, WarmCheck
from jaxwarm.store.misses import MissContext
from jaxwarm.store.store import open_store

log = logging.getLogger(__name__)

MISSED_BUT_INTACT = ("a job missed it, but it is intact in full (sha256 and decompression): "
                     "the miss had another cause")


@dataclass(frozen=True)
class LoweredTarget:
    """One compile target, lowered, with the key JAX will look it up under (None where the
    key could not be predicted: an untested jax, with the prewarm's consent)."""

    name: str
    lowered: Any
    lower_s: float
    prediction: KeyPrediction | None
    predict_s: float = 0.0
    is_step: bool = True
    compiler_options: dict[str, Any] | None = None
    # The process-global JAX settings it was lowered under (what the run must match).
    global_options: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str | None:
        return self.prediction.key if self.prediction else None


@dataclass(frozen=True)
class WarmDecision:
    """WARM or COLD for one target, and why (process 0's words; other processes get the
    answer only). `check` is process 0's look at the entry, for the prewarm's repairs."""

    target: LoweredTarget
    warm: bool
    why: list[str] = field(default_factory=list)
    check: WarmCheck | None = None

    def verdict(self) -> Verdict:
        """As verify reports it (a verify target always has a key: `strict`)."""
        prediction = self.target.prediction
        assert prediction is not None
        return Verdict(function=prediction.module_name, key=prediction.key, warm=self.warm,
                       lower_s=self.target.lower_s, predict_s=self.target.predict_s,
                       explanation=self.why, components=prediction.components)


def launch_fingerprint(run_dir: str | Path, job: str) -> Fingerprint | None:
    """This job's fingerprint as the login node computed it: a verify's own, else its
    launch's (the prewarm decision); None where it is not on record."""
    if job == VERIFY:
        return read_record(Fingerprint, verify_fingerprint_path(run_dir))
    decision = read_record(PrewarmDecision, prewarm_decision_path(run_dir))
    return decision.fingerprint if decision is not None else None


def fingerprint_keys(store: CacheStore, found: Fingerprint | None) -> frozenset[str]:
    """The keys the recorded prewarm of fingerprint `found` left: a miss is compared with
    that prewarm before other runs' (`Manifest.compared`); none where either is unknown."""
    record = store.prewarms().get(found.digest) if found is not None else None
    return frozenset(record.keys) if record is not None else frozenset()


@dataclass(frozen=True)
class Asker:
    """Who asks for a decision: a COLD answer is explained as that job's miss would be (its
    run's prewarm first, its processes, its cache's size cap, the launch's fingerprint;
    None: not known)."""

    run: str | None = None
    job: str = "verify"
    process_count: int | None = None
    max_size: int = -1
    fingerprint: Fingerprint | None = None


def judge(target: LoweredTarget, store: CacheStore, asker: Asker = Asker(), *,
          signature: str | None = None, recheck_missed: bool = False,
          inputs: InputSignature | None = None) -> WarmDecision:
    """One target's decision from its entry, with nothing written. Only a COLD one reads the
    whole manifest, to explain the miss against the same target and, with its `inputs`,
    says which differ from those of the prewarm of it a training job would compare with
    (`Manifest.compared`: the run's, else that of this job's `fingerprint`, else the
    newest; `signature` tells functions of one name apart), and which settings changed
    since that prewarm (its fingerprint against this one): a WARM decision costs a check
    of its entry."""
    if target.prediction is None:
        return WarmDecision(target, False, ["its key could not be predicted"])
    prediction = target.prediction
    check = store.warm_check(prediction.key, recheck_missed=recheck_missed)
    if check.warm:
        why = ([MISSED_BUT_INTACT] if check.read_in_full else [MISSED_NOTE]) \
            if check.missed else []
    elif check.problem == "missing":
        manifest = store.manifest(strict=False)
        prewarm = manifest.compared(asker.run, fingerprint_keys(store, asker.fingerprint)).get(
            prediction.module_name)
        missed = FunctionRecord(
            prediction.module_name, prediction.key, hit=False,
            components=prediction.components, signature=signature,
            global_options=target.global_options,
            input_changes=None if prewarm is None or prewarm.inputs is None or inputs is None
            else input_differences(prewarm.inputs, inputs))
        why = store.explain_miss(missed, manifest, MissContext(
            run=asker.run, job=asker.job, process_count=asker.process_count,
            max_size=asker.max_size, xla_flags=os.environ.get("XLA_FLAGS", ""),
            prewarm=prewarm, changed=None if prewarm is None else
            store.changed_variables(prewarm.key, asker.fingerprint)))
    else:
        why = [f"its entry is in the cache but would not load: {check.problem}"]
    return WarmDecision(target, check.warm, why, check)


def say(decision: WarmDecision) -> None:
    """One decision in the job's log: WARM or COLD, the target and its key, then why."""
    log.info("%s  %s  %s", "WARM" if decision.warm else "COLD", decision.target.name,
             decision.target.key)
    for line in decision.why:
        log.info("      why: %s", line)



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
        asker = Asker(config.run.name, job, jax.process_count(), config.cache.max_size,
                      launch_fingerprint(config.run_dir, job))
        decisions = [judge(target, store, asker,
                           signature=recorder.signature(target.prediction.module_name)
                           if target.prediction else None,
                           recheck_missed=repair is not None,
                           inputs=recorder.lowered_inputs(target.prediction.module_name,
                                                          target.lowered)
                           if target.prediction else None)
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

