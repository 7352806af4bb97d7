"""The files jaxwarm writes and reads back, one typed record each: the init report (with its
function records and warnings), verify's verdicts, the lines of the cache's usage log.

Written with `to_json`/`dumps`, read back through `jaxwarm.launcher.decode.convert`, the converter
that reads the config and the manifest: types come from the annotations, so a file with a
missing key or a wrong type is one line naming the file (and line) and the key. Readers of
files that many jobs write are lenient per record (`read_record`, `parse_usage_line`): a bad
report or usage line is skipped with that line logged, never fatal to the command reading
the others. Every file is read within a cap (`jaxwarm.launcher.files`: a regular file, never a link
to /dev/zero or a FIFO) and every JSON text within a nesting cap (`load_json`). Output is
standard JSON: no NaN or Infinity, which other tools cannot read.

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

from jaxwarm.launcher.decode import convert
from jaxwarm.launcher.errors import ConfigError
from jaxwarm.launcher.files import RefusedFile, read_bounded, stream_lines

log = logging.getLogger("jaxwarm.records")

R = TypeVar("R")

# The run's three jobs, by the names their records, reports and dirs use.
PREWARM, VERIFY, TRAIN = "prewarm", "verify", "train"

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


@dataclass(frozen=True)
class InputLeaf:
    """One input of a compiled program, as JAX lowered it (`jaxwarm.launcher.jaxkey.inputs`):
    `path` the argument's pytree path as JAX names it (`state['params']['embed']`; empty
    for a constant JAX hoisted), `type` its global type (`f32[256,64]`, `weak f32[]` for a
    weak-typed Python scalar), `sharding` as the program says it (None: unspecified), and
    whether it is donated."""

    path: str
    type: str
    sharding: str | None = None
    donated: bool = False


@dataclass(frozen=True)
class InputSignature:
    """Every input of a compiled program, in order (the arguments JAX kept: unused ones are
    pruned), and the meshes its shardings name (`mesh` -> `["data"=2, "fsdp"=4]`): what
    a prewarm records of each target, so that a run that misses it can say which inputs
    differ (`jaxwarm.launcher.store.misses.input_differences`). Static arguments are baked into
    the program, not inputs: a change in one shows as equal inputs and another program."""

    leaves: list[InputLeaf] = field(default_factory=list)
    meshes: dict[str, str] = field(default_factory=dict)


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
    # The process-global JAX settings in force at its lowering (jaxwarm.launcher.jaxkey.globalopts).
    global_options: dict[str, str] = field(default_factory=dict)
    # Why JAX did not write the entry of this miss, in its words (process 0; None if it did).
    not_stored: str | None = None
    # Why JAX could not load the entry of this miss that was in the cache (process 0 read it
    # in full after the miss: `jaxwarm.launcher.injob.books.note_missed_entries`); None otherwise.
    not_loaded: str | None = None
    # A lookup of JAX's PGLE-optimized executable (jaxwarm.launcher.jaxkey.pgle): the profile-guided
    # second compile, or its load at a restart; not the function's first compile.
    pgle_optimized: bool = False
    # A training job's lookup of a function a prewarm recorded (by name, whatever its inputs
    # now): its run's, else another run's (`jaxwarm.launcher.store.misses.compared_prewarms`):
    # what the attempt's label counts, and what the report headlines.
    prewarmed: bool = False
    # Of a prewarmed function that missed: how its inputs differ from the prewarm's, one
    # line each (`jaxwarm.launcher.store.misses.input_differences`); empty: they are equal, so the
    # program itself differs; None: not compared (the prewarm recorded no inputs).
    input_changes: list[str] | None = None
    # Of a prewarmed function: the key of the prewarm's entry it was compared with.
    compared_with: str | None = None


@dataclass(frozen=True)
class InitPhase:
    """Part of a process's time to first step (`jaxwarm.launcher.injob.phases`): `phase` is one of
    imports, distributed, trace, lower, key prediction, compile, cache load, first step,
    other; `function` the JAX module it was spent on (trace, lower, compile, cache load)."""

    phase: str
    seconds: float
    function: str | None = None


@dataclass(frozen=True)
class Staging:
    """What node-local staging (`cache.stage`) gave one process of a training job: in its
    init report, and the stager's own in `<run dir>/stage/<attempt>-n<node>.json`, which the
    node's other processes wait for (`jaxwarm.launcher.injob.stage`)."""

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


