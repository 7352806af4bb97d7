"""jaxwarm's launcher: config -> job environment -> job -> init report.

`enable_cache()` is the in-job hook trainers call; the rest is used by the `jaxwarm` CLI.
"""

from launcher.hook import enable_cache

__all__ = ["enable_cache"]
