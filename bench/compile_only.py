"""`python -m bench.compile_only`: the training job's cache lookups, without a step.

Started as a job (the run's environment, every process of its layout), it starts like the
trainer (`jaxwarm.job.start.jobstart.start_job`, job `train`) and `lower().compile()`s each target
of the step bundle: every process looks its key up in the cache and writes its init report
(`reports/train-r0-p<process>.json`: hit or miss, key, components), and nothing executes.
`bench.gpu_check` runs it where a real step cannot run: two processes sharing one GPU,
which NCCL refuses as two ranks of one communicator.
"""

from __future__ import annotations

import sys


def main() -> int:
    from jaxwarm.core.records import TRAIN
    from jaxwarm.job.start.jobstart import start_job
    from jaxwarm.job.start.pinned import config_from_env
    from jaxwarm.step import lower_target

    config = config_from_env()
    _, _, bundle = start_job(config, TRAIN)  # its init report is written at exit
    for target in bundle.compile_targets():
        lower_target(target, config.source).compile(target.compiler_options)
    return 0


if __name__ == "__main__":
    from jaxwarm.job.start.jobstart import job_main

    sys.exit(job_main(main))