# What became of an executable the prefetch loaded (`jaxwarm.launcher.injob.prefetch`).
USED = "used"  # the trainer's lookup got it
UNUSED = "never asked for (released)"  # init ended before any lookup of its key
OVER_CAP = "over cache.prefetch_max_size (not loaded)"


@dataclass
class Prefetched:
    """One executable a training job loaded ahead of the trainer's lookup: in its report."""

    function: str
    key: str
    # USED, UNUSED, OVER_CAP, "not used: <why>" (the lookup took JAX's normal path) or
    # "not loaded: <why>".
    outcome: str
    # Its serialized bytes (what the prefetch held), and the background load's seconds.
    size: int = 0
    load_s: float = 0.0
    # How long the trainer's lookup waited for the load to finish.
    waited_s: float = 0.0


@dataclass
class PrefetchReport:
    """What `cache.prefetch` did in one process."""

    started_s: float  # seconds from the process's start
    max_size: int
    # The most serialized bytes held at once.
    peak_bytes: int = 0
    executables: list[Prefetched] = field(default_factory=list)


@dataclass(frozen=True)
class Sampling:
    """What the init ledger's stack sampling (`jaxwarm.launcher.injob.ledger`) cost one process."""

    # The first samples' interval (later ones are further apart: the ledger's `spacing`).
    interval_s: float
    samples: int
    # The CPU time sampling took up to the first step: the samples' stack walks on the
    # main thread and the timer thread's own.
    cost_s: float


@dataclass
class InitReport:
    """What the persistent cache did during one process's init:
    `reports/<job>-r<restart>-p<process>.json` (`jaxwarm.launcher.rundir.report_path`)."""

    # Written for the reader's convenience, recomputed from the rest when read back.
    DERIVED: ClassVar[tuple[str, ...]] = ("misses", "over_budget", "label", "first_step_s")

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
    # Time this process waited at meetings for the other ranks (jaxwarm.launcher.injob.ranks): what
    # a rank that loaded spends while others compile, instead of timing out in a collective.
    ranks_wait_s: float = 0.0
    # "trainer" (mark_first_step) or the prewarmed function whose first execution ended it.
    first_step_from: str | None = None
    # How many functions the run's prewarm recorded, as a training job knew them: one that
    # looked up none of them ran no step (`ran_no_step`).
    run_prewarmed: int = 0
    # The jaxwarm-owned variables this process ran with: equal across jobs and restarts.
    environment: dict[str, str] = field(default_factory=dict)
    functions: list[FunctionRecord] = field(default_factory=list)
    warnings: list[ReportWarning] = field(default_factory=list)
    # Node-local staging of the cache (training jobs with `cache.stage`); None without it.
    stage: Staging | None = None
    # Seconds this process waited for jaxwarm's locks, by kind (manifest, usage log, compile
    # of a key, JAX cache ...): `jaxwarm.launcher.files.lock_waits`.
    lock_wait_s: dict[str, float] = field(default_factory=dict)
    # Where the time to first step went; they add up to it (empty before the first step).
    phases: list[InitPhase] = field(default_factory=list)
    # The executables loaded ahead of the trainer's lookups (`cache.prefetch`); None: none.
    prefetch: PrefetchReport | None = None
    # The init ledger's sampling of the main thread ("other" by owner); None: not sampled.
    sampling: Sampling | None = None

    @property
    def misses(self) -> int:
        return self.lookups - self.hits

    @property
    def first_step_s(self) -> float | None:
        """The time to first step, None where the process ran no step (`ran_no_step`: the
        recorder's guess then timed some other function)."""
        hit, missed = prewarmed_outcomes(self.functions)
        return None if ran_no_step(self.run_prewarmed, hit, missed, self.first_step_from,
                                   compiled_a_step(self.functions)) else self.time_to_first_step_s

    @property
    def over_budget(self) -> bool:
        return self.first_step_s is not None and self.first_step_s > self.init_budget_s

    @property
    def label(self) -> str:
        """What a training attempt's process was: warm, partly warm or cold (`warmth`), or
        NO_STEP; empty for a prewarm or verify job, whose lookups are not a start."""
        if self.job != TRAIN:
            return ""
        hit, missed = prewarmed_outcomes(self.functions)
        if ran_no_step(self.run_prewarmed, hit, missed, self.first_step_from,
                       compiled_a_step(self.functions)):
            return NO_STEP
        return warmth(hit, missed, self.hits, self.lookups)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self),
                **{name: getattr(self, name) for name in self.DERIVED}}


