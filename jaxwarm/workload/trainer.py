"""`jaxwarm-train [CONFIG] [KEY.SUB=VALUE ...]`: the reference `jsp-train`-style trainer.

The shape every trainer wrapped by jaxwarm should have: join `jax.distributed`, call the
cache hook before the first compile, build mesh and step through the step factory (the same
code path as the prewarm job), feed arrays whose shardings equal the abstract inputs, and on
SIGTERM/SIGUSR1 checkpoint and exit so that a requeue resumes. Without CONFIG it reads the
pinned config the launcher names in JAXWARM_CONFIG.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path

import numpy as np

from jaxwarm.core.config import Config, load_config
from jaxwarm.core.errors import ConfigError
from jaxwarm.core.files import append_line
from jaxwarm.core.records import TRAIN
from jaxwarm.core.rundir import checkpoints_dir, metrics_path
from jaxwarm.job.start.jobstart import job_main, start_job
from jaxwarm.job.start.pinned import config_from_env, resolve_paths
from jaxwarm.workload import checkpoint
from jaxwarm.workload.data import make_global_batch

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Set by a signal handler; acted on between steps, where a checkpoint is consistent."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.install()

    def install(self) -> None:
        """(Re)install the handlers: jax.distributed.initialize() puts JAX's own preemption
        notifier on SIGTERM, so this runs again once the process has joined."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = signum

    def agreed(self) -> bool:
        """True on every process once any process got a signal, so all stop at one step."""
        import jax
        from jax.experimental import multihost_utils

        local = np.array([self.signum is not None], dtype=np.int32)
        if jax.process_count() == 1:
            return bool(local[0])
        return bool(multihost_utils.process_allgather(local).any())


def parse_args(argv: list[str] | None) -> Config:
    parser = argparse.ArgumentParser(prog="jaxwarm-train", description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", help="YAML config (default: $JAXWARM_CONFIG)")
    parser.add_argument("overrides", nargs="*", metavar="KEY.SUB=VALUE")
    args = parser.parse_args(argv)
    if args.config is None:
        return config_from_env()
    return resolve_paths(load_config(args.config, args.overrides))


def append_metrics(path: Path, record: dict) -> None:
    """One line of the run's metrics, appended only to a regular file (`append_line`: a link
    planted under the name is refused, never written through)."""
    append_line(path, json.dumps(record) + "\n", 0o644, "the trainer's metrics")


def train(config: Config, stop: StopRequest) -> int:
    import jax

    recorder, mesh, bundle = start_job(config, TRAIN)
    if bundle.train_step is None or bundle.init_state is None:
        raise ConfigError(
            f"{config.source}: step.factory: {config.step.factory} returned no train_step "
            f"and init_state; jaxwarm-train runs the short form StepBundle(train_step, state, "
            f"batch, init_state) (a bundle of `targets` only is for a trainer of your own)")
    stop.install()
    root = checkpoints_dir(config.run_dir)
    restored = checkpoint.restore(root, bundle.state, config)
    if restored is None:
        state, start = bundle.init_state(np.uint32(config.train.seed)), 0
    else:
        state, start = restored
        if start >= config.train.steps:  # a relaunch of a finished run: no step, no compile
            log.warning("nothing to train: the run's checkpoint is at step %d of its "
                        "train.steps %d (a new run.name starts over; more train.steps go on)",
                        start, config.train.steps)
    metrics_file = metrics_path(config.run_dir)
    is_writer = jax.process_index() == 0
    for step in range(start, config.train.steps):
        batch = make_global_batch(config, mesh, step)
        state, metrics = bundle.train_step(state, batch)
        done = step + 1
        if step == start:
            jax.block_until_ready(state)
            recorder.mark_first_step()
            log.info("first step done %.2f s after process start",
                     recorder.report.time_to_first_step_s)
        if is_writer and (done % config.train.log_every == 0 or done == config.train.steps):
            loss = float(metrics["loss"])
            append_metrics(metrics_file, {"step": done, "loss": loss,
                                          "restart": recorder.report.restart_count})
            log.info("step %d loss %.6f", done, loss)
        # Agreeing is a cross-process sync: do it on the log cadence, not on every step.
        if done % config.train.log_every == 0 and stop.agreed():
            checkpoint.save(root, state, done, config)
            log.warning("got %s: checkpointed at step %d, exiting so the job can be requeued",
                        signal.Signals(stop.signum).name if stop.signum else "a stop request",
                        done)
            return 0
        if config.train.checkpoint_every and done % config.train.checkpoint_every == 0:
            checkpoint.save(root, state, done, config)
        if config.train.step_pause_s:
            time.sleep(config.train.step_pause_s)
    if checkpoint.latest_step(root) != config.train.steps:
        checkpoint.save(root, state, config.train.steps, config)
    log.info("training done: %d steps", config.train.steps)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Bad input (a config error, a changed config under a checkpoint, a stuck lock) ends
    with one line and exit 2, through the same wrapper as the prewarm and verify jobs."""
    # First thing: a stop signal that arrives during start-up must not kill the process.
    stop = StopRequest()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # orbax logs through absl at INFO: some 50 lines a checkpoint, which would bury the
    # trainer's own (`checkpoint saved at step 8: ...`) and the init report after them.
    logging.getLogger("absl").setLevel(logging.WARNING)
    return job_main(lambda: train(parse_args(argv), stop))


if __name__ == "__main__":
    sys.exit(main())
