r"""How often a cache hits and how many distinct rows a batch touches, under Zipf access (Che's approximation of LRU).

An LRU cache of ``k = ⌈f·r⌉`` rows under Zipf(``s``) accesses (``p_i = i^−s / H(r, s)``) keeps a row looked up in the
last ``T`` ids: ``T`` solves ``Σ_i (1 − e^(−p_i·T)) = k`` (:func:`lru_characteristic_time`), and the hit rate is
``h = Σ_i p_i·(1 − e^(−p_i·T))`` (:func:`cache_hit_rate`; uniform access: ``h = f``). The distinct rows among ``n``
ids are the same occupancy at ``T = n`` (:func:`distinct_rows`). The sums over millions of rows are the first 63
terms and a quadrature of the rest (:func:`generalized_harmonic`, :func:`_lru_sums`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from shardwise.solver.cost_model.traffic import touched_rows
from shardwise.wire.executor import cached_rows

_np: Any
try:  # the planner's numpy sums Che's terms in one call; without it (a base install) a Python loop does
    import numpy as _np
except ImportError:  # pragma: no cover - every test environment has numpy
    _np = None


@lru_cache(maxsize=4096)
def _partial_sum(n: int, s: float) -> float:
    return float(sum(float(i) ** (-s) for i in range(1, n + 1)))


def generalized_harmonic(n: float, s: float) -> float:
    """``H(n, s) = Σ_{i≤n} i^−s``: the first 63 terms summed, the rest (``i = m..n``, ``m = 64``) by Euler–Maclaurin,
    ``∫_m^n x^−s dx + (m^−s + n^−s)/2 + s/12·(m^(−s−1) − n^(−s−1))`` (relative error < 1e-9 for s ≤ 5; starting the
    expansion at ``i = 1`` instead is off by up to 12 % at s = 5)."""
    if n <= 0:
        return 0.0
    m = 64
    if n < m:
        return _partial_sum(int(n), s)
    head = _partial_sum(m - 1, s)
    log_ratio = math.log(n / m)  # ∫_m^n x^−s dx = (n^(1−s) − m^(1−s))/(1−s), → ln(n/m) as s → 1
    integral = log_ratio if s == 1 else m ** (1 - s) * math.expm1((1 - s) * log_ratio) / (1 - s)
    tail = integral + (m ** (-s) + n ** (-s)) / 2 + s / 12 * (m ** (-s - 1) - n ** (-s - 1))
    return float(head + tail)


def _gauss_legendre(n: int) -> tuple[tuple[float, float], ...]:
    """Nodes and weights of ``n``-point Gauss–Legendre quadrature on [−1, 1] (Newton on ``P_n``; no numpy needed:
    the cost model stays importable without it)."""
    out = []
    for i in range(1, n + 1):
        x = math.cos(math.pi * (i - 0.25) / (n + 0.5))
        for _ in range(100):
            p0, p1 = 1.0, x
            for k in range(2, n + 1):
                p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
            dp = n * (x * p1 - p0) / (x * x - 1)
            step = p1 / dp
            x -= step
            if abs(step) < 1e-15:
                break
        out.append((x, 2 / ((1 - x * x) * dp * dp)))
    return tuple(out)


_GL = _gauss_legendre(20)
_HEAD = 64  # rows summed term by term; the rest by quadrature in log space with Euler–Maclaurin end corrections


@lru_cache(maxsize=4096)
def _lru_terms(n: int, s: float) -> tuple[tuple[tuple[float, float, float], ...], tuple[float, float]]:
    """:func:`_lru_sums`'s terms that do not depend on ``a``: ``(w, c, c·w)`` per summed row and quadrature node
    (``w = x^−s``, ``c`` its weight: 1 for a row, the node's weight times the Jacobian ``x`` for the integral), in
    the order the sums take them, and the end-correction abscissae."""
    terms = [(i ** (-s), 1.0, i ** (-s)) for i in range(1, min(n, _HEAD - 1) + 1)]
    if n < _HEAD:
        return tuple(terms), ()  # type: ignore[return-value]
    lo, hi = math.log(_HEAD), math.log(n)
    pieces = max(1, math.ceil((hi - lo) / 2))
    width = (hi - lo) / pieces
    for p in range(pieces):
        mid = lo + (p + 0.5) * width
        for node, weight in _GL:
            x = math.exp(mid + node * width / 2)
            w = x ** (-s)
            jac = weight * width / 2 * x
            terms.append((w, jac, w * jac))
    return tuple(terms), (float(_HEAD), float(n))


def _lru_sums(n: int, s: float, a: float) -> tuple[float, float]:
    """``(Σ_{i≤n} q_i, Σ_{i≤n} i^−s·q_i)`` with ``q_i = 1 − e^(−a·i^−s)``: the expected rows an LRU cache holds and
    (times ``H(n, s)``) its hit rate, at ``a = T/H(n, s)``. Rows ``i < 64`` summed; the rest as
    ``∫_64^n g dx + (g(64) + g(n))/2 + (g'(n) − g'(64))/12``, the integral over ``u = ln x`` in pieces of at most
    2 (20-point Gauss–Legendre each; the terms that do not depend on ``a`` made once per ``(n, s)``,
    :func:`_lru_terms`)."""
    terms, ends = _lru_terms(n, s)
    if _np is not None:  # the sums in one numpy call each (the loop below otherwise)
        w_arr, c_arr, cw_arr, _ = _lru_arrays(n, s)
        q_arr = _np.expm1(w_arr * -a)  # −q
        occ, hit = -float(_np.dot(c_arr, q_arr)), -float(_np.dot(cw_arr, q_arr))
    else:
        occ = hit = 0.0
        for w, c, cw in terms:
            q = -math.expm1(-a * w)
            occ += c * q
            hit += cw * q
    if not ends:
        return occ, hit
    for x, sign in zip(ends, (1.0, -1.0), strict=True):
        w = x ** (-s)
        q = -math.expm1(-a * w)
        dq = -a * s * w / x * math.exp(-a * w)  # d/dx of q
        occ += q / 2 - sign * dq / 12
        hit += w * q / 2 - sign * (-s * w / x * q + w * dq) / 12
    return occ, hit


@lru_cache(maxsize=4096)
def _lru_arrays(n: int, s: float) -> tuple[Any, Any, Any, float]:
    """:func:`_lru_terms`' ``w``, ``c`` and ``c·w`` as numpy arrays (when numpy is there), and ``Σ c·w``."""
    terms, _ = _lru_terms(n, s)
    table = _np.array(terms)
    cw = _np.ascontiguousarray(table[:, 2])
    return _np.ascontiguousarray(table[:, 0]), _np.ascontiguousarray(table[:, 1]), cw, float(cw.sum())


def _lru_occupancy(n: int, s: float, u: float) -> tuple[float, float]:
    """The first of :func:`_lru_sums` at ``a = e^u`` and its slope in ``u``, ``Σ c·a·w·e^(−a·w)`` over the rows and
    nodes (the two end corrections' share of the slope left out: the root finder only steers by it); the sums over
    the rows and nodes in one numpy call each where numpy is installed (the planner's; how much faster:
    ``docs/benchmarks.md``, "Time limit"), else in a loop."""
    a = math.exp(u)
    terms, ends = _lru_terms(n, s)
    if _np is not None:  # four numpy calls: Σ c·a·w·e^(−a·w) = a·(Σ c·w − Σ c·w·q)
        w_arr, c_arr, cw_arr, cw_sum = _lru_arrays(n, s)
        q_arr = _np.expm1(w_arr * -a)  # −q
        occ = -float(_np.dot(c_arr, q_arr))
        slope = a * (cw_sum + float(_np.dot(cw_arr, q_arr)))
    else:
        occ = slope = 0.0
        for w, c, _ in terms:
            e = math.exp(-a * w)
            occ += c * -math.expm1(-a * w)
            slope += c * a * w * e
    if not ends:
        return occ, slope
    for x, sign in zip(ends, (1.0, -1.0), strict=True):
        w = x ** (-s)
        q = -math.expm1(-a * w)
        dq = -a * s * w / x * math.exp(-a * w)
        occ += q / 2 - sign * dq / 12
    return occ, slope


@lru_cache(maxsize=1 << 14)
def distinct_rows(ids: float, num_rows: int, access_skew: float | None) -> float:
    """Expected distinct rows among ``n = ids`` independent lookups into ``r`` rows: uniform ``r·(1 − e^(−n/r))``
    (:func:`touched_rows`); Zipf(``s``) ``Σ_i (1 − e^(−p_i·n))`` with ``p_i = i^−s / H(r, s)`` — the occupancy
    :func:`lru_characteristic_time` solves for, at ``T = n`` — never above ``n``."""
    if ids <= 0:
        return 0.0
    if not access_skew:
        return touched_rows(ids, num_rows)
    total = generalized_harmonic(num_rows, access_skew)
    return min(float(ids), _lru_occupancy(num_rows, access_skew, math.log(ids / total))[0])


@lru_cache(maxsize=65536)
def lru_characteristic_time(num_rows: int, cache_fraction: float | None, access_skew: float) -> float:
    """``T``: the ids after which a row not looked up again has left an LRU cache of ``k = ⌈f·r⌉`` rows under
    Zipf(``s``) accesses (Che's approximation), the root of ``Σ_{i≤r} (1 − e^(−p_i·T)) = k`` with
    ``p_i = i^−s / H(r, s)``, found on ``u = ln a`` (``a = T/H``; the occupancy rises with ``u``) by Newton's method
    kept inside a bracket (a step that leaves it bisects instead), from ``u = ln(k/H)`` — a lower end, since
    ``1 − e^(−a·w) ≤ a·w`` makes the occupancy at most ``a·H`` — to ``|Δu| < 1e-12`` (a relative 1e-12 in ``T``):
    on ``ln`` of the occupancy (linear in ``u`` while few rows are cached, and flattening as the rows fill, where the
    occupancy itself grows exponentially first): fewer evaluations than Newton on the occupancy or bisection took
    (``docs/benchmarks.md``, "Time limit"). Also how many ids a cold cache takes to fill. With ``k ≥ r`` (every row
    cached) the root is at infinity and the figure is only some large ``T``: the hit rate is 1 there."""
    k = cached_rows(num_rows, cache_fraction)
    total = generalized_harmonic(num_rows, access_skew)
    lo, hi = math.log(k / total), 60.0 + access_skew * math.log(num_rows)  # q_i → 1 for every row long before hi
    u = lo
    log_k = math.log(k)
    for _ in range(200):
        occ, slope = _lru_occupancy(num_rows, access_skew, u)
        if occ <= 0:  # far below: exp(u) underflows the sums
            lo, u = u, (u + hi) / 2
            continue
        f = math.log(occ) - log_k  # ln occupancy: linear in u while few rows are cached
        if f < 0:
            lo = u
        elif f > 0:
            hi = u
        else:
            return math.exp(u) * total
        step = -f * occ / slope if slope > 0 else math.inf
        nxt = u + step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if abs(nxt - u) < 1e-12 or hi - lo < 1e-12:
            return math.exp(nxt) * total
        u = nxt
    return math.exp(u) * total


@lru_cache(maxsize=65536)
def cache_hit_rate(num_rows: int, cache_fraction: float | None, access_skew: float | None) -> float:
    """Share of lookups served from an LRU cache of ``k = ⌈f·r⌉`` rows at steady state.

    Uniform access (no skew): ``h = f``.  Zipf(s) over the rows (``p_i = i^−s / H(r, s)``, ids drawn independently):
    Che's approximation of LRU, ``h = Σ_i p_i·(1 − e^(−p_i·T))`` with ``T`` from ``Σ_i (1 − e^(−p_i·T)) = k``
    (:func:`lru_characteristic_time`: a row is cached if it was looked up in the last ``T`` ids), at least ``f``.
    It is below the head mass ``H(k, s) / H(r, s)`` of a cache that would keep the ``k`` hottest rows (LFU with
    perfect counts): LRU also keeps cold rows looked up lately. Against the executor's 32-way set-associative LRU
    cache (``runtime/embedding/row_cache.py``; ``benchmarks/port_measured.py run --parts hitrate``) this is the
    closer of the two: ``docs/truth.md``, "The cache's hit rate".
    """
    f = cache_fraction or 0.0
    if f <= 0:
        return 0.0
    if f >= 1:
        return 1.0
    if access_skew is None:
        return f
    t = lru_characteristic_time(num_rows, f, access_skew)
    total = generalized_harmonic(num_rows, access_skew)
    _, hit = _lru_sums(num_rows, access_skew, t / total)
    return max(f, min(1.0, hit / total))


@lru_cache(maxsize=65536)
def batch_misses(ids: float, num_rows: int, cache_fraction: float | None, access_skew: float | None) -> float:
    """Distinct rows of a batch of ``n = ids`` lookups that an LRU cache of ``k = ⌈f·r⌉`` rows does not hold at
    steady state: the rows a cache that fetches a batch's misses before its lookups (FBGEMM's prefetch) inserts.

    Under Che's approximation a row is cached when it was looked up in the last ``T`` ids
    (:func:`lru_characteristic_time`), so a row of the batch misses when it is among the batch's ``n`` ids but not
    among the ``T`` before: ``Σ_i (1 − e^(−p_i·n))·e^(−p_i·T) = D(n + T) − D(T)`` with ``D(x)`` the distinct rows
    among ``x`` ids (:func:`distinct_rows`; ``D(T) = k``). Uniform access: ``D(n)·(1 − k/r)``. Not the distinct rows
    times the id miss rate ``1 − h``: under skew the hits are the hot rows, looked up many times each, and a batch's
    distinct rows are mostly cold ones — that product under-counted FBGEMM's measured insertions by half and more."""
    if ids <= 0:
        return 0.0
    k = cached_rows(num_rows, cache_fraction)
    if k >= num_rows:
        return 0.0
    if k <= 0:
        return distinct_rows(ids, num_rows, access_skew)
    if access_skew is None:
        return touched_rows(ids, num_rows) * (1.0 - k / num_rows)
    t = lru_characteristic_time(num_rows, cache_fraction, access_skew)
    return max(0.0, distinct_rows(ids + t, num_rows, access_skew) - distinct_rows(t, num_rows, access_skew))