def prewarmed_outcomes(functions: list[FunctionRecord]) -> tuple[list[str], dict[str, float]]:
    """The prewarmed functions a process looked up, by name, each decided by its first
    lookup (a later compile of other shapes, after the first step, is not the start's):
    those that hit, and those that missed with their compile seconds."""
    hit: list[str] = []
    missed: dict[str, float] = {}
    for fn in functions:
        if fn.prewarmed and fn.key is not None and fn.name not in hit and fn.name not in missed:
            if fn.hit:
                hit.append(fn.name)
            else:
                missed[fn.name] = fn.seconds
    return hit, missed


# The label of a training process that ran no step (`ran_no_step`): neither warm nor cold.
NO_STEP = "no step run"


# JAX's default persistent-cache threshold: a compile shorter than this is a helper (a
# checkpoint restore's identity function), not a step worth caching.
STEP_COMPILE_S = 1.0


def compiled_a_step(functions: list[FunctionRecord]) -> bool:
    """Whether a process compiled (missed) anything as long as a step's compile."""
    return any(not fn.hit and fn.seconds >= STEP_COMPILE_S for fn in functions)


def ran_no_step(run_prewarmed: int, hit: list[str], missed: dict[str, float],
                first_step_from: str | None, compiled: bool) -> bool:
    """A training process of a run with prewarmed functions that looked up none of them,
    compiled nothing of a step's size (`compiled_a_step`) and was not told of a step by its
    trainer (mark_first_step) ran no step: e.g. a relaunch of a finished run, whose trainer
    resumes at its last step and trains nothing. Its lookups (a checkpoint restore's small
    helpers) say nothing of the prewarm. One that compiled a step-sized program (a step
    renamed since its prewarm, so none of the prewarmed names is looked up) ran a program
    the prewarm did not cover, and is labelled by its lookups (`cold`)."""
    return (run_prewarmed > 0 and not hit and not missed and not compiled
            and first_step_from != "trainer")


def warmth(hit: list[str], missed: dict[str, float], hits: int, lookups: int) -> str:
    """The one label of a training attempt (report table, headline, plot, status, JSON):
    `warm` only when every prewarmed function it looked up hit, `partly warm (1 of 2
    prewarmed functions hit: jit_train_step compiled 52.0 s)`, or `cold`. Without a
    prewarmed function among its lookups, `cold` when none hit, else it says that nothing
    was prewarmed, with its lookups; with no lookup at all (the cache off), nothing."""
    if not hit and not missed:
        if not lookups:
            return ""
        return "cold" if not hits else f"no prewarm on record ({hits} of {lookups} lookups hit)"
    if not missed:
        return "warm"
    if not hit:
        return "cold"
    compiled = ", ".join(f"{name} compiled {seconds:.1f} s" for name, seconds in missed.items())
    return (f"partly warm ({len(hit)} of {len(hit) + len(missed)} prewarmed functions hit: "
            f"{compiled})")


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
    # verify --trainer: seconds from the trainer's start to its lookup of this function
    # (None: lowered by the verify job through the step factory).
    reached_s: float | None = None
    # verify --trainer: not answered (first called after the trainer's first step, which it
    # stops before, or after the time limit): neither WARM nor COLD.
    unknown: bool = False


