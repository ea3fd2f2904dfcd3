"""Host mode's layouts neighbourhood (:func:`shardwise.solver.cpsat.layouts.search_layouts`) on a hand-priced fleet of
4 hosts × 4 GPUs: it lowers the slowest GPU of a start that piles tables on one host (known optimum: objective = the
hand value), keeps within the GPUs' memory, returns nothing where the start is already the best of its space, and
keeps its deadline; and the fleet LNS stops once the plan meets level one's bound."""

from __future__ import annotations

import time

import pytest
from bound_support import column_halves, hand_priced

from shardwise.solver.cpsat.candidates import Candidate, Shape, block_ranks
from shardwise.solver.cpsat.formulation import Assignment, Formulation
from shardwise.solver.cpsat.layouts import layout_candidates, search_layouts, worth_it
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.deadline import Deadline
from shardwise.solver.load import Placed
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, ModelSpec, ShardingType, SolveParams

GPUS = 4  # per host
HOSTS = 4
PARAMS = SolveParams(time_limit_s=20, num_workers=2, max_deterministic_time=5.0)


def fleet() -> Topology:
    """4 hosts of 4 H100s, no HBM reserve: 16 GPUs, host mode."""
    return Topology(
        FleetSpec.model_validate(
            {
                "name": "toy",
                "hosts": [{"gpu": "nvidia-h100-sxm", "count": HOSTS, "gpus_per_host": GPUS}],
                "hbm_reserve_fraction": 0.0,
            }
        )
    )


def model() -> ModelSpec:
    """Four tables (A, B, C, D), no dense layers: the model's figures are the hand-priced candidates' alone."""
    return ModelSpec.model_validate(
        {
            "name": "toy",
            "batch_size_per_gpu": 512,
            "embedding_tables": [
                {"name": name, "num_embeddings": 100_000, "embedding_dim": 64} for name in ("A", "B", "C", "D")
            ],
        }
    )


def block(table: int, span: int, ms: float, hbm: int = 1024) -> Candidate:
    """A hand-priced row split over a block of ``span`` hosts (table_row_wise for one host): one shard per GPU of the
    block, ``ms`` each."""
    sharding = ShardingType.table_row_wise if span == 1 else ShardingType.row_wise
    shapes = tuple(Shape(10 * i, 10, 0, 64) for i in range(span * GPUS))
    return hand_priced(table, sharding, shapes, ms, hbm, scope="host", scope_class=0, span=span)


def whole(table: int, ms: float) -> Candidate:
    """A hand-priced table_wise candidate (rank scope: one shard on any GPU)."""
    return hand_priced(table, ShardingType.table_wise, (Shape(0, 100_000, 0, 64),), ms, 1024)


def catalogue(a_split_hbm: int = 1024) -> list[list[Candidate]]:
    """A: one host at 8 ms a GPU, or two hosts at 4 ms (``a_split_hbm`` bytes a shard); B, C: one host at 4 ms;
    D: table_wise at 2 ms, or a column split (rank scope, dropped from the neighbourhood)."""
    d_split = column_halves(3, 100_000, 32, 1.0, 512)
    return [
        [block(0, 1, 8.0), block(0, 2, 4.0, hbm=a_split_hbm)],
        [block(1, 1, 4.0)],
        [block(2, 1, 4.0)],
        [whole(3, 2.0), d_split],
    ]


def on_hosts(topo: Topology, c: Candidate, first: int) -> Placed:
    return Placed(c, list(block_ranks(topo, range(first, first + c.span))))


def piled(topo: Topology, cands: list[list[Candidate]]) -> list[Placed]:
    """The unbalanced start: A (one host) and B on host 0, C on host 1, D on host 0's first GPU (14 ms there)."""
    return [
        on_hosts(topo, cands[0][0], 0),
        on_hosts(topo, cands[1][0], 0),
        on_hosts(topo, cands[2][0], 1),
        Placed(cands[3][0], [0]),
    ]


def latency_ms(topo: Topology, cands: list[list[Candidate]]) -> float:
    """The collectives' fixed latency a GPU carries in the model under the layouts of :func:`catalogue` (row splits
    and table_wise)."""
    form = Formulation(topo, model(), [[c] for c in (cands[0][1], cands[1][0], cands[2][0], cands[3][0])], "host", 100)
    return Scale.ms(form.latency_units(Assignment([0, 0, 0, 0], {3: [0]}, {0: 2, 1: 0, 2: 1}, []))[0])


def test_the_neighbourhood_keeps_fixed_rank_layouts_and_the_starts_own() -> None:
    topo = fleet()
    cands = catalogue()
    space = layout_candidates(cands, piled(topo, cands))
    assert [len(cs) for cs in space] == [2, 1, 1, 1]  # D's column split is dropped, its table_wise start kept
    assert space[3][0] is cands[3][0]
    # on 16 GPUs the column split is a small share of level one's booleans: no smaller model to solve first
    assert not worth_it(topo, cands, space)


def test_layouts_lower_the_slowest_gpu_to_the_hand_optimum() -> None:
    # A over two hosts (4 ms a GPU on hosts 0-1 or 2-3), B and C a host each, D on some GPU: 4 + 2 = 6 ms there;
    # A on one host would leave 8 ms, so 6 ms (plus the collectives' latency) is the optimum
    topo, cands = fleet(), catalogue()
    start = piled(topo, cands)
    got = search_layouts(topo, model(), cands, start, [], 14.0, PARAMS, Deadline(20))
    assert got is not None
    assert got.status == "OPTIMAL"
    assert got.units < got.start_units
    assert got.ms == pytest.approx(6.0 + latency_ms(topo, cands), abs=1e-5)
    assert Scale.ms(got.start_units) >= 12.5  # host 0's average in the start: (4 x 12 + 2) / 4
    # the answer indexes the whole catalogue: A took its two-host split, D stayed table_wise
    assert cands[0][got.assignment.choice[0]].span == 2
    assert got.assignment.choice[3] == 0


def test_layouts_keep_within_each_gpus_memory() -> None:
    # A's two-host split no longer fits a GPU: A stays on one host (8 ms a GPU), the best left
    topo = fleet()
    cands = catalogue(a_split_hbm=topo.hbm_limit(0) + 1)
    got = search_layouts(topo, model(), cands, piled(topo, cands), [], 14.0, PARAMS, Deadline(20))
    assert got is not None
    assert got.ms == pytest.approx(8.0 + latency_ms(topo, cands), abs=1e-5)
    assert cands[0][got.assignment.choice[0]].span == 1


def test_layouts_return_nothing_where_the_start_is_the_best_of_its_space() -> None:
    topo, cands = fleet(), catalogue()
    best = [
        on_hosts(topo, cands[0][1], 2),
        on_hosts(topo, cands[1][0], 0),
        on_hosts(topo, cands[2][0], 1),
        Placed(cands[3][0], [0]),
    ]
    assert search_layouts(topo, model(), cands, best, [], 6.1, PARAMS, Deadline(20)) is None


def test_layouts_keep_their_deadline() -> None:
    topo, cands = fleet(), catalogue()
    begun = time.monotonic()
    assert search_layouts(topo, model(), cands, piled(topo, cands), [], 14.0, PARAMS, Deadline(0.0)) is None
    assert time.monotonic() - begun < 1.0
    unlimited = SolveParams(time_limit_s=20, num_workers=2)
    begun = time.monotonic()
    search_layouts(topo, model(), cands, piled(topo, cands), [], 14.0, unlimited, Deadline(0.3))
    assert time.monotonic() - begun < 0.3 + 1.0
