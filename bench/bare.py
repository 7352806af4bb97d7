"""`python -m bench.bare PINNED_CONFIG`: the step compiled the plain way, as prewarm's yardstick.

What a user would write without jaxwarm: build the step through the same factory and mesh,
then `lower().compile()` each function the prewarm job compiles, in the same order, with
the persistent cache off (no recorder, no key prediction, no cache write, no manifest).
The run's own JAX options still apply, since they change the program.
"""

from __future__ import annotations

import sys


def main() -> int:
    import jax

    from jaxwarm.core.config import load_config
    from jaxwarm.step import build_step

    config = load_config(sys.argv[1])
    for name, value in config.jax.items():
        jax.config.update(name, value)
    _, bundle = build_step(config)
    for target in bundle.compile_targets():
        target.lower().compile(target.compiler_options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
