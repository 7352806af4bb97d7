"""The files jaxwarm writes and reads back, one typed record each: the init report (with its
function records and warnings), verify's verdicts, the lines of the cache's usage log.

Written with `to_json`/`dumps`, read back through `launcher.config.convert`, the converter
that reads the config and the manifest: types come from the annotations, so a file with a
missing key or a wrong type is one line naming the file (and line) and the key. Readers of
files that many jobs write are lenient per record (`read_record`, `parse_usage_line`): a bad
report or usage line is skipped with that line logged, never fatal to the command reading
the others. Output is standard JSON: no NaN or Infinity, which other tools cannot read.

Pure: both the submit side and the code inside a job import it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from launcher.config import ConfigError, convert

log = logging.getLogger("jaxwarm.records")

R = TypeVar("R")

# The kinds of warning an init report carries.
SETTING_CHANGED = "setting_changed"  # the trainer changed a cache setting jaxwarm made
RECOMPILED = "recompiled"  # one function compiled twice under different keys
# a prewarmed function missed under other process-global JAX settings than the prewarm's
OPTIONS_DIFFER = "options_differ"
# the ranks of the job did not all have an entry, so all compiled without the cache, or
# they stopped the job (a key or an environment that differs, a meeting that timed out)
RANKS = "ranks"


@dataclass(frozen=True)
class ReportWarning:
    """Something a job did that costs its hits, said once: `kind` for code to match on,
    `text` for the user."""

    kind: str
    text: str


@dataclass
class FunctionRecord:
    """One compile request: a cache lookup (hit or miss) or a compile with the cache off."""

    name: str
    key: str | None
    hit: bool
    seconds: float = 0.0
    components: dict[str, str] = field(default_factory=dict)
    # Of the entry this process wrote (process 0, local cache): what `cache verify` checks.
    sha256: str | None = None
    size: int | None = None
    # Hash of the abstract input types (global shapes and dtypes) it was lowered for: tells
    # two functions of one name apart, and a target's miss from another function's compile.
    signature: str | None = None
    # The process-global JAX settings in force at its lowering (launcher.jaxkey.globalopts).
    global_options: dict[str, str] = field(default_factory=dict)
    # Why JAX did not write the entry of this miss, in its words (process 0; None if it did).
    not_stored: str | None = None
    # Why JAX could not load the entry of this miss that was in the cache (process 0 read it
    # in full after the miss: `launcher.injob.hook.note_missed_entries`); None otherwise.
    not_loaded: str | None = None


@dataclass(frozen=True)
class InitPhase:
    """Part of a process's time to first step (`launcher.injob.phases`): `phase` is one of
    imports, distributed, trace, lower, key prediction, compile, cache load, first step,
    other; `function` the JAX module it was spent on (trace, lower, compile, cache load)."""

    phase: str
    seconds: float
    function: str | None = None


@dataclass(frozen=True)
class Staging:
    """What node-local staging (`cache.stage`) gave one process of a training job: in its
    init report, and the stager's own in `<run dir>/stage/<attempt>-n<node>.json`, which the
    node's other processes wait for (`launcher.injob.stage`)."""

    node: int
    # Where this process's JAX reads and writes entries: the stage dir, or the shared cache
    # dir when staging failed (`fallback` says why).
    dir: str
    # Whether this process did the node's copy (its first process) or waited for it.
    stager: bool
    copied: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    bytes_copied: int = 0
    seconds: float = 0.0
    waited_s: float = 0.0
    fallback: str | None = None


@dataclass
class InitReport:
    """What the persistent cache did during one process's init:
    `reports/<job>-r<restart>-p<process>.json` (`launcher.rundir.report_path`)."""

    # Written for the reader's convenience, recomputed from the rest when read back.
    DERIVED: ClassVar[tuple[str, ...]] = ("misses", "over_budget")

    job: str
    restart_count: int
    process_index: int
    process_count: int
    # The cache dir JAX opened at the first lookup and used for the whole process: the
    # config's, or under cache.enforce off one the trainer set before that lookup.
    cache_dir: str
    init_budget_s: float
    lookups: int = 0
    hits: int = 0
    backend_compile_s: float = 0.0
    retrieval_s: float = 0.0
    compile_time_saved_s: float = 0.0
    time_to_first_step_s: float | None = None
    # Time this process waited at meetings for the other ranks (launcher.injob.ranks): what
    # a rank that loaded spends while others compile, instead of timing out in a collective.
    ranks_wait_s: float = 0.0
    # "trainer" (mark_first_step) or the prewarmed function whose first execution ended it.
    first_step_from: str | None = None
    # The jaxwarm-owned variables this process ran with: equal across jobs and restarts.
    environment: dict[str, str] = field(default_factory=dict)
    functions: list[FunctionRecord] = field(default_factory=list)
    warnings: list[ReportWarning] = field(default_factory=list)
    # Node-local staging of the cache (training jobs with `cache.stage`); None without it.
    stage: Staging | None = None
    # Seconds this process waited for jaxwarm's locks, by kind (manifest, usage log, compile
    # of a key, JAX cache ...): `launcher.files.lock_waits`.
    lock_wait_s: dict[str, float] = field(default_factory=dict)
    # Where the time to first step went; they add up to it (empty before the first step).
    phases: list[InitPhase] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return self.lookups - self.hits

    @property
    def over_budget(self) -> bool:
        return self.time_to_first_step_s is not None and \
            self.time_to_first_step_s > self.init_budget_s

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self),
                **{name: getattr(self, name) for name in self.DERIVED}}


