"""`python -m bench.plain_train PINNED_CONFIG OUT_DIR`: the reference trainer's first step,
written the way a trainer that knows nothing of jaxwarm would: the yardstick of `bench.growth`.

It joins `jax.distributed` when the environment names a coordinator (no arguments: JAX finds
the rest), builds mesh and step through the step factory, compiles init and step, meets the
other ranks at a key-value store barrier (without it, a rank that loads the step from the
cache reaches the first collective while the others still compile, and Gloo's 30 s wait on
CPU kills the job: a user has to write this by hand), runs one step and writes
`OUT_DIR/p<process>.json`: its time to first step from process start and its peak RSS.

`bench.growth` starts it both ways: by hand with JAX's cache set through environment
variables only, and as `entrypoint.function` of a `jaxwarm launch`, which runs it unchanged
with jaxwarm's recorder, cache hook and runner around it.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from jaxwarm.job.record.recorder import process_start_time

MEET_TIMEOUT_MS = 30 * 60 * 1000


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv[1:]
    start = process_start_time()
    import jax

    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize()
    from jax._src import distributed

    from jaxwarm.core.config import load_config
    from jaxwarm.step import build_step, seed_spec
    from jaxwarm.workload.data import make_global_batch

    config = load_config(argv[0])
    mesh, bundle = build_step(config)
    init = bundle.init_state.lower(seed_spec()).compile()
    step = bundle.train_step.lower(bundle.state, bundle.batch).compile()
    if jax.process_count() > 1:
        distributed.global_state.client.wait_at_barrier("plain_first_step", MEET_TIMEOUT_MS)
    state = init(np.uint32(config.train.seed))
    state, _ = step(state, make_global_batch(config, mesh, 0))
    jax.block_until_ready(state)
    first_step_s = time.time() - start
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"p{jax.process_index()}.json").write_text(json.dumps({
        "process": jax.process_index(), "first_step_s": first_step_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
