"""Joining the job's processes with `jax.distributed`, the same way under every runner.

Where the process stands (coordinator, count, index) is read in `jaxwarm.job.start.place`:
the local runner names the coordinator; under SLURM, JAX detects everything from SLURM's
own environment. A single-process job needs no coordinator.

The join is bounded (`ranks.join_timeout_s`, 300 s by default, JAX's own), jaxwarm's own
join and a trainer's own `jax.distributed.initialize()` alike (`bounded_join`). A bound of
its own, not the ranks' meeting bound: the ranks come to the join as they start (a node's
start, the imports, staging), to a meeting as they compile. Left to JAX, a rank that never
comes (not started, stopped, on a node that hangs) keeps the others in `Connecting to JAX
distributed service` until JAX's own `initialization_timeout`, and then JAX ends every
process with a C++ abort and its stack trace, naming no rank. So each rank leaves a note
that it reached the join (`<run dir>/join/<attempt>-p<rank>`, removed once joined) and
arms a timer: at the bound it names the ranks without a note in one line and ends at once,
before JAX's own deadline, which is set later (`JOIN_MARGIN_S`). Process 0, which runs the
coordination service, gives up last (`SERVICE_LAST_S`): a client whose service vanishes
aborts.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from jaxwarm.core.config import LOCAL_DEVICE_IDS, Config, TopologyConfig
from jaxwarm.core.errors import EXIT_FAILED, say
from jaxwarm.core.files import atomic_write, make_dirs
from jaxwarm.core.rundir import join_note_path
from jaxwarm.core.words import plural, ranges
from jaxwarm.job.record.phases import bound_joins, wrap_distributed_initialize
from jaxwarm.job.start.place import Place

log = logging.getLogger(__name__)

# JAX's own join deadline comes this long after jaxwarm's bound: jaxwarm's line comes first.
JOIN_MARGIN_S = 30
# How much longer process 0 waits than the others before it gives up.
SERVICE_LAST_S = 5.0


def local_device_ids(topology: TopologyConfig, place: Place) -> list[int] | None:
    """The GPUs of this process, counted within what CUDA_VISIBLE_DEVICES shows it. Left
    alone, JAX gives a detected cluster's process one GPU, its local rank (SLURM_LOCALID, or
    the local runner's Open MPI variables): wrong for 2 or more per process, and wrong where
    SLURM binds each task its own GPUs (local rank 3 of a task that sees one GPU). So:
    `JAX_LOCAL_DEVICE_IDS` from the config's `env` when given (e.g. "0": processes sharing
    one GPU, as `bench.gpu_check` runs them; the config checks its form; JAX >= 0.10 reads
    it too, jaxwarm passes it on every jax); all it sees when it sees exactly its
    `devices_per_process` (bound by SLURM); else the `devices_per_process` after those of
    the node's earlier processes. None on CPU."""
    given = os.environ.get(LOCAL_DEVICE_IDS)
    if given:
        return [int(part) for part in given.split(",")]
    if topology.platform != "gpu":
        return None
    count = topology.devices_per_process
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and len(visible.split(",")) == count:
        return list(range(count))
    first = place.local_rank * count
    return list(range(first, first + count))


@contextmanager
def bounded_join(config: Config) -> Iterator[int]:
    """Around one `jax.distributed` join of this process: the note that it is there, and the
    timer that ends it at the bound with one line (module docstring). Yields JAX's
    `initialization_timeout`, later than the bound."""
    place = Place.here()
    bound = config.ranks.join_timeout_s
    note = join_note_path(config.run_dir, place.attempt, place.process_id)
    try:
        make_dirs(note.parent)
        atomic_write(note, "", what="the note that this rank reached its jax.distributed join")
    except OSError as exc:  # the join is bounded all the same; the line names no rank
        log.warning("jaxwarm: %s: %s", note, exc.strerror)
    timer = threading.Timer(bound + (SERVICE_LAST_S if place.process_id == 0 else 0.0),
                            _not_joined, args=(config, place, bound))
    timer.daemon = True
    timer.start()
    try:
        yield math.ceil(bound + SERVICE_LAST_S) + JOIN_MARGIN_S
    finally:
        timer.cancel()
    try:
        note.unlink()
    except OSError:
        pass


def _not_joined(config: Config, place: Place, bound: float) -> None:
    """The join timed out: the one line, naming the ranks that never reached it; then end
    this process at once (its main thread is inside JAX's join)."""
    reached = {rank for rank in range(place.num_processes)
               if join_note_path(config.run_dir, place.attempt, rank).exists()}
    missing = sorted(set(range(place.num_processes)) - reached - {place.process_id})
    why = (f"{plural(len(missing), 'rank')} {ranges(missing)} never reached it (not started, "
           f"stopped, or still starting)") if missing else \
        "every rank reached it, but the join did not complete (process 0's coordination " \
        "service unreachable?)"
    say(f"jax.distributed: the ranks did not join within {bound:g} s (ranks.join_timeout_s): "
        f"{why}")
    logging.shutdown()
    os._exit(EXIT_FAILED)


def bound_trainer_joins(config: Config) -> None:
    """Every `jax.distributed.initialize()` of this process from now on, the trainer's own
    included, is timed (an init phase of its own) and bounded (`bounded_join`)."""
    bound_joins(lambda: bounded_join(config))
    wrap_distributed_initialize()


def initialize(config: Config) -> None:
    """Call before anything touches devices; a no-op for a single-process job."""
    import jax

    bound_trainer_joins(config)
    place = Place.here()
    if place.num_processes <= 1 and place.coordinator is None:
        return
    devices = local_device_ids(config.topology, place)
    if place.coordinator is not None:
        jax.distributed.initialize(coordinator_address=place.coordinator,
                                   num_processes=place.num_processes,
                                   process_id=place.process_id, local_device_ids=devices)
    else:
        jax.distributed.initialize(local_device_ids=devices)
    log.info("joined jax.distributed as process %d of %d", jax.process_index(),
             jax.process_count())