@dataclass(frozen=True)
class Verdict:
    """verify's answer for one function: WARM or COLD under its predicted key, and why."""

    function: str
    key: str
    warm: bool
    lower_s: float
    predict_s: float
    explanation: list[str] = field(default_factory=list)
    components: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VerifyResult:
    """The verify job's answer for the run: `verify/p0.json` (`rundir.verify_result_path`)."""

    process_index: int
    functions: list[Verdict]

    @property
    def warm(self) -> bool:
        return all(verdict.warm for verdict in self.functions)


# -- deciding whether a launch needs its prewarm job -----------------------------------------

@dataclass(frozen=True)
class Fingerprint:
    """Everything the launcher can know, before any job, that enters the cache keys of a
    run's step (`launcher.submit.fingerprint`): `parts` by name (versions as they are, the
    rest as short hashes), `files` the hash of each source file the step factory's module
    reaches, `digest` the hash of both; `variables` a hash of each environment variable that
    can enter a key (`launcher.environment.key_variable`), to name the ones that differ."""

    digest: str
    parts: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)
    # The files the step factory read while it built the step, by path -> content hash: the
    # prewarm job records them (`launcher.injob.reads`); the login node cannot know them.
    reads: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PrewarmDecision:
    """Whether a launch ran its prewarm job, and why: `<run dir>/prewarm-decision.json`
    (`rundir.prewarm_decision_path`). The prewarm job records `fingerprint` with the entries
    it leaves, so that the next launch with the same fingerprint can go without it."""

    mode: str  # always, auto, never
    prewarm: bool
    why: str
    fingerprint: Fingerprint | None = None
    time: float = field(default_factory=time.time)
    # Without a prewarm job: the entries of the recorded prewarm the launch relies on.
    keys: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PrewarmRecord:
    """A prewarm that completed: the fingerprint it ran under and the keys of the entries it
    left in the cache (compiled, or found intact), in `jaxwarm-prewarms.json`."""

    fingerprint: Fingerprint
    keys: list[str]
    run: str
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class PrewarmProgress:
    """Which target a running prewarm job compiles (`<run dir>/prewarm-progress.json`, for
    `jaxwarm status`): since when, and how long the same function took last time on this
    layout (None: never compiled here before)."""

    function: str
    index: int
    count: int
    started: float
    last_s: float | None = None
    done: bool = False


# -- what the ranks of a job tell each other (jax.distributed's key-value store) -----------

@dataclass(frozen=True)
class RankState:
    """What one rank is doing, and since when (`launcher.injob.ranks`): the rank that
    waits in vain says what the late ones were doing."""

    doing: str
    since: float


@dataclass(frozen=True)
class KeyPost:
    """One rank's side of the agreement before a compile: the key JAX computed, each
    component's hash, and the size of the entry this rank sees (None: no entry)."""

    key: str
    components: dict[str, str] = field(default_factory=dict)
    size: int | None = None


# -- the usage log: one line per job's process 0, and one per entry event -----------------

@dataclass(frozen=True)
class UsedFunction:
    """One lookup of a job, as the usage log keeps it."""

    name: str
    key: str
    hit: bool
    seconds: float = 0.0
    # Of the entry this job wrote (a miss it stored): what `cache verify` checks against.
    sha256: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class JobUsage:
    """Which keys process 0 of a job looked up, hit or wrote, once its init was over."""

    run: str
    job: str
    restart: int = 0
    functions: list[UsedFunction] = field(default_factory=list)
    run_dir: str | None = None
    config: str | None = None
    time: float = field(default_factory=time.time)

    @property
    def user(self) -> str:
        return f"{self.run} ({self.job} r{self.restart})"


