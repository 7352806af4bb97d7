"""The files jaxwarm writes and reads back, one typed record each: the init report (with its
function records and warnings), verify's verdicts, the lines of the cache's usage log.

The schema only: how a record becomes JSON text and back, within caps, leniently per record
where many jobs write one file, is `jaxwarm.core.jsonio`. Types come from the annotations,
so a file with a missing key or a wrong type is one line naming the file (and line) and the
key (`parse_usage_line`).

Pure: both the submit side and the code inside a job import it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jaxwarm.core.errors import ConfigError
from jaxwarm.core.jsonio import from_json, parse_json
from jaxwarm.core.warmth import NO_STEP, compiled_a_step, prewarmed_outcomes, ran_no_step, warmth
from jaxwarm.core.words import plural

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
PREWARM_FORGOTTEN = "prewarm_forgotten"  # a miss made the run forget its prewarm record


@dataclass(frozen=True)
class ReportWarning:
    """Something a job did that costs its hits, said once: `kind` for code to match on,
    `text` for the user."""

    kind: str
    text: str


@dataclass(frozen=True)
class InputLeaf:
    """One input of a compiled program, as JAX lowered it (`jaxwarm.jaxkey.inputs`):
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
    differ (`jaxwarm.core.inputdiff.input_differences`). Static arguments are baked into
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
    # The process-global JAX settings in force at its lowering (jaxwarm.jaxkey.globalopts).
    global_options: dict[str, str] = field(default_factory=dict)
    # Why JAX did not write the entry of this miss, in its words (process 0; None if it did).
    not_stored: str | None = None
    # Why JAX could not load the entry of this miss that was in the cache (process 0 read it
    # in full after the miss: `jaxwarm.job.start.books.note_missed_entries`); None otherwise.
    not_loaded: str | None = None
    # Why the entry of this miss had been quarantined (before the job started, by the
    # launch's pre-run check, or right before JAX's read: `note_missed_entries`); None
    # otherwise.
    quarantined: str | None = None
    # A lookup of JAX's PGLE-optimized executable (jaxwarm.jaxkey.pgle): the profile-guided
    # second compile, or its load at a restart; not the function's first compile.
    pgle_optimized: bool = False
    # A training job's lookup of a function a prewarm (its run's, else another's:
    # `Manifest.compared`) recorded, by name: what its label counts and the report headlines.
    prewarmed: bool = False
    # Of a prewarmed function that missed: how its inputs differ from the prewarm's, one
    # line each (`jaxwarm.core.inputdiff.input_differences`); empty: they are equal, so the
    # program itself differs; None: not compared (the prewarm recorded no inputs).
    input_changes: list[str] | None = None
    compared_with: str | None = None  # of a prewarmed function: the compared entry's key


# The init phases' names (`jaxwarm.job.record.phases` times them).
IMPORTS = "imports"  # interpreter start and imports, up to jaxwarm's hook
DISTRIBUTED = "distributed"  # jax.distributed initialisation
TRACE = "trace"  # Python tracing to a jaxpr (JAX's jaxpr_trace_duration)
LOWER = "lower"  # jaxpr to MLIR module (JAX's jaxpr_to_mlir_module_duration)
COMPILE = "compile"  # XLA backend compile on a miss (JAX's backend_compile_duration)
LOAD = "cache load"  # the same span on a hit: lookup, read, deserialization
PREDICT = "key prediction"  # jaxwarm's key probe (verify, the prewarm's warm check)
RANKS_WAIT = "waiting for ranks"  # at the ranks' meetings (job.ranks), for ranks compiling
FIRST_STEP = "first step"  # from the end of the step's compile or load to the first step
OTHER = "other"  # what no timer covers: the trainer's own Python work, data, checkpoints
TRAINER_INIT = "the trainer's own init"  # shown: "other" the ledger named (report.read)
# The order phases are shown in: roughly the order they happen.
ORDER = (IMPORTS, DISTRIBUTED, TRACE, LOWER, PREDICT, COMPILE, LOAD, RANKS_WAIT, FIRST_STEP,
         TRAINER_INIT, OTHER)


@dataclass(frozen=True)
class InitPhase:
    """Part of a process's time to first step (`jaxwarm.job.record.phases`): `phase` is one of
    imports, distributed, trace, lower, key prediction, compile, cache load, first step,
    other; `function` the JAX module it was spent on (trace, lower, compile, cache load)."""

    phase: str
    seconds: float
    function: str | None = None


@dataclass(frozen=True)
class Staging:
    """What node-local staging (`cache.stage`) gave one process of a training job: in its
    init report, and the stager's own in `<run dir>/stage/<attempt>-n<node>.json`, which the
    node's other processes wait for (`jaxwarm.job.stage`)."""

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


# What became of an executable the prefetch loaded (`jaxwarm.job.prefetch`).
USED = "used"  # the trainer's lookup got it
UNUSED = "not asked for by the first step, released"  # init ended before its lookup
OVER_CAP = "over cache.prefetch_max_size (not loaded)"
NOT_LOADED = "not loaded"  # "not loaded: <why>": no load ran, or it failed


@dataclass
class Prefetched:
    """One executable a training job loaded ahead of the trainer's lookup: in its report."""

    function: str
    key: str
    # USED, UNUSED, OVER_CAP, "not used: <why>" (the lookup took JAX's path), NOT_LOADED...
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
    """What the init ledger's stack sampling (`jaxwarm.job.record.ledger`) cost one process."""

    # The first samples' interval (later ones are further apart: the ledger's `spacing`).
    interval_s: float
    samples: int
    # The CPU time sampling took up to the first step: the samples' stack walks on the
    # main thread and the timer thread's own.
    cost_s: float


