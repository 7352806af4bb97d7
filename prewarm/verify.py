"""`python -m prewarm.verify`: will the run hit the cache? Answered without compiling.

Each process of the run's layout builds the step through the same factory, lowers it, and
asks JAX for the persistent-cache key (`launcher.jaxkey.predict`); a function is WARM when
the cache dir holds an intact entry under that key (`integrity.warm_problem`: a torn one is
COLD). A COLD function that the manifest knows under another key is explained by the key
components that differ. Process 0's verdict is the run's: on
GPU every rank shares its key, and on CPU only process 0 can ever hit.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.config import Config
from launcher.environment import is_remote
from launcher.files import atomic_write
from launcher.injob.hook import config_from_env
from launcher.injob.recorder import InitRecorder
from launcher.jaxkey.globalopts import snapshot as global_options
from launcher.jaxkey.predict import predict_key
from launcher.records import Verdict, VerifyResult, dumps
from launcher.rundir import VERIFY, verify_result_path
from launcher.store.integrity import MISSED_NOTE, missed_since_check, warm_problem
from launcher.store.manifest import read_manifest
from launcher.store.misses import explain_miss
from prewarm.bootstrap import job_main, start_job
from prewarm.specs import warn_risky_inputs
from prewarm.step import CompileTarget, lower_target

log = logging.getLogger("jaxwarm.verify")


def judge(lowered: Any, cache_dir: str, lower_s: float, *, run: str | None = None,
          max_size: int = -1,
          signature: Callable[[str], str | None] = lambda _: None,
          compiler_options: dict[str, Any] | None = None) -> Verdict:
    """One function's verdict. Only a COLD one reads the whole manifest, to explain the miss
    against the same target (`run` first, then the same layout; `signature` tells functions
    of one name apart): a WARM verdict costs the key prediction and a check of its entry."""
    import jax

    start = time.perf_counter()
    prediction = predict_key(lowered, compiler_options)
    predict_s = time.perf_counter() - start
    problem = warm_problem(cache_dir, prediction.key)
    warm = problem is None
    if warm:
        explanation = [MISSED_NOTE] if not is_remote(cache_dir) and \
            missed_since_check(cache_dir, prediction.key) else []
    elif problem == "missing":
        explanation = explain_miss(
            prediction.module_name, prediction.components,
            read_manifest(cache_dir, strict=False), run=run,
            process_count=jax.process_count(), signature=signature(prediction.module_name),
            global_options=global_options(), job="verify", max_size=max_size,
            xla_flags=os.environ.get("XLA_FLAGS", ""))
    else:
        explanation = [f"its entry is in the cache but would not load: {problem}"]
    return Verdict(function=prediction.module_name, key=prediction.key, warm=warm,
                   lower_s=lower_s, predict_s=predict_s, explanation=explanation,
                   components=prediction.components)


def verify_targets(targets: list[CompileTarget], config: Config,
                   recorder: InitRecorder) -> list[Verdict]:
    verdicts = []
    for target in targets:
        warn_risky_inputs(target.args, target.name, target.kwargs, target.uncommitted)
        start = time.perf_counter()
        lowered = lower_target(target, config.source)
        verdicts.append(judge(lowered, config.cache.dir, time.perf_counter() - start,
                              run=config.run.name, max_size=config.cache.max_size,
                              signature=recorder.signature,
                              compiler_options=target.compiler_options))
    return verdicts


def write_result(path: Path, verdicts: list[Verdict], process: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dumps(VerifyResult(process, verdicts), indent=1) + "\n")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import jax

    config = config_from_env()
    recorder, _, bundle = start_job(config, VERIFY)  # its init report is written at exit
    verdicts = verify_targets(bundle.compile_targets(), config, recorder)
    write_result(verify_result_path(config.run_dir, jax.process_index()), verdicts,
                 jax.process_index())
    return 0


if __name__ == "__main__":
    sys.exit(job_main(main))
