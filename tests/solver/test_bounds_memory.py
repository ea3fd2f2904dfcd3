"""Per-type HBM in the lower bound (shardwise.solver.bounds, "Per-type HBM"): a hand-computed figure where the fast
class cannot hold every table, brute-force soundness against every assignment that fits each GPU's HBM, the figure
without prices unchanged, and a real mixed fleet whose bound rises and stays below the planners' plans."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from bound_support import assert_below_real_plans, priced, small_cases
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.hbm_bound import h100_a100
from shardwise.solver.bounds import _least_step, _least_step_refined, _WeightedCatalogue, class_capacity, lower_bound_ms
from shardwise.solver.cpsat.candidates import Candidate, enumerate_candidates
from shardwise.solver.pricing import dense_cost, dense_styles
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, ModelSpec

GB = 10**9


def with_hbm(c: Candidate, hbm: npt.ArrayLike) -> Candidate:
    """``c`` holding ``hbm`` bytes per shard and class (broadcast to its cost arrays' shape)."""
    return dataclasses.replace(c, hbm=np.broadcast_to(np.asarray(hbm, dtype=np.int64), c.time_ms.shape).copy())


def best_fitting(
    cands: list[list[Candidate]], fixed: list[float], rank_class: npt.NDArray[np.int64], per_rank: list[int]
) -> float:
    """The least step over every choice of candidate per table and every rank for every shard where it may land (as
    ``bound_support.optimum``: two shards of one candidate may share a rank, a relaxation of a valid plan) among the
    assignments that keep every rank of class ``k`` within ``per_rank[k]`` bytes of HBM; inf where none does."""
    best = math.inf
    ranks = range(len(rank_class))
    for choice in itertools.product(*cands):
        load = [fixed[k] + sum(c.every_rank_ms[k] for c in choice) for k in rank_class]
        used = [0] * len(rank_class)
        for c in choice:
            if c.scope == "fleet":
                for r in ranks:
                    load[r] += c.time_ms[r, 0]
                    used[r] += int(c.hbm[r, 0])
        shards = [(c, s) for c in choice if c.scope != "fleet" for s in range(len(c.time_ms))]
        allowed = [[r for r in ranks if math.isfinite(c.time_ms[s, rank_class[r]])] for c, s in shards]
        for where in itertools.product(*allowed):
            here, mem = list(load), list(used)
            for (c, s), r in zip(shards, where, strict=True):
                here[r] += c.time_ms[s, rank_class[r]]
                mem[r] += int(c.hbm[s, rank_class[r]])
            if all(m <= per_rank[k] for m, k in zip(mem, rank_class, strict=True)):
                best = min(best, max(here))
    return best


def test_the_fast_class_holding_one_table_of_four_sends_three_to_the_slow_one() -> None:
    # one fast GPU (class 0: 1 ms a table, room for one 10 GB table) and one slow (class 1: 3 ms, room for all four).
    # Every plan keeps three tables on the slow GPU: the optimum is 3·3 = 9 ms. Without HBM the bound cannot see it:
    # unweighted (4·1) / 2 = 2, class-weighted at most 3 (λ = (3, 1): each table costs 3 either way, 12 / 4).
    # With prices: λ = (ε, 1), μ₀ = 3 ms per 10 GB, a table costs min(ε + 3, 3) = 3 wherever it goes, and class 0's
    # capacity gives back μ₀·10 GB = 3: (4·3 − 3) / (1 + ε) → 9 as ε → 0; the search stops at ε = 2⁻⁸ or so, and
    # its prices within a halving step of 3 ms per 10 GB.
    cands = [[with_hbm(priced(t, [(1.0, 3.0)]), 10 * GB)] for t in range(4)]
    rank_class = np.array([0, 1])
    capacity = [10.0 * GB, 40.0 * GB]
    assert best_fitting(cands, [0.0, 0.0], rank_class, [10 * GB, 40 * GB]) == pytest.approx(9.0)
    assert _least_step(cands, [0.0, 0.0], [1, 1]) == pytest.approx(2.0)
    before = _least_step_refined(cands, [0.0, 0.0], [1, 1], rank_class)
    assert 2.99 <= before <= 3.0 + 1e-12
    after = _least_step_refined(cands, [0.0, 0.0], [1, 1], rank_class, capacity)
    assert 9.0 / (1.0 + 2.0**-6) <= after <= 9.0 + 1e-9  # 8.86 ≤ … ≤ 9: the hand figure, within the search's ε
    # one price at the hand's figures: exactly (4·3 − 3) / (1 + 2⁻⁸)
    cat = _WeightedCatalogue(cands, [1, 1], rank_class)
    weights, prices = np.array([2.0**-8, 1.0]), np.array([3.0 / (10 * GB), 0.0])
    work = cat.work(weights, prices)
    assert work == pytest.approx([3.0] * 4)
    assert (work.sum() - prices @ np.array(capacity)) / weights.sum() == pytest.approx(9.0 / (1 + 2.0**-8))


def test_a_class_that_can_hold_everything_is_never_priced() -> None:
    # the same four tables with room for all of them on the fast GPU: the figure is the one without prices, exactly
    cands = [[with_hbm(priced(t, [(1.0, 3.0)]), 10 * GB)] for t in range(4)]
    rank_class = np.array([0, 1])
    cat = _WeightedCatalogue(cands, [1, 1], rank_class)
    assert cat.most_bytes(np.ones(cat.size, dtype=bool)) == pytest.approx([40.0 * GB, 40.0 * GB])
    without = _least_step_refined(cands, [0.0, 0.0], [1, 1], rank_class)
    assert _least_step_refined(cands, [0.0, 0.0], [1, 1], rank_class, [40.0 * GB, 40.0 * GB]) == without


def test_bytes_in_host_memory_and_fleet_copies_count_where_they_land() -> None:
    # a table in host memory (0 HBM bytes) costs no price; a fleet-wide row split's bytes count on each rank's class
    rank_class = np.array([0, 1, 1])
    host = with_hbm(priced(0, [(5.0, 7.0)], sizes=(1, 2)), 0)
    split = with_hbm(priced(1, [(1.0,), (1.0,), (1.0,)], sizes=(1, 2), fleet=True), [[2], [3], [4]])
    cat = _WeightedCatalogue([[host], [split]], [1, 2], rank_class)
    assert cat.fixed_hbm.tolist() == [[0.0, 0.0], [2.0, 7.0]]
    weights, prices = np.array([1.0, 1.0]), np.array([10.0, 100.0])
    assert cat.work(weights, prices).tolist() == pytest.approx([5.0, 3.0 + 20.0 + 700.0])


@st.composite
def memory_cases(
    draw: st.DrawFn,
) -> tuple[list[list[Candidate]], list[float], list[int], npt.NDArray[np.int64], list[int]]:
    """``small_cases`` with HBM bytes (0–4 a shard per class, 0 as for a table in host memory) and each class's
    HBM per GPU (0–6 bytes)."""
    cands, fixed, sizes, rank_class = draw(small_cases())
    out = []
    for cs in cands:
        row = []
        for c in cs:
            shape = c.time_ms.shape
            cells = draw(st.lists(st.integers(0, 4), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))
            row.append(with_hbm(c, np.array(cells).reshape(shape)))
        out.append(row)
    return out, fixed, sizes, rank_class, [draw(st.integers(0, 6)) for _ in sizes]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(memory_cases())
def test_the_priced_bound_is_below_every_assignment_that_fits(
    case: tuple[list[list[Candidate]], list[float], list[int], npt.NDArray[np.int64], list[int]],
) -> None:
    cands, fixed, sizes, rank_class, per_rank = case
    capacity = [float(per_rank[k] * n) for k, n in enumerate(sizes)]
    priced_figure = _least_step_refined(cands, fixed, sizes, rank_class, capacity)
    assert priced_figure >= _least_step_refined(cands, fixed, sizes, rank_class)  # prices start from 0
    best = best_fitting(cands, fixed, rank_class, per_rank)
    if math.isfinite(best):  # no assignment fits: every figure is a bound over none
        assert priced_figure <= best * (1 + 1e-9) + 1e-12


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(memory_cases(), st.lists(st.floats(-6.0, 6.0), min_size=2, max_size=2))
def test_zero_prices_are_the_weighted_work(
    case: tuple[list[list[Candidate]], list[float], list[int], npt.NDArray[np.int64], list[int]],
    log_weights: list[float],
) -> None:
    # μ = 0 is the bound without HBM: each candidate's priced work is its weighted work, bit for bit
    cands, _, sizes, rank_class, _ = case
    if len(sizes) < 2:
        return
    cat = _WeightedCatalogue(cands, sizes, rank_class)
    weights = np.exp2(np.array(log_weights))
    assert np.array_equal(cat.work(weights, np.zeros(2)), cat.work(weights))


def _scaled_dcnv2(load_model: Callable[[str], ModelSpec], factor: float) -> ModelSpec:
    """DLRM-DCNv2 with every table ``factor`` times its rows."""
    model = load_model("dlrm_dcnv2")
    tables = [t.model_copy(update={"num_embeddings": int(t.num_embeddings * factor)}) for t in model.embedding_tables]
    return model.model_copy(update={"embedding_tables": tables, "name": f"dlrm-dcnv2-rows-x{factor:g}"})


def test_capacity_is_the_usable_hbm_less_the_smallest_dense_layers(load_model: Callable[[str], ModelSpec]) -> None:
    model = load_model("dlrm_dcnv2")
    topo = Topology(h100_a100(2), {})
    for cls, got in zip(topo.classes, class_capacity(topo, model), strict=True):
        dense = sum(
            min(
                dense_cost(topo, model.batch_size_per_gpu, model, d.name, s, cls).hbm_bytes
                for s in dense_styles(topo, d)
            )
            for d in model.dense_layers
        )
        assert 0 < dense < cls.hbm_limit_bytes
        assert got == (cls.hbm_limit_bytes - dense) * len(cls.ranks)


def test_the_example_mixed_fleet_keeps_its_figure(load_model: Callable[[str], ModelSpec], examples_dir: Path) -> None:
    # DLRM-DCNv2 as it is on a host of B200 and one of MI350X: ~0.2 TB of tables, 3.6 TB of HBM; nothing is priced
    model = load_model("dlrm_dcnv2")
    fleet = FleetSpec.model_validate_json((examples_dir / "fleet_mixed_b200_mi350x.json").read_text(encoding="utf-8"))
    topo = Topology(fleet, {})
    cands = [enumerate_candidates(topo, model, i) for i in range(len(model.embedding_tables))]
    assert lower_bound_ms(topo, model, cands) == lower_bound_ms(topo, model, cands, memory=False)


@pytest.mark.slow  # a real solve or two, over 4 s on the 2-core machine: make test runs it, make test-fast does not
def test_a_mixed_fleet_whose_h100s_cannot_hold_the_tables_gets_a_higher_bound_below_real_plans(
    load_model: Callable[[str], ModelSpec],
) -> None:
    # DLRM-DCNv2 at 1.5× its rows (~0.3 TB with adagrad's state) on 2 H100 + 2 A100 (0.15 TB usable a class): the
    # H100s, faster, cannot hold what the weighted average gives them
    model = _scaled_dcnv2(load_model, 1.5)
    fleet = h100_a100(2)
    topo = Topology(fleet, {})
    cands = [enumerate_candidates(topo, model, i) for i in range(len(model.embedding_tables))]
    before = lower_bound_ms(topo, model, cands, memory=False)
    after = lower_bound_ms(topo, model, cands)
    assert after > 1.005 * before
    assert_below_real_plans(model, fleet, after)