@dataclass
class InitReport:
    """What the persistent cache did during one process's init:
    `reports/<job>-r<restart>-p<process>.json` (`jaxwarm.core.rundir.report_path`)."""

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
    # Time this process waited at meetings for the other ranks (jaxwarm.job.ranks): what
    # a rank that loaded spends while others compile, instead of timing out in a collective.
    ranks_wait_s: float = 0.0
    # "trainer" (mark_first_step) or the prewarmed function whose first execution ended it.
    first_step_from: str | None = None
    # How many functions the run's prewarm recorded, as a training job knew them: one that
    # looked up none of them ran no step (`ran_no_step`).
    run_prewarmed: int = 0
    judged_warm: int = 0  # a prewarm job's targets judged WARM: never compiled, looked up
    # The jaxwarm-owned variables this process ran with: equal across jobs and restarts.
    environment: dict[str, str] = field(default_factory=dict)
    functions: list[FunctionRecord] = field(default_factory=list)
    warnings: list[ReportWarning] = field(default_factory=list)
    # Node-local staging of the cache (training jobs with `cache.stage`); None without it.
    stage: Staging | None = None
    # Seconds this process waited for jaxwarm's locks, by kind (manifest, usage log, compile
    # of a key, JAX cache ...): `jaxwarm.core.files.lock_waits`.
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
    # verify --trainer: not answered (looked up after where it stopped): neither WARM nor COLD.
    unknown: bool = False


# verify --trainer: the key of a prewarmed function the trainer never looked up (it ended
# first, or the time limit came), and why one it would look up later is unknown.
NOT_LOOKED_UP = "-"
AFTER_FIRST_STEP = "first called after the first step"


def not_looked_up(functions: list[str], why: str, unknown: bool = False) -> list[Verdict]:
    """verify --trainer's answer for the functions it never looked up: COLD, or `unknown`."""
    return [Verdict(function=name, key=NOT_LOOKED_UP, warm=False, lower_s=0.0, predict_s=0.0,
                    explanation=[why], unknown=unknown) for name in sorted(functions)]


@dataclass(frozen=True)
class VerifyResult:
    """The verify job's answer for the run: `verify/p0.json` (`rundir.verify_result_path`)."""

    process_index: int
    functions: list[Verdict]
    # verify --trainer: what the answer cost, seconds from the trainer's start to its last
    # prewarmed function's lookup (or to the time limit).
    trainer_s: float | None = None
    # Which verify wrote it (`environment.VERIFY_INVOCATION`, fresh for each): the command
    # answers only from its own job's result, never from one an earlier verify left.
    invocation: str = ""

    @property
    def warm(self) -> bool:
        return all(verdict.warm for verdict in self.functions)


# -- deciding whether a launch needs its prewarm job -----------------------------------------

@dataclass(frozen=True)
class Fingerprint:
    """Everything the launcher can know, before any job, that enters the cache keys of a
    run's step (`jaxwarm.submit.fingerprint`): `parts` by name (versions as they are, the
    rest as short hashes), `files` the hash of each source file the step factory's module
    reaches, `digest` the hash of both; `variables` a hash of each environment variable that
    can enter a key (`jaxwarm.core.environment.key_variable`), to name the ones that differ."""

    digest: str
    parts: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)
    # The files the step factory read while it built the step, by path -> signature: the
    # prewarm job records them (`jaxwarm.job.record.reads`); the login node cannot know them.
    reads: dict[str, str] = field(default_factory=dict)


def listed(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def differences(old: Fingerprint, new: Fingerprint) -> list[str]:
    """What changed between two fingerprints, in words (`jax 0.10.2 -> 0.8.3`, `source:
    jaxwarm/workload/model.py changed; adapter.py read now`)."""
    lines = []
    for name in sorted(set(old.parts) | set(new.parts)):
        before, after = old.parts.get(name), new.parts.get(name)
        if before == after:
            continue
        if name == "source":  # another run's step may read other files: not "changed"
            changed = sorted(path for path in set(old.files) & set(new.files)
                             if old.files[path] != new.files[path])
            added = sorted(set(new.files) - set(old.files))
            gone = sorted(set(old.files) - set(new.files))
            lines.append("source: " + "; ".join(
                f"{listed(paths)} {what}" for paths, what in
                [(changed, "changed"), (added, "read now"), (gone, "no longer read")] if paths))
        elif name == "environment" and old.variables and new.variables:
            changed = sorted(variable for variable in set(old.variables) | set(new.variables)
                             if old.variables.get(variable) != new.variables.get(variable))
            lines.append(f"environment: {', '.join(changed)} "
                         f"{plural(len(changed), 'differs', 'differ')}" if changed
                         else "environment differs")
        elif name in ("jax", "jaxlib", "python", "backend"):
            lines.append(f"{name} {before} -> {after}")
        elif name == "entrypoint":
            lines.append("entrypoint differs (the trainer's command line, which the step "
                         "factory reads)" if before and after else
                         "the step factory reads the trainer's command line" if after else
                         "the step factory no longer reads the trainer's command line")
        else:
            lines.append(f"{name} differs")
    return lines


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
    """What one rank is doing, and since when (`jaxwarm.job.ranks`): the rank that
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


def parse_first_step(line: str, source: str) -> FirstStep:
    return from_json(FirstStep, parse_json(line, source), source)