# verify --trainer: the key of a prewarmed function the trainer never looked up (it ended
# first, or the time limit came), and why one it would look up later is unknown.
NOT_LOOKED_UP = "-"
AFTER_FIRST_STEP = "first called after the first step"


@dataclass(frozen=True)
class VerifyResult:
    """The verify job's answer for the run: `verify/p0.json` (`rundir.verify_result_path`)."""

    process_index: int
    functions: list[Verdict]
    # verify --trainer: what the answer cost, seconds from the trainer's start to its last
    # prewarmed function's lookup (or to the time limit).
    trainer_s: float | None = None

    @property
    def warm(self) -> bool:
        return all(verdict.warm for verdict in self.functions)


# -- deciding whether a launch needs its prewarm job -----------------------------------------

@dataclass(frozen=True)
class Fingerprint:
    """Everything the launcher can know, before any job, that enters the cache keys of a
    run's step (`jaxwarm.launcher.submit.fingerprint`): `parts` by name (versions as they are, the
    rest as short hashes), `files` the hash of each source file the step factory's module
    reaches, `digest` the hash of both; `variables` a hash of each environment variable that
    can enter a key (`jaxwarm.launcher.environment.key_variable`), to name the ones that differ."""

    digest: str
    parts: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)
    # The files the step factory read while it built the step, by path -> content hash: the
    # prewarm job records them (`jaxwarm.launcher.injob.reads`); the login node cannot know them.
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


@dataclass(frozen=True)
class LocalJobState:
    """One job of a local launch, for `jaxwarm status`: RUNNING from its start, then how it
    ended (COMPLETED, FAILED, or STOPPED by a forwarded signal), with process 0's log."""

    name: str
    state: str
    processes: int
    log: str
    started: float = field(default_factory=time.time)
    ended: float | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class LocalLaunch:
    """The jobs of the latest local launch of a run dir, in order
    (`<run dir>/local-jobs.json`; a SLURM launch keeps `slurm/jobs.json` instead)."""

    jobs: list[LocalJobState] = field(default_factory=list)


# -- what the ranks of a job tell each other (jax.distributed's key-value store) -----------

@dataclass(frozen=True)
class RankState:
    """What one rank is doing, and since when (`jaxwarm.launcher.injob.ranks`): the rank that
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
    # The prewarmed functions the attempt looked up before it: those that hit, and those
    # that missed with their compile seconds (`prewarmed_outcomes`).
    prewarmed_hit: list[str] = field(default_factory=list)
    prewarmed_missed: dict[str, float] = field(default_factory=dict)
    run_prewarmed: int = 0  # as `InitReport.run_prewarmed`
    # Whether the attempt compiled a step-sized program (`compiled_a_step` of its report).
    compiled_a_step: bool = False

    @property
    def ran_no_step(self) -> bool:
        return ran_no_step(self.run_prewarmed, self.prewarmed_hit, self.prewarmed_missed,
                           self.first_step_from, self.compiled_a_step)

    @property
    def label(self) -> str:
        if self.ran_no_step:
            return NO_STEP
        return warmth(self.prewarmed_hit, self.prewarmed_missed, self.hits, self.lookups)


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


# No record jaxwarm writes nests a tenth as deep; Python's parser gives up near 1000 levels.
JSON_MAX_DEPTH = 64
# Every record jaxwarm keeps in a run dir (an init report, verify's result, the prewarm
# decision and progress, a node's staging note, the submitted jobs): its biggest, a report
# of thousands of functions, is far below this.
RECORD_CAP = 16 << 20


def load_json(text: str | bytes) -> Any:
    """JSON text as data, or ValueError: not JSON, NaN or Infinity (not standard JSON), or
    nested more than JSON_MAX_DEPTH levels deep (never a RecursionError)."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        level: list[Any] = [[]]
    else:
        level, depth = _containers([data]), 0
        while level and depth < JSON_MAX_DEPTH:  # level by level: no recursion here either
            depth += 1
            level = _containers([child for node in level for child in
                                 (node.values() if isinstance(node, dict) else node)])
    if level:
        raise ValueError(f"nested more than {JSON_MAX_DEPTH} levels deep")
    return data


