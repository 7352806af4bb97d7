"""`python -m bench.profiled_compile`: the step's PGLE-optimized executable, profile by hand.

Started as a job (the run's environment, `pgle.enabled` on), it lowers the step bundle's
`train_step` as the prewarm and the trainer lower it and compiles it with an FDO profile
given by hand: JAX stores that compile under the key a GPU run's second, profile-guided
compile is stored under (jaxwarm/jaxkey/pgle.py). On CPU, where JAX's profiler collects an
empty trace and no run compiles twice, this stands in for that second compile, so a later
run's load of it can be checked (`bench.gpu_check --dry-run`, tests/test_pgle.py). Prints
the keys as JSON: `key` (the first compile's) and `pgle_key`. No init report.
"""

from __future__ import annotations

import json
import sys

# Not a real profile: XLA's CPU compiler does not read it, and it enters the compile (and
# the PGLE-optimized key) only as "some profile".
PROFILE = b"a profile, as PGLE's profiler gives one on a GPU"


def main() -> int:
    from jaxwarm.job.start.pinned import config_from_env
    from jaxwarm.job.warm import lower_targets
    from jaxwarm.step import build_step

    config = config_from_env()
    _, bundle = build_step(config)
    step, = [target for target in lower_targets(bundle.compile_targets(), config.source)
             if target.name == "train_step"]
    step.lowered.compile({"fdo_profile": PROFILE})
    assert step.prediction is not None  # strict lowering: a key or an error
    print(json.dumps({"key": step.prediction.key, "pgle_key": step.prediction.pgle_key}))
    return 0


if __name__ == "__main__":
    from jaxwarm.job.start.jobstart import job_main

    sys.exit(job_main(main))
