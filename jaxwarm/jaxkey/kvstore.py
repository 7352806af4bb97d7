"""The key-value store of `jax.distributed`'s coordination service, as the ranks use it.

Every process that joined `jax.distributed` holds a client of the service process 0 runs:
string keys and values any process can set and read, and barriers with a timeout of their
own. JAX keeps that client in `jax._src.distributed.global_state`; its methods are the same
on every tested version (0.8.3 to 0.12.0.1). A barrier that times out fails for every
process waiting at it and leaves the service running, so the ranks can still read each
other's keys to say who was late.
"""

from __future__ import annotations

from typing import Any


class StoreError(RuntimeError):
    """The coordination service did not answer (its process died, or a barrier failed for
    another reason than its timeout)."""


class KVStore:
    """Set and read string values, and meet at barriers, with the job's other processes."""

    def __init__(self, client: Any):
        self._client = client

    @classmethod
    def of_job(cls) -> KVStore | None:
        """The store of the `jax.distributed` job this process joined; None outside one."""
        from jax._src import distributed

        client = distributed.global_state.client
        return None if client is None else cls(client)

    def set(self, key: str, value: str) -> None:
        try:
            self._client.key_value_set(key, value, allow_overwrite=True)
        except Exception as exc:  # JaxRuntimeError: the service is gone
            raise StoreError(_first_line(exc)) from None

    def get(self, key: str, timeout_s: float) -> str:
        """The value of `key`, waiting at most `timeout_s` for some process to set it."""
        try:
            return str(self._client.blocking_key_value_get(key, max(1, int(timeout_s * 1000))))
        except Exception as exc:
            raise StoreError(_first_line(exc)) from None

    def get_dir(self, prefix: str) -> dict[str, str]:
        """Every key under `prefix/` (the prefix stripped) with its value."""
        prefix = prefix.rstrip("/") + "/"
        try:
            found = self._client.key_value_dir_get(prefix)
        except Exception as exc:
            raise StoreError(_first_line(exc)) from None
        return {key[len(prefix):] if key.startswith(prefix) else key: value
                for key, value in found}

    def barrier(self, name: str, timeout_s: float, processes: tuple[int, ...] | None) -> bool:
        """Wait until every process of `processes` (None: all) reached the barrier `name`.
        False when the timeout passed first; StoreError when the service failed otherwise."""
        ids = None if processes is None else list(processes)
        try:
            self._client.wait_at_barrier(name, max(1, int(timeout_s * 1000)), ids)
        except Exception as exc:
            if "DEADLINE_EXCEEDED" in str(exc):
                return False
            raise StoreError(_first_line(exc)) from None
        return True


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
