"""Which jax versions jaxwarm is tested on, and what differs between them. No jax import.

The installed version is read from the package metadata, so the CLI can refuse an untested
jax (one line, before any job starts) without paying for `import jax`, and a job's `main`
can refuse it before it calls into jax (`jaxwarm.jaxkey.versionguard`).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from importlib import metadata

from jaxwarm.core.config import CacheConfig
from jaxwarm.core.errors import ConfigError, UserError

log = logging.getLogger(__name__)

# Each of these runs the key-variation matrix, the demo and a bundle round trip in
# `make test` (tests/test_jax_versions.py); 0.10.2 is the main venv.
TESTED_JAX_VERSIONS: tuple[str, ...] = ("0.8.3", "0.10.2", "0.11.2", "0.12.0.1")
# The supported range: every release from LOWEST up to (not including) BEYOND.
LOWEST = (0, 8)
BEYOND = (0, 13)
TESTED_RANGE = "jax 0.8.x to 0.12.x"
ALLOW_UNTESTED_ENV = "JAXWARM_ALLOW_UNTESTED_JAX"
# jax 0.11.0 took XLA's autotune dir (kept inside the cache dir) out of the compile options
# it hashes: from then on the cache dir's path string is not part of any key.
AUTOTUNE_PATH_LEAVES_KEY = (0, 11)


class UnsupportedJaxVersion(UserError, RuntimeError):
    """The installed jax is outside the tested range, or lacks what the key probe needs."""


@dataclass(frozen=True)
class JaxVersions:
    jax: str
    jaxlib: str


def release(version: str) -> tuple[int, ...]:
    """'0.12.0.1' -> (0, 12, 0, 1); pre/dev suffixes ('0.13.0rc1') are dropped."""
    leading = re.split(r"[^\d.]", version, maxsplit=1)[0]
    return tuple(int(part) for part in leading.split(".") if part)


@functools.cache
def installed() -> JaxVersions | None:
    """jax/jaxlib as installed in this Python, or None when jax is not installed. Read once:
    a metadata lookup costs about a millisecond, and every key prediction checks it."""
    try:
        return JaxVersions(metadata.version("jax"), metadata.version("jaxlib"))
    except metadata.PackageNotFoundError:
        return None


def required() -> JaxVersions:
    """`installed()` where a command cannot go on without jax (a bundle records and compares
    the versions): no jax is the one line `version_problem` says."""
    versions = installed()
    if versions is None:
        raise UnsupportedJaxVersion(version_problem(None) or "jax is not installed")
    return versions


def in_range(version: str) -> bool:
    return LOWEST <= release(version)[:2] < BEYOND


def allowed_anyway() -> bool:
    return os.environ.get(ALLOW_UNTESTED_ENV) == "1"


def version_problem(versions: JaxVersions | None = None) -> str | None:
    """One line saying why jaxwarm will not run on the installed jax; None when it will.

    Outside the range with JAXWARM_ALLOW_UNTESTED_JAX=1 it warns once and returns None.
    """
    versions = versions if versions is not None else installed()
    if versions is None:
        return f"jax is not installed in this Python; jaxwarm supports {TESTED_RANGE}"
    if in_range(versions.jax):
        return None
    if allowed_anyway():
        log.warning("jax %s is outside jaxwarm's tested range (%s); trying anyway because "
                    "%s=1", versions.jax, TESTED_RANGE, ALLOW_UNTESTED_ENV)
        return None
    return unsupported_message(versions.jax)


def unsupported_message(version: str, why: str = "") -> str:
    """The one line a user sees on an untested jax: the version, the range, what to do."""
    reason = f" ({why})" if why else ""
    return (f"jax {version} is outside jaxwarm's tested range, {TESTED_RANGE} (tested on "
            f"{', '.join(TESTED_JAX_VERSIONS)}){reason}: install e.g. "
            f"'jax[cpu]=={TESTED_JAX_VERSIONS[-1]}', or set {ALLOW_UNTESTED_ENV}=1 to try "
            f"anyway and run `jaxwarm doctor`")


def cache_path_in_key(jax_version: str, xla_caches: str) -> bool:
    """Does the cache dir's path string change every key on this jax with these settings?

    Before jax 0.11 XLA's autotune dir (inside the cache dir) is in the hashed compile
    options unless the XLA caches are off (`cache.xla_caches: none`).
    """
    return xla_caches != "none" and release(jax_version)[:2] < AUTOTUNE_PATH_LEAVES_KEY


def staging_problem(cache: CacheConfig, jax_version: str, source: str) -> str | None:
    """Why staging would change the key on this jax with these settings; None when it
    would not. The one rule, checked by the launcher and again by every staged job."""
    if cache.stage is None or not cache_path_in_key(jax_version, cache.xla_caches):
        return None
    return (f"{source}: cache.stage: on jax {jax_version} the cache dir's path string is part "
            f"of every key (XLA's autotune dir, before jax 0.11), so JAX reading the staged "
            f"copy at {cache.stage} would miss every entry prewarmed in {cache.dir}; set "
            f"cache.xla_caches: none (the prewarm then writes keys without the path) or use "
            f"jax >= 0.11")


def refuse_key_change(cache: CacheConfig, source: str) -> None:
    """`staging_problem` for the jax installed here, as the one-line ConfigError: the
    launcher's check before it builds a training job, and each staged job's own. A rule
    of JAX's key (beside `cache_path_in_key`), not of any dir: no store is asked."""
    versions = installed()
    if versions is not None and (problem := staging_problem(cache, versions.jax, source)):
        raise ConfigError(problem)
