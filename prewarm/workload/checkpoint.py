"""Sharded checkpoints for the reference trainer: each process saves the shards it holds.

A checkpoint is `checkpoints/step_<N>/` with one `p<process>.npz` per process and a
`meta.json` that process 0 writes last, after every process finished (a barrier): a
directory without meta.json is an interrupted save and is ignored. The meta pins the parts
of the config that must not change across a resume; a resume under a changed config is
refused, naming the keys that differ.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from launcher.config import Config

log = logging.getLogger("jaxwarm.checkpoint")

KEEP = 2


class ConfigChanged(RuntimeError):
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


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def latest_step(root: Path) -> int | None:
    steps = [int(d.name.split("_")[1]) for d in root.glob("step_*")
             if (d / "meta.json").exists()]
    return max(steps) if steps else None


def save(root: Path, state: Any, step: int, config: Config) -> Path:
    directory = _step_dir(root, step)
    directory.mkdir(parents=True, exist_ok=True)
    leaves = jax.tree_util.tree_leaves(state)
    shards = {f"{i}_{shard.device.id}": np.asarray(shard.data)
              for i, leaf in enumerate(leaves) for shard in leaf.addressable_shards}
    np.savez(directory / f"p{jax.process_index()}.npz", **shards)
    multihost_utils.sync_global_devices(f"checkpoint-{step}-written")
    if jax.process_index() == 0:
        meta = {"step": step, "config": pinned_config(config)}
        (directory / "meta.json.tmp").write_text(json.dumps(meta, indent=1))
        (directory / "meta.json.tmp").rename(directory / "meta.json")
        older = sorted(d for d in root.glob("step_*") if d != directory)
        for old in older[:max(0, len(older) - (KEEP - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    multihost_utils.sync_global_devices(f"checkpoint-{step}-committed")
    log.info("checkpoint saved at step %d: %s", step, directory)
    return directory


def restore(root: Path, abstract_state: Any, config: Config) -> tuple[Any, int] | None:
    """The latest checkpoint as arrays with the abstract state's shardings, or None."""
    step = latest_step(root)
    if step is None:
        return None
    directory = _step_dir(root, step)
    meta = json.loads((directory / "meta.json").read_text())
    differences = config_differences(meta["config"], pinned_config(config))
    if differences:
        raise ConfigChanged(
            f"checkpoint {directory} was written under a different config ("
            + "; ".join(differences) + "); refusing to resume. Use a new run.name, or "
            "remove the checkpoints to start over")
    data = np.load(directory / f"p{jax.process_index()}.npz")
    specs, treedef = jax.tree_util.tree_flatten(abstract_state)
    leaves = []
    for i, spec in enumerate(specs):
        devices = spec.sharding.addressable_devices_indices_map(spec.shape)
        arrays = [jax.device_put(data[f"{i}_{device.id}"], device) for device in devices]
        leaves.append(jax.make_array_from_single_device_arrays(spec.shape, spec.sharding, arrays))
    log.info("resumed from checkpoint at step %d: %s", step, directory)
    return jax.tree_util.tree_unflatten(treedef, leaves), step
