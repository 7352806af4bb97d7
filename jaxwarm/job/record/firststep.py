"""When a training process's first step ended: the trainer says so (`mark_first_step()`), or
jaxwarm finds it, for a trainer that never does.

Found, it is the first execution of a step a prewarm recorded (this run's, or any run's on
this layout: the same name and abstract signature), or, with no prewarmed step on record, a
guess: the function with the largest inputs so far (the train step takes the whole state;
init and eval take less), replaced by a later one with larger inputs. A better-founded
finding replaces a worse one, whenever it comes (`Found`). The recorder
(`jaxwarm.job.record.recorder`) hands each compiled function to `watch` and is told the
finding (`InitRecorder.first_step_found`); the finder keeps no report of its own.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from jaxwarm.core.records import FunctionRecord
from jaxwarm.job.record.ledger import spacing

if TYPE_CHECKING:
    from jaxwarm.job.record.recorder import InitRecorder

FIRST_STEP_POLL_S = 0.005
# At exit, how long a watcher may still take to see the execution it waits on end.
WATCHER_JOIN_S = 60.0


class Found(enum.IntEnum):
    """How the first step's end was found, from least to best founded: a better-founded
    finding replaces a worse one, whenever it comes."""

    NONE = 0
    # No prewarm of a step on record: the function with the largest inputs is taken for the
    # step (the train step takes the whole state; init and eval take less), and replaced by
    # a later one with larger inputs.
    LARGEST_INPUTS = 1
    # A function a prewarm (of any run, on this layout) recorded as a step.
    PREWARMED_STEP = 2
    TRAINER = 3  # mark_first_step()


class FirstStepFinder:
    """Finds the end of one process's first step for its recorder."""

    def __init__(self, recorder: InitRecorder):
        self.recorder = recorder
        # (name, abstract signature) of the functions a prewarm recorded as steps, with the
        # run whose prewarm recorded it, whose first execution ends the first step (as does
        # that of a lookup marked as one of this run's prewarmed steps, whatever its
        # inputs); and whether, until one of them has, the function with the largest
        # inputs is taken for the step (`expect`: a training job).
        self.step_functions: dict[tuple[str, str | None], str] = {}
        self.guess = False
        # Each function's input elements, from JAX's lowering line (the recorder's reading).
        self.input_elements: dict[str, int] = {}
        self._lock = threading.Lock()
        self._found = Found.NONE
        self._watching_step = False
        self._guess: tuple[int, int] = (0, -1)  # (serial, input elements) of the candidate
        self._marking = threading.Lock()
        self._watchers: list[threading.Thread] = []
        self._closing = threading.Event()
        # The threads now waiting at a ranks' meeting (`waiting_for_ranks`), and their end.
        self._meeting: set[int] = set()
        self._met = threading.Condition()

    def expect(self, step_functions: dict[tuple[str, str | None], str]) -> None:
        """A training job's steps, as the prewarms recorded them; and, until one of them has
        run, the function with the largest inputs is taken for the step."""
        self.step_functions = step_functions
        self.guess = True

    @contextmanager
    def meeting(self) -> Iterator[None]:
        """The calling thread waits at the ranks' meeting: a watcher of a program this thread
        compiled pauses meanwhile (`_wait_first_execution`)."""
        thread = threading.get_ident()
        with self._met:
            self._meeting.add(thread)
        try:
            yield
        finally:
            with self._met:
                self._meeting.discard(thread)
                self._met.notify_all()

    def _candidate(self, record: FunctionRecord) -> tuple[Found, str] | None:
        """Whether the end of this function's first execution would be the first step, how
        well founded that is, and how to say it (`first_step_from`)."""
        name = record.name
        with self._lock:
            if self._found >= Found.PREWARMED_STEP or self._watching_step:
                return None
            run = next((run for (known, signature), run in self.step_functions.items()
                        if name == known and signature in (None, record.signature)), None)
            own = self.recorder.prewarmed.get(name)
            if run is None and record.prewarmed and own is not None and own.is_step:
                run = own.run
            if run is not None:
                self._watching_step = True
                return Found.PREWARMED_STEP, (f"the first execution of {name}, a step the "
                                              f"prewarm of run {run!r} recorded")
            size = self.input_elements.get(name, 0)
            if not self.guess or size <= self._guess[1]:
                return None
            self._guess = (self._guess[0] + 1, size)
            why = "no prewarmed step has run yet" if self.step_functions else \
                "no prewarm of a step on record"
            return Found.LARGEST_INPUTS, (
                f"the first execution of {name}, the function with the largest inputs so far "
                f"({why}; mark_first_step() says it exactly)")

    def watch(self, record: FunctionRecord) -> None:
        """Wait for the first execution of the function just compiled when it ends the first
        step (`_candidate`), for a trainer that never calls mark_first_step().

        The compile just finished returns to a call that executes the function at once, so
        the arrays that appear after it are its outputs (or the transfers of its inputs,
        then its outputs); its execution has ended when they are ready.
        """
        candidate = self._candidate(record)
        if candidate is None:
            return
        import jax

        before = {id(array) for array in jax.live_arrays()}
        watcher = threading.Thread(target=self._wait_first_execution,
                                   args=(*candidate, record.name, self._guess[0], before,
                                         threading.get_ident()),
                                   name="jaxwarm-first-step", daemon=True)
        self._watchers.append(watcher)
        watcher.start()

    def _superseded(self, found: Found, serial: int) -> bool:
        return self._found > found or (found == Found.LARGEST_INPUTS and
                                       serial != self._guess[0])

    def _wait_first_execution(self, found: Found, source: str, name: str, serial: int,
                              before: set[int], compiler: int) -> None:
        """Poll for the arrays of the function's first execution, except while the thread
        that compiled it waits at the ranks' meeting: the program cannot run before that
        ends, and the meeting can last as long as the slowest rank's compile (tens of
        seconds at 32 ranks on this machine, where 200 polls a second cost every rank CPU that
        the others' compiles needed)."""
        import jax

        fresh: list[Any] = []
        start = time.monotonic()
        while not fresh:
            if self._superseded(found, serial) or self._closing.is_set():
                return  # the trainer said, a better-founded candidate came, or the end
            with self._met:
                self._met.wait_for(lambda: compiler not in self._meeting or
                                   self._closing.is_set())
            # On CPU a call may execute before it returns (its arrays appear only then, after
            # a collective has waited for every rank): polls spaced with the wait.
            time.sleep(spacing(FIRST_STEP_POLL_S, time.monotonic() - start))
            fresh = [a for a in jax.live_arrays() if id(a) not in before]
        # One more look: the call may transfer uncommitted inputs just before it dispatches.
        time.sleep(FIRST_STEP_POLL_S)
        before.update(id(array) for array in fresh)
        fresh += [a for a in jax.live_arrays() if id(a) not in before]
        for array in fresh:
            try:
                array.block_until_ready()
            except RuntimeError:
                # Donated to (or deleted by) a call since it appeared, e.g. a state the
                # trainer's step consumed: it was ready, or that call would not have run.
                continue
        self.mark(found, source, serial, name)

    def mark(self, found: Found, source: str, serial: int = 0,
             function: str | None = None) -> None:
        """The first step ends now (with the first execution of `function`, when jaxwarm
        detected it): said once by the trainer or a prewarmed step, while a guess
        (`Found.LARGEST_INPUTS`) is replaced by a later one with larger inputs."""
        final = found != Found.LARGEST_INPUTS
        # One mark at a time, the books' included: the trainer's and a watcher's may come at
        # once, and what the books record must end with the one that stands.
        with self._marking:
            with self._lock:
                if self._superseded(found, serial) or (self._found == found and final):
                    return
                self._found = found
            # The functions whose compile or load ends before the first step: the one whose
            # first execution was detected, else the prewarmed steps.
            steps = {function} if function is not None else \
                {name for name, _ in self.step_functions}
            self.recorder.first_step_found(time.time(), source, steps, final=final)
        if final:
            self.recorder.end_init()

    def close(self) -> None:
        """At the end of the process: stop waiting for first executions (a watcher still
        inside JAX when the interpreter ends would abort the process)."""
        self._closing.set()
        with self._met:
            self._met.notify_all()
        for watcher in self._watchers:
            watcher.join(timeout=WATCHER_JOIN_S)
