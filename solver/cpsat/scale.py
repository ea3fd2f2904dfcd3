"""Integer scaling of every CP-SAT coefficient of the package (level one, level two, the LNS): the one place where
it is defined, so that the three models and the numbers read back from them agree to the unit."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt


class Scale:
    """Integer scaling of every CP-SAT coefficient: the one place where it is defined.

    Times in units of 0.1 ns (floored: the model's loads never exceed the true ones, so its bound stays valid, and
    ten thousand floored terms still sum to within 1 µs of the truth);
    memory in KiB (item sizes ceiled, capacities floored: a model-feasible plan never overfills a GPU).
    """

    TIME_PER_MS = 10_000_000
    BYTES_PER_UNIT = 1024

    @classmethod
    def time(cls, ms: float) -> int:
        return math.floor(ms * cls.TIME_PER_MS)

    @classmethod
    def times(cls, ms: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """:meth:`time` of every element."""
        return np.floor(np.asarray(ms, dtype=np.float64) * cls.TIME_PER_MS).astype(np.int64)

    @classmethod
    def sizes(cls, nbytes: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """:meth:`size` of every element."""
        return np.ceil(np.asarray(nbytes, dtype=np.float64) / cls.BYTES_PER_UNIT).astype(np.int64)

    @classmethod
    def ms(cls, units: float) -> float:
        return units / cls.TIME_PER_MS

    @classmethod
    def size(cls, nbytes: int | float) -> int:
        return math.ceil(nbytes / cls.BYTES_PER_UNIT)

    @classmethod
    def capacity(cls, nbytes: int | float) -> int:
        return math.floor(nbytes / cls.BYTES_PER_UNIT)
