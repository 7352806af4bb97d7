"""jaxwarm's adapter to JAX's internals: everything that reads them lives in this package.

- `predict`: the persistent-cache key of a lowered program, asked of JAX's own code path.
- `versions`: the tested range (jax 0.8.x to 0.12.x) and what differs between versions.
- `logs`: JAX's cache events and log lines, as the in-job recorder reads them.
- `entryformat`: an entry's file names, compression, header and atime files.
- `agree`: process 0's answer to every process, through jax.distributed's key-value store.
- `components`: the key's components and what a difference in each one means.
- `versionguard`: job entry points fail with one line on an untested jax.
- `entryload`: an entry loaded before JAX asks for it, handed to JAX's lookup (the
  prefetch's JAX side).
- `selfcheck`: `python -m jaxwarm.jaxkey.selfcheck` (`jaxwarm doctor`).

Importing the package (or any of these modules) does not import jax.
"""

from jaxwarm.jaxkey.components import COMPONENTS, differing_components, explain
from jaxwarm.jaxkey.predict import (
    KeyNotComputed,
    KeyPrediction,
    explain_difference,
    in_probe,
    predict_key,
)
from jaxwarm.jaxkey.versions import (
    TESTED_JAX_VERSIONS,
    TESTED_RANGE,
    UnsupportedJaxVersion,
)

__all__ = ["COMPONENTS", "KeyNotComputed", "KeyPrediction", "TESTED_JAX_VERSIONS",
           "TESTED_RANGE", "UnsupportedJaxVersion", "differing_components", "explain",
           "explain_difference", "in_probe", "predict_key"]
