"""How the ranks of a job meet and agree, through jax.distributed's key-value store.

One protocol (keys under `jaxwarm/`), for two problems of a job whose ranks do not all hit:

- **Skew.** A rank that loads a function from the cache reaches that function's first
  collective long before a rank that compiles it, and the collective's own wait (Gloo's
  fixed 30 s on CPU; NCCL, or XLA:GPU's autotuning exchange, on GPU) runs out: the whole job
  dies with C++ stack traces. So after every multi-process compile or load, before the
  program first runs (`jaxwarm.jaxkey.lookup`), the ranks that run it meet at a barrier
  bounded by `ranks.meet_timeout_s` (default: `meet_timeout`, from the compile times the
  manifest recorded for this layout). Each rank publishes what it is doing
  (`jaxwarm/state/<rank>`), so a rank that waits in vain says in one line which ranks were
  late and what they were doing, and the job stops.
- **Agreement** (`ranks.agree`, on by default on GPU): before each multi-process lookup the
  ranks post the key JAX computed, its component hashes and the size of the entry each one
  sees, and wait for each other (the same bound). A key that differs stops the job at once
  with one line naming the component and the ranks. Either all load or all compile: when
  the ranks do not all see the same entry (a torn copy, a file not yet visible on one
  node's NFS client), every rank compiles that function without the persistent cache, so
  the entry is neither read nor written over: a rejected hit leaves it in place.

At the first meeting the ranks also compare the environment jaxwarm gives every rank (its
own variables, `JAX_*`, `XLA_FLAGS`): one rank with another value stops the job with one
line instead of compiling under another key, or hanging.

Stopping is `os._exit` after the one line and the init report: an exception could be caught
by the trainer, and a normal exit runs `jax.distributed.shutdown()`, whose barrier waits
for the late ranks and then aborts with a C++ stack trace. The launcher (or SLURM's
`--kill-on-bad-exit`) stops the other ranks.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

from jaxwarm.core.childwait import DEADLINE
from jaxwarm.core.config import MAX_DURATION_S, Config
from jaxwarm.core.errors import EXIT_ERROR, EXIT_FAILED, ConfigError, say
from jaxwarm.core.jsonio import dumps, from_json
from jaxwarm.core.records import RANKS, KeyPost, RankState, ReportWarning
from jaxwarm.core.words import plural, ranges
from jaxwarm.jaxkey.components import PER_PROCESS, differing_components, likely_causes
from jaxwarm.jaxkey.kvstore import KVStore, StoreError
from jaxwarm.jaxkey.lookup import Lookup
from jaxwarm.job.record.recorder import InitRecorder
from jaxwarm.job.start.jaximport import RECORDER_PID
from jaxwarm.job.start.place import PROCESS_ID
from jaxwarm.store.manifest import ManifestEntry
from jaxwarm.store.store import open_store

log = logging.getLogger(__name__)

PREFIX = "jaxwarm"
# The default bound of a meeting: this many times the longest compile the manifest recorded
# for the run's layout (a rank that compiles while another loads is late by about one
# compile; contention and a slower node get the rest), and never under the floor.
TIMEOUT_FACTOR = 3.0
TIMEOUT_FLOOR_S = 300.0
# Variables that differ between the ranks of one job by design.
PER_PROCESS_VARIABLES = (PROCESS_ID, RECORDER_PID, DEADLINE)
# A long value in the environment line: its length, and what precedes its difference.
SHOWN_CHARS = 80
SHOWN_CONTEXT = 20
NO_STATE = "published no state (not started, or stopped before its first lowering)"


def meet_timeout(config: Config, entries: list[ManifestEntry]) -> float:
    """How long a rank waits for the others at a meeting: `ranks.meet_timeout_s`, or
    TIMEOUT_FACTOR times the longest compile the run's prewarm recorded on this layout (the
    number of processes is part of the key), at least TIMEOUT_FLOOR_S and at most the
    config's maximum for a duration (a manifest's compile time is another user's word in a
    shared cache)."""
    if config.ranks.meet_timeout_s is not None:
        return config.ranks.meet_timeout_s
    layout = config.topology.num_processes
    longest = max((e.compile_s for e in entries if e.process_count == layout), default=0.0)
    return min(max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * longest), MAX_DURATION_S)


def agreement_on(config: Config) -> bool:
    """`ranks.agree`: auto is on for GPU jobs only (on CPU each process hashes its own
    devices into the key, so the keys differ by design and only process 0 can hit)."""
    agree = config.ranks.agree
    return config.topology.platform == "gpu" if agree == "auto" else bool(agree)


def ranks_of(ranks: list[int]) -> str:
    return f"{plural(len(set(ranks)), 'rank')} {ranges(ranks)}"


def _groups(values: dict[int, object]) -> list[list[int]]:
    """Ranks grouped by equal value, the largest group first (ties: the lowest rank)."""
    groups: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        groups.setdefault(json.dumps(value, sort_keys=True), []).append(rank)
    return sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))


def late_line(what: str, timeout_s: float, late: dict[int, RankState | None],
              now: float) -> str:
    """The one line of a meeting that timed out: the late ranks, grouped by what they were
    doing, with how long they had been at it."""
    by_doing: dict[str, list[int]] = {}
    ages: dict[str, list[float]] = {}
    for rank, state in sorted(late.items()):
        doing = state.doing if state is not None else ""
        by_doing.setdefault(doing, []).append(rank)
        if state is not None:
            ages.setdefault(doing, []).append(max(0.0, now - state.since))
    parts = []
    for doing, ranks in by_doing.items():
        if not doing:
            parts.append(f"{ranks_of(ranks)} {NO_STATE}")
            continue
        low, high = min(ages[doing]), max(ages[doing])
        age = f"{low:.0f} s" if round(low) == round(high) else f"{low:.0f}-{high:.0f} s"
        parts.append(f"{ranks_of(ranks)} still {doing} (started {age} ago)")
    return (f"the ranks did not meet {what} within {timeout_s:g} s (ranks.meet_timeout_s): "
            + "; ".join(parts))


def environment_line(environments: dict[int, dict[str, str]]) -> str | None:
    """The one line for ranks whose jaxwarm-owned environment differs; None when equal."""
    names = sorted({name for env in environments.values() for name in env}
                   - set(PER_PROCESS_VARIABLES))
    differing = []
    for name in names:
        groups = _groups({rank: env.get(name) for rank, env in environments.items()})
        if len(groups) > 1:
            differing.append((name, groups))
    if not differing:
        return None
    name, groups = differing[0]
    majority = environments[groups[0][0]].get(name) or ""

    def shown(rank: int) -> str:
        """The value, at most about 80 characters: a long one from a little before where it
        first differs from the majority's, so that the line shows the difference."""
        value = environments[rank].get(name)
        if value is None:
            return "unset"
        differs_at = 0 if rank in groups[0] else len(os.path.commonprefix([value, majority]))
        elided = len(value) > SHOWN_CHARS and differs_at > SHOWN_CHARS // 2
        text = "..." + value[differs_at - SHOWN_CONTEXT:] if elided else value
        return ascii(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "...")

    others = "; ".join(f"{shown(group[0])} on {ranks_of(group)}" for group in groups[1:])
    more = f" (and {len(differing) - 1} more {plural(len(differing) - 1, 'variable')})" \
        if len(differing) > 1 else ""
    return (f"the ranks' environments differ: {name} is {others}, but {shown(groups[0][0])} "
            f"on {ranks_of(groups[0])}{more}; jaxwarm gives every rank the same "
            f"environment, so something on those ranks' nodes changed it (a shell profile, "
            f"a wrapper script), and their cache keys would differ")


