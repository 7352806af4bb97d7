"""Which cache dir a training job's JAX reads: its node's staged copy, or the shared dir.

With `cache.stage`, the first process of each node (`Place.local_rank` 0: SLURM_LOCALID
under SLURM, process 0 under the local runner, which is one node) copies the run's entries
from the shared cache dir into the stage dir (`jaxwarm.store.staging`) and writes what it
did to `<run dir>/stage/<attempt>-n<node>.json`; the node's other processes wait for that
note, at most `cache.stage_wait_s`, and read where it says. It runs as the process imports
jax (or calls `enable_cache`), before any compile and before `jax.distributed.initialize()`:
staging touches no device, so a trainer that joins the job later still can.

Whatever goes wrong on a node (a `$VARIABLE` the node does not set, a stage dir that cannot
be made or is unsafe, a full disk, a note that does not come in time) makes that node read
the shared dir, said in one line. The key is the same there: staging is refused where the
path string enters the key (`jaxwarm.jaxkey.versions.staging_problem`), so a fallback costs
shared reads, never a hit.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

from jaxwarm.core.config import Config, expand_variables
from jaxwarm.core.errors import ConfigError, one_line
from jaxwarm.core.files import atomic_write, make_dirs, read_bounded
from jaxwarm.core.jsonio import RECORD_CAP, dumps, from_json, parse_json
from jaxwarm.core.records import Staging
from jaxwarm.core.rundir import stage_note_path
from jaxwarm.core.words import plural
from jaxwarm.jaxkey.versions import refuse_key_change
from jaxwarm.job.start.place import Place
from jaxwarm.store.store import open_store

log = logging.getLogger(__name__)

POLL_S = 0.1


def node_cache_dir(config: Config, place: Place) -> Staging:
    """Stage (first process of the node) or wait for the node's staging (the others); the
    returned record's `dir` is where this process's JAX is to read. A configuration under
    which staging would change the key is refused (ConfigError), as the launcher does."""
    refuse_key_change(config.cache, config.source)
    note = stage_note_path(config.run_dir, place.attempt, place.node)
    if place.local_rank == 0:
        staging = stage_node(config, place.node)
        make_dirs(note.parent)
        atomic_write(note, dumps(staging, indent=1) + "\n", what="the node's staging note")
    else:
        staging = wait_for_note(config, note, place.node)
    if staging.fallback:
        log.warning("jaxwarm: node %d: %s; reading the shared cache dir %s instead", place.node,
                    staging.fallback, config.cache.dir)
    return staging


def stage_node(config: Config, node: int) -> Staging:
    """This node's copy of the run's entries; on any failure a record that reads the
    shared dir, saying why."""
    shared, wanted = config.cache.dir, str(config.cache.stage)
    stage, missing = expand_variables(wanted)
    if missing:
        return Staging(node, shared, stager=True,
                       fallback=f"cache.stage {wanted!r}: {', '.join('$' + n for n in missing)} "
                                f"{plural(len(missing), 'is', 'are')} unset or empty on "
                                f"this node")
    if "$" in stage or not os.path.isabs(stage):
        return Staging(node, shared, stager=True,
                       fallback=f"cache.stage {wanted!r} is {stage!r} on this node, not an "
                                f"absolute path")
    try:
        open_store(stage).prepare(config.cache, config.source, key="cache.stage")
        # A stage with a remote cache.dir is refused when the config loads: this one is local.
        staged = open_store(shared).stage_into(stage, config.run.name, config.cache.max_size)
    except (ConfigError, OSError) as exc:
        return Staging(node, shared, stager=True,
                       fallback=f"staging into {stage} failed: {one_line(exc)}")
    for key in staged.replaced:
        log.warning("jaxwarm: node %d: %s: the local copy in %s was partial or corrupt; "
                    "replaced it with a verified copy", node, key, stage)
    for key, why in staged.skipped.items():
        log.warning("jaxwarm: node %d: %s not staged: %s", node, key, why)
    count = len(staged.copied) + len(staged.replaced)
    log.info("jaxwarm: node %d: staged %d %s (%d bytes) from %s into %s in %.2f s; "
             "%d already there", node, count, plural(count, "entry", "entries"),
             staged.bytes_copied, shared, stage, staged.seconds, len(staged.reused))
    return Staging(node, stage, stager=True, copied=staged.copied, reused=staged.reused,
                   replaced=staged.replaced, skipped=staged.skipped,
                   bytes_copied=staged.bytes_copied, seconds=round(staged.seconds, 4))


def wait_for_note(config: Config, note: Path, node: int) -> Staging:
    """The node's staging as its first process wrote it, waited for at most
    `cache.stage_wait_s`; then (or for a note that cannot be read) the shared dir."""
    bound = config.cache.stage_wait_s
    start = time.monotonic()
    while True:
        waited = round(time.monotonic() - start, 3)
        try:
            staging = from_json(Staging, parse_json(
                read_bounded(note, RECORD_CAP, "a staging note"), str(note)), str(note))
        except FileNotFoundError:
            if waited >= bound:
                return Staging(node, config.cache.dir, stager=False, waited_s=waited,
                               fallback=f"the node's first process wrote no note of its "
                                        f"staging ({note}) within {bound:g} s "
                                        f"(cache.stage_wait_s)")
            time.sleep(POLL_S)
            continue
        except (OSError, ConfigError) as exc:
            return Staging(node, config.cache.dir, stager=False, waited_s=waited,
                           fallback=f"the node's staging note cannot be read: {one_line(exc)}")
        return dataclasses.replace(staging, stager=False, waited_s=waited)
