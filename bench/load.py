"""`python -m bench.load`: a training process's warm load of the run's step, taken apart.

Started with a job's environment on a cache the prewarm filled (`bench.big_compile`): it
starts as the reference trainer does (`jaxwarm.job.start.jobstart.start_job`: jax.distributed, the
cache hook and init recorder, the step factory), then `lower().compile()`s every target,
which loads it from the cache, so the init report has JAX's own retrieval time. Then, in the
same process, the two costs a load cannot avoid, each timed alone: decompressing the train
step's entry (its bytes already read into memory) and deserializing its executable
(`jax.experimental.serialize_executable`). Prints one `RESULT <json>` line.
"""

from __future__ import annotations

import json
import sys
import time
import zlib

from jaxwarm.core.records import TRAIN
from jaxwarm.jaxkey.entryformat import ZSTD_MAGIC
from jaxwarm.store.store import LocalStore


def decompress(data: bytes) -> bytes:
    if data.startswith(ZSTD_MAGIC):
        import zstandard
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return zlib.decompress(data)


def main() -> int:
    from jax.experimental.serialize_executable import deserialize_and_load, serialize

    from jaxwarm.job.start.jobstart import start_job
    from jaxwarm.job.start.pinned import config_from_env

    config = config_from_env()
    recorder, _, bundle = start_job(config, TRAIN)
    compiled = {}
    for target in bundle.compile_targets():
        start = time.perf_counter()
        compiled[target.name] = target.lower().compile(target.compiler_options)
        record = recorder.report.functions[-1]
        print(f"{record.name}: {'HIT' if record.hit else 'MISS'} in {record.seconds:.2f} s "
              f"({time.perf_counter() - start:.2f} s with lowering)", file=sys.stderr,
              flush=True)
    # Nothing runs the step here: say so, or the recorder waits for its first execution.
    recorder.mark_first_step()
    step = next(fn for fn in recorder.report.functions if fn.name == "jit_train_step")
    data = LocalStore(config.cache.dir).entry_path(str(step.key)).read_bytes()
    start = time.perf_counter()
    payload = decompress(data)
    decompress_s = time.perf_counter() - start
    serialized, in_tree, out_tree = serialize(compiled["train_step"])
    start = time.perf_counter()
    deserialize_and_load(serialized, in_tree, out_tree)
    deserialize_s = time.perf_counter() - start
    print("RESULT " + json.dumps({
        "hit": step.hit, "retrieval_s": step.seconds, "entry_bytes": len(data),
        "payload_bytes": len(payload), "decompress_s": decompress_s,
        "deserialize_s": deserialize_s}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
