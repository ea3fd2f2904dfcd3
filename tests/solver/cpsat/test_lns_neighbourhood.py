"""The LNS round's model (:class:`shardwise.solver.cpsat.lns.Neighbourhood` over a
:class:`~shardwise.solver.cpsat.lns.FleetState`), one constraint family at a time on hand-sized fleets: known optima
(objective = bound = the hand value) and infeasible twins (a round that cannot lower the slowest GPU)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from ortools.sat.python import cp_model

from shardwise.solver.cpsat.candidates import Candidate, Shape
from shardwise.solver.cpsat.lns import FleetState, Neighbourhood
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, Placement, ShardingType

MS = Scale.time(1.0)  # one millisecond in the model's time units
HOST_BYTES = 10**12


def fleet(hosts: int, gpus: int) -> Topology:
    """``hosts`` hosts of ``gpus`` H100s each, no HBM reserve (one device class)."""
    return Topology(
        FleetSpec.model_validate(
            {
                "name": "toy",
                "hosts": [
                    {
                        "gpu": "nvidia-h100-sxm",
                        "count": hosts,
                        "gpus_per_host": gpus,
                        "host_memory_bytes": HOST_BYTES,
                    }
                ],
                "hbm_reserve_fraction": 0.0,
            }
        )
    )


def cand(table: int, *ms: float, hbm: int = 1024, host: int = 0, every_rank_ms: float = 0.0) -> Candidate:
    """A hand-priced rank-scope candidate: table_wise for one shard, column_wise for more, ``ms`` per shard."""
    n = len(ms)
    return Candidate(
        table=table,
        sharding=ShardingType.table_wise if n == 1 else ShardingType.column_wise,
        placement=Placement.hbm,
        cache_fraction=None,
        scope="rank",
        scope_class=None,
        shapes=tuple(Shape(0, 10, 4 * i, 4) for i in range(n)),
        hbm=np.full((n, 1), hbm, dtype=np.int64),
        host=np.full((n, 1), host, dtype=np.int64),
        compute_ms=np.array([[m] for m in ms]),
        comm_ms=np.zeros((n, 1)),
        every_rank_ms=np.full(1, every_rank_ms),
    )


def state(
    topo: Topology,
    cands: Sequence[Sequence[Candidate]],
    gpus: Sequence[Sequence[int]],
    base_host: Sequence[int] | None = None,
) -> FleetState:
    """Every table on its first candidate, shard ``i`` of table ``t`` on GPU ``gpus[t][i]``; nothing pinned."""
    W = topo.world_size
    where = {(t, i): r for t, rr in enumerate(gpus) for i, r in enumerate(rr)}
    zeros = np.zeros(W, dtype=np.int64)
    return FleetState(
        topo, cands, [0] * len(cands), where, zeros, zeros.copy(), list(base_host or [0] * topo.num_hosts)
    )


def solve(s: FleetState, pick: list[int]) -> tuple[str, int, int]:
    hood = Neighbourhood(s, pick, s.peak())
    hood.hint()
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 10
    status = solver.solve(hood.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solver.status_name(status), -1, -1
    return solver.status_name(status), round(solver.objective_value), round(solver.best_objective_bound)


def test_makespan_known_optimum() -> None:
    # families 1-3: 3, 2, 2, 1 ms all on GPU 0 of three → {3} | {2, 1} | {2} = 3 ms
    topo = fleet(1, 3)
    s = state(topo, [[cand(0, 3)], [cand(1, 2)], [cand(2, 2)], [cand(3, 1)]], [[0], [0], [0], [0]])
    assert s.peak() == 8 * MS
    assert solve(s, [0, 1, 2]) == ("OPTIMAL", 3 * MS, 3 * MS)


def test_a_round_that_cannot_lower_the_peak_is_infeasible() -> None:
    # T ≤ peak − 1: the same tables already at the optimum leave nothing to gain
    topo = fleet(1, 3)
    s = state(topo, [[cand(0, 3)], [cand(1, 2)], [cand(2, 2)], [cand(3, 1)]], [[0], [1], [2], [1]])
    assert solve(s, [0, 1, 2])[0] == "INFEASIBLE"


def test_hbm_forces_imbalance() -> None:
    # family 4: 3, 2, 2, 1 ms on two GPUs of 80 GB; the 2-ms tables take 50 GB each, so they part:
    # {3, 2} | {2, 1} = 5 ms, not the 4 ms of {3, 1} | {2, 2}
    topo = fleet(1, 2)
    big = 50 * 10**9
    s = state(
        topo,
        [[cand(0, 3)], [cand(1, 2, hbm=big)], [cand(2, 2, hbm=big)], [cand(3, 1)]],
        [[0], [0], [1], [0]],
    )
    assert topo.hbm_limit(0) < 2 * big
    assert s.peak() == 6 * MS
    assert solve(s, [0, 1]) == ("OPTIMAL", 5 * MS, 5 * MS)


def test_host_memory_bounds_what_may_change_host() -> None:
    # family 5: two hosts of one GPU; the 3- and 2-ms tables hold host memory, the 1-ms one none. With room on
    # host 1: {3} | {2, 1} = 3 ms. With host 1 full (its fixed-rank shards use it all), only the 1-ms table may
    # go there: {3, 2} | {1} = 5 ms
    topo = fleet(2, 1)
    cands = [[cand(0, 3, host=4096)], [cand(1, 2, host=4096)], [cand(2, 1)]]
    room = state(topo, cands, [[0], [0], [0]])
    assert solve(room, [0, 1]) == ("OPTIMAL", 3 * MS, 3 * MS)
    full = state(topo, cands, [[0], [0], [0]], base_host=[0, Scale.capacity(HOST_BYTES)])
    assert solve(full, [0, 1]) == ("OPTIMAL", 5 * MS, 5 * MS)


def test_a_table_switches_to_an_interchangeable_candidate() -> None:
    # families 1-2 over options: table 0 whole (4 ms) or as two 1.5-ms column halves, table 1 whole 2 ms, one per
    # GPU → the halves apart (family 6), table 1 beside one of them: {1.5, 2} | {1.5} = 3.5 ms
    topo = fleet(1, 2)
    s = state(topo, [[cand(0, 4), cand(0, 1.5, 1.5)], [cand(1, 2)]], [[0], [1]])
    assert s.alternatives(0) == [0, 1]
    assert solve(s, [0, 1]) == ("OPTIMAL", round(3.5 * MS), round(3.5 * MS))


def test_a_candidate_with_another_every_rank_term_is_no_option() -> None:
    # the twin: the halves would change every GPU's every-rank term, so the table stays whole and no round helps
    topo = fleet(1, 2)
    s = state(topo, [[cand(0, 4), cand(0, 1.5, 1.5, every_rank_ms=0.1)], [cand(1, 2)]], [[0], [1]])
    assert s.alternatives(0) == [0]
    assert solve(s, [0, 1])[0] == "INFEASIBLE"


def test_only_a_table_wholly_on_the_picked_gpus_may_switch() -> None:
    # table 0 is two 2-ms halves on GPUs 0 and 2, or whole in 1 ms; table 1 (2 ms) on GPU 0, table 2 (1 ms) on 1.
    # Picking GPUs 0 and 1 leaves table 0's half on GPU 2 where it is, so it keeps its halves:
    # {2, 1} | {2} = 3 ms. Picking all three frees it: whole, {1, 1} | {2} = 2 ms
    topo = fleet(1, 3)
    cands = [[cand(0, 2, 2), cand(0, 1)], [cand(1, 2)], [cand(2, 1)]]
    s = state(topo, cands, [[0, 2], [0], [1]])
    assert s.peak() == 4 * MS
    assert solve(s, [0, 1]) == ("OPTIMAL", 3 * MS, 3 * MS)
    assert solve(s, [0, 1, 2]) == ("OPTIMAL", 2 * MS, 2 * MS)


def test_two_slices_of_a_table_never_share_a_gpu() -> None:
    # family 6: two 1-ms slices of table 0 and two 2-ms tables on three GPUs, now {1, 2} | {1, 2} | {} = 3 ms.
    # Only the slices together would reach 2 ms ({1, 1} | {2} | {2}), so the round cannot lower the peak
    topo = fleet(1, 3)
    s = state(topo, [[cand(0, 1, 1)], [cand(1, 2)], [cand(2, 2)]], [[0, 1], [0], [1]])
    assert s.peak() == 3 * MS
    assert solve(s, [0, 1, 2])[0] == "INFEASIBLE"
    # the twin: the same 1-ms shards as two tables may share a GPU
    twin = state(topo, [[cand(0, 1)], [cand(1, 1)], [cand(2, 2)], [cand(3, 2)]], [[0], [1], [0], [1]])
    assert solve(twin, [0, 1, 2]) == ("OPTIMAL", 2 * MS, 2 * MS)


def test_the_state_meets_a_per_gpu_target_only_on_every_gpu() -> None:
    # lns_fleet stops once every GPU carries at most its target (level one's bound less its latency)
    topo = fleet(1, 3)
    s = state(topo, [[cand(0, 3)], [cand(1, 2)], [cand(2, 1)]], [[0], [1], [2]])
    assert not s.meets(None)
    assert s.meets([3 * MS, 2 * MS, 1 * MS])
    assert not s.meets([3 * MS, 2 * MS, 1 * MS - 1])
