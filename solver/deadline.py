"""One deadline for a whole solve: every phase (candidates, greedy, target packing, the model, CP-SAT, level two,
the LNS, pricing and checking the plan) reads the same clock.

A :class:`Deadline` is made once, when the solve starts, from ``SolveParams.time_limit_s``, and passed down. Long
Python loops call :meth:`Deadline.expired` every few iterations (it is one clock read); a CP-SAT call gets
``min(its share, deadline.remaining() - what the finish needs)``. The clock is :func:`time.monotonic`: a wall clock
that never jumps, so a loaded machine (other processes taking the cores) uses up the limit as an idle one does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class DeadlineExpired(Exception):
    """Raised by :meth:`Deadline.check` where a phase cannot stop half-way with a usable answer; the phase's caller
    catches it and answers with what it has."""


class Deadline:
    """The end of a solve, ``seconds`` after it was made (``math.inf``: never)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.start = clock()
        self.seconds = seconds
        self.end = self.start + seconds

    @classmethod
    def never(cls) -> Deadline:
        return cls(math.inf)

    def remaining(self) -> float:
        """Seconds left, never below zero."""
        return max(0.0, self.end - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.clock() >= self.end

    def check(self) -> None:
        """Raise :class:`DeadlineExpired` when the time is up."""
        if self.expired():
            raise DeadlineExpired(f"the time limit of {self.seconds:g} s ran out")

    def before(self, seconds: float) -> Deadline:
        """A deadline ``seconds`` earlier than this one (time kept back for a later phase); same start and clock."""
        out = Deadline.__new__(Deadline)
        out.clock, out.start, out.seconds = self.clock, self.start, self.seconds - seconds
        out.end = self.end - seconds
        return out

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and ``seconds`` from now (a phase's share)."""
        out = self.before(0.0)
        out.end = min(self.end, self.clock() + seconds)
        out.seconds = out.end - out.start
        return out
