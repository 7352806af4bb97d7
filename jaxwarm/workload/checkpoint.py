"""Checkpoints for the reference trainer, with orbax-checkpoint, as the trainers it stands
in for do.

A checkpoint is `checkpoints/<step>/` holding the sharded train state (each process writes
the shards it holds) and a small JSON `meta` item. orbax finalizes a step by an atomic
rename once every process has written its part, so an interrupted save is never found as
the latest step. The meta pins the parts of the config that must not change across a
resume; a resume under a changed config is refused, naming the keys that differ.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jaxwarm.core.config import Config
from jaxwarm.core.errors import UserError

log = logging.getLogger(__name__)

KEEP = 2


class ConfigChanged(UserError, RuntimeError):
    """The checkpoint was written under another config: resuming would be silently wrong."""


def pinned_config(config: Config) -> dict[str, Any]:
    """What a resume must share with the run that wrote the checkpoint (not steps, cadence,
    SLURM or budget: those may change between attempts)."""
    data = config.to_dict()
    return {"step": data["step"], "mesh": data["mesh"], "topology": data["topology"],
            "seed": data["train"]["seed"], "jax": data["jax"]}


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [diff for key in sorted(set(old) | set(new), key=str)
                for diff in config_differences(old.get(key), new.get(key),
                                               f"{prefix}.{key}" if prefix else str(key))]
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]


@contextmanager
def manager(root: Path) -> Iterator[Any]:
    """Synchronous saves: the trainer checkpoints on a stop signal and exits right after."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=KEEP, create=True,
                                           enable_async_checkpointing=False)
    with ocp.CheckpointManager(Path(root).absolute(), options=options) as checkpoints:
        yield checkpoints


def latest_step(root: Path) -> int | None:
    if not Path(root).is_dir():  # nothing saved yet: skip importing orbax
        return None
    with manager(root) as checkpoints:
        return checkpoints.latest_step()


def save(root: Path, state: Any, step: int, config: Config) -> Path:
    import orbax.checkpoint as ocp

    with manager(root) as checkpoints:
        checkpoints.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            meta=ocp.args.JsonSave({"step": step, "config": pinned_config(config)})))
        checkpoints.wait_until_finished()
        directory = Path(checkpoints.directory) / str(step)
    log.info("checkpoint saved at step %d: %s", step, directory)
    return directory


def restore(root: Path, abstract_state: Any, config: Config) -> tuple[Any, int] | None:
    """The latest checkpoint as arrays with the abstract state's shardings, or None."""
    if not Path(root).is_dir():
        return None
    import orbax.checkpoint as ocp

    with manager(root) as checkpoints:
        step = checkpoints.latest_step()
        if step is None:
            return None
        meta = checkpoints.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
        differences = config_differences(meta["config"], pinned_config(config))
        if differences:
            raise ConfigChanged(
                f"checkpoint {checkpoints.directory / str(step)} was written under a "
                f"different config (" + "; ".join(differences) + "); refusing to resume. "
                "Use a new run.name, or remove the checkpoints to start over")
        state = checkpoints.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state)))["state"]
    log.info("resumed from checkpoint at step %d: %s", step, Path(root) / str(step))
    return state, step
