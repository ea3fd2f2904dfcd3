"""One deadline for a whole solve: every phase (candidates, greedy, target packing, the model, CP-SAT, level two,
the LNS, pricing and checking the plan) reads the same clock.

A :class:`Deadline` is made once, when the solve starts, from ``SolveParams.time_limit_s``, and passed down. Long
Python loops call :meth:`Deadline.expired` every few iterations (it is one clock read); a CP-SAT call gets
``min(its share, deadline.remaining() - what the finish needs)``. The clock is :func:`time.monotonic`: a wall clock
that never jumps, so a loaded machine (other processes taking the cores) uses up the limit as an idle one does.

Where two phases run at once (the CP-SAT run's configuration bound beside its search), the one that finishes with
an answer that ends the other's work stops it early: :meth:`Deadline.stoppable` gives a deadline that
:meth:`Deadline.stop` ends at once, for it and every deadline derived from it (:meth:`before`, :meth:`within`), from
any thread; a CP-SAT call under it registers its solver's ``stop_search`` with :meth:`Deadline.stopping`.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator


class DeadlineExpired(Exception):
    """Raised by :meth:`Deadline.check` where a phase cannot stop half-way with a usable answer; the phase's caller
    catches it and answers with what it has."""


class _Stop:
    """One early end shared by a stoppable deadline and those derived from it: a flag, and what to call when it is
    set (a running CP-SAT search's ``stop_search``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stopped = False
        self.hooks: list[Callable[[], None]] = []

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            hooks, self.hooks = self.hooks, []
        for hook in hooks:
            hook()

    def add(self, hook: Callable[[], None]) -> None:
        with self.lock:
            if not self.stopped:
                self.hooks.append(hook)
                return
        hook()

    def discard(self, hook: Callable[[], None]) -> None:
        with self.lock:
            if hook in self.hooks:
                self.hooks.remove(hook)


class Deadline:
    """The end of a solve, ``seconds`` after it was made (``math.inf``: never)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.start = clock()
        self.seconds = seconds
        self.end = self.start + seconds
        self.stops: tuple[_Stop, ...] = ()  # early ends: this deadline's and those of the deadlines it came from

    @classmethod
    def never(cls) -> Deadline:
        return cls(math.inf)

    def stopped(self) -> bool:
        """Whether :meth:`stop` ended this deadline (or one it was derived from) early."""
        return any(s.stopped for s in self.stops)

    def remaining(self) -> float:
        """Seconds left, never below zero."""
        return 0.0 if self.stopped() else max(0.0, self.end - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.stopped() or self.clock() >= self.end

    def check(self) -> None:
        """Raise :class:`DeadlineExpired` when the time is up."""
        if self.stopped():
            raise DeadlineExpired("stopped early: another phase's answer ended this one's work")
        if self.expired():
            raise DeadlineExpired(f"the time limit of {self.seconds:g} s ran out")

    def stoppable(self) -> Deadline:
        """This deadline, which :meth:`stop` can also end at once (and every deadline derived from the copy)."""
        out = self.before(0.0)
        out.stops = (*self.stops, _Stop())
        return out

    def stop(self) -> None:
        """End now, from any thread, the deadline of the latest :meth:`stoppable` this one comes from (itself, or
        the one it was derived from) and every deadline derived from that; the ones it came from run on."""
        if not self.stops:
            raise ValueError("this deadline was not made stoppable (Deadline.stoppable)")
        self.stops[-1].stop()

    @contextlib.contextmanager
    def stopping(self, hook: Callable[[], None]) -> Iterator[None]:
        """Within the block, :meth:`stop` (of this deadline or one it came from) also calls ``hook`` — a running
        search's ``stop_search``; called at once if it was stopped already."""
        for s in self.stops:
            s.add(hook)
        try:
            yield
        finally:
            for s in self.stops:
                s.discard(hook)

    def before(self, seconds: float) -> Deadline:
        """A deadline ``seconds`` earlier than this one (time kept back for a later phase); same start and clock."""
        out = Deadline.__new__(Deadline)
        out.clock, out.start, out.seconds = self.clock, self.start, self.seconds - seconds
        out.end = self.end - seconds
        out.stops = self.stops
        return out

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and ``seconds`` from now (a phase's share)."""
        out = self.before(0.0)
        out.end = min(self.end, self.clock() + seconds)
        out.seconds = out.end - out.start
        return out