@dataclass(frozen=True)
class Agreement:
    """What the ranks do with one lookup: `stop` (the one line) when their keys differ;
    else `skip_cache` (why) when they do not all see the same entry, so all compile without
    the persistent cache; neither: all use it (all load, or all compile and write)."""

    stop: str | None = None
    skip_cache: str | None = None


def agree(function: str, posts: dict[int, KeyPost], platform: str) -> Agreement:
    """The decision every rank takes from the same posts (so all take the same one).
    Components that differ between processes by design on `platform` are left out."""
    own = PER_PROCESS.get(platform, ())
    comparable = {rank: {name: digest for name, digest in post.components.items()
                         if name not in own} or post.key
                  for rank, post in posts.items()}
    groups = _groups(dict(comparable))
    if len(groups) > 1:
        reference = comparable[groups[0][0]]
        differences = []
        for group in groups[1:]:
            other = comparable[group[0]]
            names = differing_components(reference, other) \
                if isinstance(reference, dict) and isinstance(other, dict) else ["the key"]
            differences.append((names, group))
        parts = "; ".join(f"{', '.join(names)} differs on {ranks_of(group)}"
                          for names, group in differences)
        return Agreement(stop=(
            f"{function}: the ranks would look it up under different cache keys: {parts} "
            f"(against {ranks_of(groups[0])}): {likely_causes(differences[0][0][0])}"))
    sizes = {rank: post.size for rank, post in posts.items()}
    seen = _groups(dict(sizes))
    if len(seen) == 1:
        return Agreement()
    described = "; ".join(
        f"{'no entry' if sizes[group[0]] is None else f'{sizes[group[0]]} bytes'} on "
        f"{ranks_of(group)}" for group in seen)
    return Agreement(skip_cache=(
        f"{function}: the ranks do not see the same cache entry ({described}): every rank "
        f"compiled it without the persistent cache (none loaded it while another compiled "
        f"it); the entry was left in place"))


