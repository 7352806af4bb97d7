"""`python -m jaxwarm.prewarm.verify`: will the run hit the cache? Answered without compiling.

Each process of the run's layout builds the step through the same factory and lowers it;
the answer is the warm decision the prewarm job makes too (`jaxwarm.prewarm.judge`): JAX's own key
for each target (`jaxwarm.launcher.jaxkey.predict`), WARM when the cache dir holds an intact entry
under it, a COLD one explained by the key components that differ from a prewarm of the same
target. Process 0 decides for the run and writes it (`verify/p0.json`). Verify writes
nothing into the cache dir: what a check finds (a torn entry, an entry nobody recorded) is
said here and repaired by the next prewarm.

`jaxwarm verify --trainer` asks the trainer itself: `jaxwarm.launcher.injob.trainerverify`.
"""

from __future__ import annotations

import logging
import sys

from jaxwarm.launcher.environment import config_from_env
from jaxwarm.launcher.injob.trainerverify import write_result
from jaxwarm.launcher.rundir import VERIFY, verify_result_path
from jaxwarm.prewarm.jobstart import job_main, start_job
from jaxwarm.prewarm.judge import decide, lower_targets

log = logging.getLogger("jaxwarm.verify")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import jax

    config = config_from_env()
    recorder, _, bundle = start_job(config, VERIFY)  # its init report is written at exit
    targets = lower_targets(bundle.compile_targets(), config.source)
    decisions = decide(targets, config, recorder, job=VERIFY)
    if jax.process_index() == 0:
        write_result(verify_result_path(config.run_dir), [d.verdict() for d in decisions])
    return 0


if __name__ == "__main__":
    sys.exit(job_main(main))
