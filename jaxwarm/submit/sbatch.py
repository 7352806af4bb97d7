"""Pure SLURM rendering: sbatch directives, the environment setup lines, the sbatch templates.

Both ways onto SLURM (submitit, and plain `sbatch` of a rendered template) take their
directives and environment lines from here, so a task sees the same environment either way.
The environment is exported by the job script itself, so every requeue re-exports it, and
every value passes through `shlex.quote`: nothing from a config can inject shell.
"""

from __future__ import annotations

import shlex
import string
from importlib import resources
from pathlib import Path

from jaxwarm.core.config import Config, SlurmConfig, TopologyConfig
from jaxwarm.core.environment import OWNED_NAMES, OWNED_PREFIXES
from jaxwarm.core.gputarget import job_topology
from jaxwarm.core.records import PREWARM, TRAIN

# Timeout/preemption warning that SLURM sends the job (submitit's choice too).
WARNING_SIGNAL = "USR2"

# Every task's srun: one task that fails (a rank killed, a rank that stopped the job with
# its one line) ends the whole step at once, instead of leaving the others waiting for it
# at a meeting or a collective until the time limit.
SRUN_OPTIONS = ("--kill-on-bad-exit=1",)


def _unset_owned() -> str:
    prefixes = "|".join(f"{p}.*" for p in OWNED_PREFIXES)
    owned = "|".join(OWNED_NAMES)
    return f"for _v in $(compgen -e | grep -E '^({prefixes}|{owned})$'); do unset \"$_v\"; done"


def _exports(env: dict[str, str]) -> list[str]:
    return [f"export {name}={shlex.quote(value)}" for name, value in env.items()]


def setup_lines(env: dict[str, str]) -> list[str]:
    """Shell lines that drop inherited jaxwarm-owned variables, then export the job's."""
    return [_unset_owned(), *_exports(env)]


def array_setup_lines(envs: list[dict[str, str]]) -> list[str]:
    """Setup lines for a job array whose task i runs with envs[i] (one config per task)."""
    lines = [_unset_owned(), 'case "$SLURM_ARRAY_TASK_ID" in']
    for index, env in enumerate(envs):
        lines += [f"  {index})", *(f"    {line}" for line in _exports(env)), "    ;;"]
    return lines + ["esac"]


def array_layout(config: Config) -> tuple[tuple[str, str | None], ...]:
    """What configs must share to be prewarmed as tasks of one job array."""
    options = directives(config, PREWARM)
    options.pop("job-name")
    return tuple(options.items())


def directives(config: Config, job: str) -> dict[str, str | None]:
    """sbatch options as name -> value (None for a bare flag), in a stable order."""
    slurm: SlurmConfig = config.slurm
    topo: TopologyConfig = job_topology(config, job)  # one node for a mocked prewarm
    options: dict[str, str | None] = {
        "job-name": f"jaxwarm-{config.run.name}-{job}",
        "nodes": str(topo.nodes),
        "ntasks-per-node": str(topo.processes_per_node),
        "cpus-per-task": str(slurm.cpus_per_task),
        "time": slurm.time,
    }
    for name in ("partition", "account", "qos", "constraint", "mem"):
        value = getattr(slurm, name)
        if value is not None:
            options[name] = value
    if slurm.gpus_per_node is not None:
        options["gpus-per-node"] = str(slurm.gpus_per_node)
    if job == TRAIN:
        options["signal"] = f"{WARNING_SIGNAL}@{slurm.signal_lead_s}"
        options["requeue"] = None
    for name, value in slurm.extra.items():
        options[name.replace("_", "-")] = value or None
    return options


def directive_lines(options: dict[str, str | None]) -> list[str]:
    return [f"#SBATCH --{name}" if value is None else f"#SBATCH --{name}={shlex.quote(value)}"
            for name, value in options.items()]


def render(config: Config, job: str, argv: list[str], env: dict[str, str],
           log_dir: Path) -> str:
    """The sbatch script of a job from `jaxwarm/slurm_templates/<job>.sbatch`, with the same log
    layout as submitit's (`<log_dir>/<job id>_<task>_log.out`)."""
    template = string.Template(
        resources.files("jaxwarm.slurm_templates").joinpath(f"{job}.sbatch").read_text())
    options = directives(config, job)
    if "signal" in options:
        # The template's batch shell traps the warning itself and forwards it.
        options["signal"] = f"B:{options['signal']}"
    options["output"] = f"{log_dir}/%j_0_log.out"
    options["open-mode"] = "append"
    srun = ["srun", "--unbuffered", *SRUN_OPTIONS, "--output", f"{log_dir}/%j_%t_log.out", *argv]
    return template.substitute(
        DIRECTIVES="\n".join(directive_lines(options)),
        SETUP="\n".join(setup_lines(env)),
        SRUN=shlex.join(srun),
        FORWARD_SIGNAL=config.slurm.signal,
        WARNING_SIGNAL=WARNING_SIGNAL,
        MAX_REQUEUES=str(config.slurm.max_requeues),
    )
