"""Level two's host-packing model (:class:`shardwise.solver.cpsat.packing.HostPacking`), one constraint family at a
time on hand-sized hosts: known optima (objective = bound = the hand value) and infeasible twins."""

from __future__ import annotations

from ortools.sat.python import cp_model

from shardwise.solver.cpsat.packing import HostPacking, Item, longest_first, pack_host
from shardwise.solver.cpsat.scale import Scale
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, SolveParams

MS = Scale.time(1.0)  # one millisecond in the model's time units


def items(*shards: tuple[float, int]) -> list[Item]:
    """One single-shard table per ``(ms, hbm units)``."""
    return [Item(table=t, shard=0, time=Scale.time(ms), hbm=hbm, host=0) for t, (ms, hbm) in enumerate(shards)]


def solve(packing: HostPacking) -> tuple[str, int, int]:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 10
    status = solver.solve(packing.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solver.status_name(status), -1, -1
    return solver.status_name(status), round(solver.objective_value), round(solver.best_objective_bound)


def test_makespan_known_optimum() -> None:
    # families 1 and 3: 3, 2, 2 ms on two GPUs → {3} | {2, 2} = 4 ms
    packing = HostPacking(items((3, 1), (2, 1), (2, 1)), base_load=[0, 0], base_hbm=[0, 0], caps=[100, 100])
    assert solve(packing) == ("OPTIMAL", 4 * MS, 4 * MS)


def test_pinned_load_counts_in_the_makespan() -> None:
    # family 3 with L_k: GPU 0 already carries 3 ms, so both 2-ms shards go to GPU 1 → 4 ms (one each: 5 ms)
    packing = HostPacking(items((2, 1), (2, 1)), base_load=[3 * MS, 0], base_hbm=[0, 0], caps=[100, 100])
    assert solve(packing) == ("OPTIMAL", 4 * MS, 4 * MS)


def test_hbm_forces_imbalance() -> None:
    # family 2: 3, 2, 2, 1 ms; unconstrained {3, 1} | {2, 2} = 4 ms, but the two 2-ms shards take 60 of a GPU's 100
    # units each, so they part: {3, 2} | {2, 1} = 5 ms
    packing = HostPacking(items((3, 10), (2, 60), (2, 60), (1, 10)), base_load=[0, 0], base_hbm=[0, 0], caps=[100, 100])
    assert solve(packing) == ("OPTIMAL", 5 * MS, 5 * MS)


def test_pinned_hbm_feasible_and_infeasible_twins() -> None:
    # family 2 with M_k: two 70-unit shards, one per GPU, fit beside 30 pinned units and not beside 31
    fits = HostPacking(items((1, 70), (1, 70)), base_load=[0, 0], base_hbm=[30, 30], caps=[100, 100])
    assert solve(fits) == ("OPTIMAL", 1 * MS, 1 * MS)
    full = HostPacking(items((1, 70), (1, 70)), base_load=[0, 0], base_hbm=[31, 31], caps=[100, 100])
    assert solve(full)[0] == "INFEASIBLE"


def test_pack_host_reads_the_optimum_or_says_none() -> None:
    # the run's entry point on a real two-GPU host (1 MB each): the optimum's makespan, or None when nothing fits
    topo = Topology(
        FleetSpec.model_validate(
            {
                "name": "toy",
                "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}],
            }
        )
    )
    cap = Scale.capacity(topo.hbm_limit(0))
    params = SolveParams(num_workers=1, max_deterministic_time=1.0)
    shards = items((3, 1), (2, 1), (2, 1))
    where = pack_host(topo, 0, shards, [0, 0], [0, 0], params, 5.0)
    assert where is not None
    assert HostPacking(shards, [0, 0], [0, 0], [cap, cap]).makespan(where) == 4 * MS
    big = items((1, cap // 2 + 1), (1, cap // 2 + 1), (1, cap // 2 + 1))
    assert pack_host(topo, 0, big, [0, 0], [0, 0], params, 5.0) is None


def test_two_slices_of_a_table_never_share_a_gpu() -> None:
    # family 4: two 1-ms slices of one table, GPU 1 already carries 1.5 ms: the slices would end soonest together
    # on GPU 0 ({1, 1} | {1.5} = 2 ms), but one slice per GPU gives {1} | {1.5, 1} = 2.5 ms
    slices = [Item(table=0, shard=i, time=MS, hbm=1, host=0) for i in range(2)]
    base = [0, round(1.5 * MS)]
    packing = HostPacking(slices, base_load=base, base_hbm=[0, 0], caps=[100, 100])
    assert solve(packing) == ("OPTIMAL", round(2.5 * MS), round(2.5 * MS))
    assert not packing.fits([0, 0])
    assert longest_first(slices, base, [0, 0], [100, 100]) == [0, 1]
    # the twin: two tables of 1 ms share GPU 0
    assert solve(HostPacking(items((1, 1), (1, 1)), base_load=base, base_hbm=[0, 0], caps=[100, 100])) == (
        "OPTIMAL",
        2 * MS,
        2 * MS,
    )
    # three slices on two GPUs cannot be packed at all
    three = [Item(table=0, shard=i, time=MS, hbm=1, host=0) for i in range(3)]
    assert solve(HostPacking(three, base_load=[0, 0], base_hbm=[0, 0], caps=[100, 100]))[0] == "INFEASIBLE"
    assert longest_first(three, [0, 0], [0, 0], [100, 100]) is None