def _containers(nodes: list[Any]) -> list[Any]:
    return [node for node in nodes if isinstance(node, (dict, list))]


def parse_json(text: str, source: str) -> Any:
    """JSON text as data, or ConfigError naming `source` (`load_json`)."""
    try:
        return load_json(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc})") from None


def from_json(cls: type[R], data: Any, source: str) -> R:
    """A record of type `cls` from parsed JSON, through the config's converter (ConfigError
    naming `source` and the key when it does not fit); derived fields are dropped first."""
    if isinstance(data, dict):
        derived = getattr(cls, "DERIVED", ())
        data = {k: v for k, v in data.items() if k not in derived}
    return convert(cls, data, "", source)


_warned: set[str] = set()


def read_lines(path: Path, parse: Callable[[str, str], R], cap: int, what: str,
               keep: Callable[[str], bool] | None = None) -> list[R]:
    """The records of a JSON-lines file that many jobs append to, in order: `parse(line,
    source)` each, streamed (`files.stream_lines`: a regular file of at most `cap` bytes).
    A line that is not a record (a torn last line of a job killed mid-write, a line from
    another tool) is skipped with one log line naming the file and line, and a file that is
    not a regular one within its cap is read as empty with one line, once per command.
    With `keep`, only the lines it accepts are parsed."""
    records = []
    try:
        for number, line in enumerate(stream_lines(path, cap, what), 1):
            if keep is not None and not keep(line):
                continue
            try:
                records.append(parse(line, f"{path}:{number}"))
            except ConfigError as exc:
                warn_once(f"skipping {exc}")
    except FileNotFoundError:
        return []
    except RefusedFile as exc:
        warn_once(f"skipping {exc}")  # the line of a refused append (`usage.append_usage`)
        return []
    except OSError as exc:
        warn_once(f"skipping {path}: cannot read it ({exc.strerror})")
        return []
    return records


def warn_once(line: str) -> None:
    """Log `line` once per process: one command (or job) reads a log, or a broken manifest,
    more than once, and says what is wrong with it once."""
    if line not in _warned:
        _warned.add(line)
        log.warning("%s", line)


def parse_first_step(line: str, source: str) -> FirstStep:
    return from_json(FirstStep, parse_json(line, source), source)


def read_record(cls: type[R], path: Path, cap: int = RECORD_CAP,
                what: str = "a jaxwarm record") -> R | None:
    """The record in the file at `path`, or None: silently when there is none, with one
    line naming the file and what is wrong when it is unreadable, not a regular file within
    `cap` bytes (`files.read_bounded`), or not a `cls`: one bad file among many (a job killed
    while writing, a file from another version, a planted link) never stops the reader."""
    try:
        return from_json(cls, parse_json(read_bounded(path, cap, what), str(path)), str(path))
    except FileNotFoundError:
        pass
    except RefusedFile as exc:
        log.warning("skipping %s", exc)
    except OSError as exc:
        log.warning("skipping %s: cannot read it (%s)", path, exc.strerror)
    except ConfigError as exc:
        log.warning("skipping %s", exc)
    return None