class RankCoordinator:
    """The protocol inside one process; `jaxwarm.jaxkey.lookup` calls `before_lookup` and
    `after_compile` for every multi-process compile. Bound (`bind`) with the meeting bound
    once the process knows its place (the recorder's first lowering)."""

    def __init__(self, recorder: InitRecorder, agree: bool):
        self.recorder = recorder
        self.agree = agree
        self.timeout_s = TIMEOUT_FLOOR_S
        self._store: KVStore | None = None
        # Meetings so far, by kind, module and set of processes.
        self._counts: dict[tuple[str, str, tuple[int, ...]], int] = {}
        self._environment_checked = False
        self._lock = threading.Lock()  # never held while waiting for other ranks

    def bind(self, timeout_s: float) -> None:
        """At the process's first lowering: the bound, and (in a job of several processes)
        a first state, so that a rank late for the first meeting is said as lowering."""
        self.timeout_s = timeout_s
        if self.recorder.report.process_count > 1:
            self._publish(self._started(), "tracing and lowering, before its first compile")

    # -- the two moments of a compile -------------------------------------------------------

    def before_lookup(self, lookup: Lookup) -> bool:
        """After JAX computed the key: publish what this rank is about to do; with the
        agreement on, compare with the other ranks. False: compile without the cache."""
        import jax

        store = self._started()
        name = lookup.module_name
        size = open_store(str(jax.config.jax_compilation_cache_dir)).entry_size(lookup.key)
        self._publish(store, f"loading {name} from the cache" if size is not None
                      else f"compiling {name}")
        if not self.agree:
            return True
        barrier = self._barrier("agree", lookup)
        post = KeyPost(lookup.key, lookup.components, size)
        self._meet(store, barrier, dumps(post), lookup.processes,
                   f"to agree on {name}'s cache key", name)
        try:
            posted = store.get_dir(barrier)
        except StoreError as exc:
            self._lost(exc, f"agreeing on {name}'s cache key")
        posts = {int(rank): from_json(KeyPost, json.loads(value), f"{barrier}/{rank}")
                 for rank, value in posted.items()}
        decision = agree(name, posts, lookup.platform)
        if decision.stop is not None:
            self.stop(decision.stop, EXIT_ERROR)
        if decision.skip_cache is not None:
            self.recorder.add_warning(ReportWarning(RANKS, decision.skip_cache))
            return False
        return True

    def after_compile(self, lookup: Lookup) -> None:
        """After the compile or load, before the program first runs: meet the other ranks
        of this program, so that none reaches its first collective alone."""
        store, barrier = self._started(), self._barrier("meet", lookup)
        name = lookup.module_name
        self._publish(store, f"waiting for the other ranks after {name}")
        self._meet(store, barrier, "", lookup.processes, f"after {name}", name)
        self._publish(store, f"running its own code after {name}")

    # -- the protocol ----------------------------------------------------------------------

    def _started(self) -> KVStore:
        """The store, and this rank's environment posted, the first time it is needed."""
        with self._lock:
            if self._store is None:
                store = KVStore.of_job()
                if store is None:
                    self.stop("a program spans several processes, but this process joined no "
                              "jax.distributed job (no key-value store to meet the others in)",
                              EXIT_FAILED)
                try:
                    store.set(f"{PREFIX}/env/{self._rank}",
                              json.dumps(self.recorder.report.environment))
                except StoreError as exc:
                    self._lost(exc, "starting")
                self._store = store
            return self._store

    @property
    def _rank(self) -> int:
        return self.recorder.report.process_index

    def _barrier(self, kind: str, lookup: Lookup) -> str:
        """The next barrier of a kind for one program. Ids are never reused:
        the n-th compile of that module over that set of processes, the same on each of
        them (they compile the same programs, each as often), even when a trainer compiles
        two programs at once in two threads (no lock is held while waiting). A rank that
        compiles a program the others do not (a `jax.clear_caches()` on that rank alone)
        waits for them in vain."""
        counted = (kind, lookup.module_name, lookup.processes)
        with self._lock:
            count = self._counts.get(counted, 0)
            self._counts[counted] = count + 1
        everyone = len(lookup.processes) == self.recorder.report.process_count
        group = "all" if everyone else "-".join(map(str, lookup.processes))
        return f"{PREFIX}/{kind}/{group}/{lookup.module_name}/{count}"

    def _publish(self, store: KVStore, doing: str) -> None:
        try:
            store.set(f"{PREFIX}/state/{self._rank}", dumps(RankState(doing, time.time())))
        except StoreError as exc:
            self._lost(exc, doing)

    def _meet(self, store: KVStore, barrier: str, post: str, processes: tuple[int, ...],
              what: str, function: str) -> None:
        """Post under the barrier's name, wait for the others; stop the job with one line
        when they do not all come in time."""
        with self.recorder.waiting_for_ranks(function):
            try:
                store.set(f"{barrier}/{self._rank}", post)
                everyone = len(processes) == self.recorder.report.process_count
                met = store.barrier(barrier, self.timeout_s, None if everyone else processes)
                if not met:
                    arrived = {int(rank) for rank in store.get_dir(barrier)}
                    states = self._states(store)
                    self.stop(late_line(what, self.timeout_s,
                                        {rank: states.get(rank) for rank in processes
                                         if rank not in arrived}, time.time()), EXIT_FAILED)
                with self._lock:
                    first, self._environment_checked = not self._environment_checked, True
                if first:
                    environments = {int(rank): json.loads(value) for rank, value in
                                    store.get_dir(f"{PREFIX}/env").items()}
                    line = environment_line(environments)
                    if line is not None:
                        self.stop(line, EXIT_ERROR)
            except StoreError as exc:
                self._lost(exc, f"waiting for the other ranks {what}")

    def _states(self, store: KVStore) -> dict[int, RankState]:
        states = {}
        for rank, value in store.get_dir(f"{PREFIX}/state").items():
            try:
                states[int(rank)] = from_json(RankState, json.loads(value), f"state/{rank}")
            except (ValueError, ConfigError):
                continue
        return states

    def _lost(self, exc: StoreError, doing: str) -> NoReturn:
        self.stop(f"the job's coordination service (run by process 0) stopped answering "
                  f"while this rank was {doing}: {exc}", EXIT_FAILED)

    def stop(self, line: str, code: int) -> NoReturn:
        """The one line, in the log and the init report; then end this process at once
        (see the module docstring)."""
        say(line)
        self.recorder.add_warning(ReportWarning(RANKS, line), quiet=True)
        try:
            self.recorder.write()
        except OSError as exc:
            log.warning("the init report could not be written: %s", exc)
        logging.shutdown()
        os._exit(code)
