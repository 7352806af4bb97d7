"""`python -m jaxwarm.jaxkey.selfcheck` (`jaxwarm doctor`): is the key exact here?

Predicts the key of a tiny function, compiles it into a fresh temporary cache, and says in
one line whether the entry JAX wrote has the predicted name. Run in its own process so the
caller (the CLI) never imports jax, and so the temporary cache dir is this process's first
and only one (JAX ignores a second one). Exit 0 exact, 1 not exact, 2 cannot check (an
untested jax, or anything that stops the check: one line either way).
"""

from __future__ import annotations

import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from jaxwarm.core.errors import EXIT_ERROR, EXIT_INEXACT, EXIT_OK
from jaxwarm.jaxkey.components import COMPONENTS
from jaxwarm.jaxkey.entryformat import CACHE_SUFFIX
from jaxwarm.jaxkey.predict import KeyNotComputed, predict_key
from jaxwarm.jaxkey.versionguard import jax_job


@dataclass(frozen=True)
class SelfCheck:
    jax: str
    jaxlib: str
    backend: str
    predicted: str
    written: list[str]
    components: int
    predict_ms: float

    @property
    def exact(self) -> bool:
        return self.written == [self.predicted]

    def line(self) -> str:
        where = (f"jax {self.jax} / jaxlib {self.jaxlib}, Python {platform.python_version()}, "
                 f"{self.backend}")
        if self.exact:
            return (f"key prediction exact on {where}: predicted {self.predicted[:24]}..., "
                    f"the entry JAX wrote ({self.components} of {len(COMPONENTS)} components "
                    f"named, {self.predict_ms:.1f} ms after lowering)")
        return (f"key prediction NOT exact on {where}: predicted {self.predicted}, JAX wrote "
                f"{', '.join(self.written) or 'nothing'}; `jaxwarm verify` cannot be trusted "
                f"here")


def _tiny(x):  # the function whose key is checked; its name is in the key
    return (x * 2.0 + 1.0).sum()


def check(cache_dir: Path) -> SelfCheck:
    import jax
    import jax.numpy as jnp
    import jaxlib

    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    lowered = jax.jit(_tiny).lower(jax.ShapeDtypeStruct((8,), jnp.float32))
    start = time.perf_counter()
    prediction = predict_key(lowered)
    predict_ms = 1e3 * (time.perf_counter() - start)
    lowered.compile()
    written = sorted(path.name[:-len(CACHE_SUFFIX)] for path in cache_dir.glob(f"*{CACHE_SUFFIX}"))
    return SelfCheck(jax=jax.__version__, jaxlib=jaxlib.__version__,
                     backend=jax.default_backend(), predicted=prediction.key, written=written,
                     components=len(set(prediction.components) & set(COMPONENTS)),
                     predict_ms=predict_ms)


@jax_job
def main() -> int:
    with tempfile.TemporaryDirectory(prefix="jaxwarm-selfcheck-") as tmp:
        try:
            result = check(Path(tmp))
        except KeyNotComputed as exc:
            print(f"jaxwarm: self-check: cannot check here: {exc}", flush=True)
            return EXIT_ERROR
        except Exception as exc:  # any failure is the check's answer, in one line
            print(f"jaxwarm: self-check: cannot check here: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
            return EXIT_ERROR
    print(f"jaxwarm: self-check: {result.line()}", flush=True)
    return EXIT_OK if result.exact else EXIT_INEXACT


if __name__ == "__main__":
    sys.exit(main())
