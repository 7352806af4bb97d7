"""`python -m jaxwarm.job.verify`: will the run hit the cache? Answered without compiling.

Each process of the run's layout builds the step through the same factory and lowers it;
the answer is the warm decision the prewarm job makes too (`jaxwarm.job.warm`): JAX's own key
for each target (`jaxwarm.jaxkey.predict`), WARM when the cache dir holds an intact entry
under it, a COLD one explained by the key components that differ from a prewarm of the same
target. Process 0 decides for the run and writes it (`verify/p0.json`). Verify writes
nothing into the cache dir: what a check finds (a torn entry, an entry nobody recorded) is
said here and repaired by the next prewarm.

`jaxwarm verify --trainer` asks the trainer itself: `jaxwarm.job.trainerverify`.
"""

from __future__ import annotations

import logging
import sys

from jaxwarm.core.records import VERIFY
from jaxwarm.core.rundir import verify_result_path
from jaxwarm.job.start.jobstart import job_main, start_job
from jaxwarm.job.start.pinned import config_from_env
from jaxwarm.job.trainerverify import write_result
from jaxwarm.job.warm import decide, lower_targets

log = logging.getLogger(__name__)


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
