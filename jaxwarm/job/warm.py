"""One target's warm decision from its entry (`judge`), shared by every job that answers
WARM or COLD: the prewarm and verify jobs (`jaxwarm.job.judge`, which lowers the targets through
the step factory and broadcasts process 0's answer) and `verify --trainer`, which judges
the keys the trainer's own lowering gives (`jaxwarm.job.trainerverify`). It writes
nothing: a WARM decision costs a check of its entry, a COLD one reads the manifest to
explain the miss against the same target.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from jaxwarm.jaxkey.predict import KeyPrediction
from jaxwarm.store.cachestore import CacheStore
from jaxwarm.store.integrity import MISSED_NOTE, WarmCheck
from jaxwarm.store.misses import MissContext, changed_variables

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


def judge(target: LoweredTarget, store: CacheStore, *, run: str | None = None, max_size: int = -1,
          signature: str | None = None, process_count: int | None = None,
          job: str = "verify", recheck_missed: bool = False,
          inputs: InputSignature | None = None,
          fingerprint: Fingerprint | None = None) -> WarmDecision:
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
        prewarm = manifest.compared(run, fingerprint_keys(store, fingerprint)).get(
            prediction.module_name)
        missed = FunctionRecord(
            prediction.module_name, prediction.key, hit=False,
            components=prediction.components, signature=signature,
            global_options=target.global_options,
            input_changes=None if prewarm is None or prewarm.inputs is None or inputs is None
            else input_differences(prewarm.inputs, inputs))
        why = store.explain_miss(missed, manifest, MissContext(
            run=run, job=job, process_count=process_count, max_size=max_size,
            xla_flags=os.environ.get("XLA_FLAGS", ""), prewarm=prewarm,
            changed=None if prewarm is None else
            changed_variables(store.prewarms(), prewarm.key, fingerprint)))
    else:
        why = [f"its entry is in the cache but would not load: {check.problem}"]
    return WarmDecision(target, check.warm, why, check)


def say(decision: WarmDecision) -> None:
    """One decision in the job's log: WARM or COLD, the target and its key, then why."""
    log.info("%s  %s  %s", "WARM" if decision.warm else "COLD", decision.target.name,
             decision.target.key)
    for line in decision.why:
        log.info("      why: %s", line)