@dataclass(frozen=True)
class EntryChecked:
    """An entry was fully checked and found intact (one nobody had recorded, or one a job
    missed): its checksum and size, so that the next warm check of it is the quick one."""

    key: str
    sha256: str
    size: int
    event: str = "checked"
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class EntryQuarantined:
    key: str
    problem: str | None = None
    event: str = "quarantined"
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class EntryMissed:
    """A job missed an entry that was in the cache before it started (JAX could not load
    it): the next prewarm checks it in full instead of trusting its size, and quarantines
    and compiles it again when it is corrupt."""

    key: str
    run: str | None = None
    event: str = "missed"
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class EntryPruned:
    key: str
    size: int | None = None
    event: str = "pruned"
    time: float = field(default_factory=time.time)


UsageRecord = JobUsage | EntryChecked | EntryQuarantined | EntryPruned | EntryMissed
USAGE_EVENTS: dict[str, type] = {"checked": EntryChecked, "quarantined": EntryQuarantined,
                                 "pruned": EntryPruned, "missed": EntryMissed}


def parse_usage_line(line: str, source: str) -> UsageRecord:
    """One line of the usage log as its record, or ConfigError naming `source` (the file
    and line) and what is wrong. Lines with an `event` are entry events, others job lines."""
    data = parse_json(line, source)
    event = data.get("event") if isinstance(data, dict) else None
    if event is None:
        return from_json(JobUsage, data, source)
    if event not in USAGE_EVENTS:
        raise ConfigError(f"{source}: event: expected one of {', '.join(USAGE_EVENTS)}, "
                          f"got {event!r}")
    return from_json(USAGE_EVENTS[event], data, source)


@dataclass(frozen=True)
class FirstStep:
    """A training attempt's process 0 found its first step: one line of the run dir's
    `first-steps.jsonl` (`rundir.first_steps_path`), kept across launches of the run, so
    that `jaxwarm report` shows cold and warm launches of it side by side. A guessed first
    step that a later finding replaces is written again, with the same `started`."""

    restart: int
    started: float  # when the process started (wall clock): one attempt's lines share it
    seconds: float
    first_step_from: str
    hits: int
    lookups: int
    time: float = field(default_factory=time.time)


# -- reading and writing --------------------------------------------------------------------

def to_json(data: Any) -> Any:
    """Records (alone, or in lists and dicts) as plain JSON data, derived fields included."""
    if hasattr(data, "to_json"):
        return data.to_json()
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.asdict(data)
    if isinstance(data, (list, tuple)):
        return [to_json(item) for item in data]
    if isinstance(data, dict):
        return {key: to_json(value) for key, value in data.items()}
    return data


def dumps(data: Any, **options: Any) -> str:
    """Standard JSON text of records or plain data: a NaN or infinity is a ValueError here,
    not a file other tools cannot parse."""
    return json.dumps(to_json(data), allow_nan=False, **options)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def parse_json(text: str, source: str) -> Any:
    """JSON text as data, or ConfigError naming `source` (NaN and Infinity are refused)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc})") from None


def from_json(cls: type[R], data: Any, source: str) -> R:
    """A record of type `cls` from parsed JSON, through the config's converter (ConfigError
    naming `source` and the key when it does not fit); derived fields are dropped first."""
    if isinstance(data, dict):
        derived = getattr(cls, "DERIVED", ())
        data = {k: v for k, v in data.items() if k not in derived}
    return convert(cls, data, "", source)


_skipped: set[str] = set()


def read_lines(path: Path, parse: Callable[[str, str], R],
               keep: Callable[[str], bool] | None = None) -> list[R]:
    """The records of a JSON-lines file that many jobs append to, in order: `parse(line,
    source)` each. A line that is not a record (a torn last line of a job killed mid-write,
    a line from another tool) is skipped with one log line naming the file and line, once
    per command. With `keep`, only the lines it accepts are parsed."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(lines, 1):
        if keep is not None and not keep(line):
            continue
        try:
            records.append(parse(line, f"{path}:{number}"))
        except ConfigError as exc:
            if str(exc) not in _skipped:  # one command reads a log more than once
                _skipped.add(str(exc))
                log.warning("skipping %s", exc)
    return records


def parse_first_step(line: str, source: str) -> FirstStep:
    return from_json(FirstStep, parse_json(line, source), source)


def read_record(cls: type[R], path: Path) -> R | None:
    """The record in the file at `path`, or None (logged in one line naming the file and
    what is wrong) when it is unreadable or not a `cls`: one bad file among many (a job
    killed while writing, a file from another version) never stops the reader."""
    try:
        return from_json(cls, parse_json(path.read_text(errors="replace"), str(path)),
                         str(path))
    except OSError as exc:
        log.warning("skipping %s: cannot read it (%s)", path, exc.strerror)
    except ConfigError as exc:
        log.warning("skipping %s", exc)
    return None
