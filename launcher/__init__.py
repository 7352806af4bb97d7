"""jaxwarm's launcher: config -> job environment -> job -> cache -> init report.

`enable_cache()` is the in-job hook trainers call; the rest is used by the `jaxwarm` CLI.
It is imported on first use, so a job's start-up (the task wrapper, the entrypoint runner)
does not pay for the hook's imports.
"""

from typing import Any

__all__ = ["enable_cache"]


def __getattr__(name: str) -> Any:
    if name == "enable_cache":
        from launcher.injob.hook import enable_cache
        return enable_cache
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
