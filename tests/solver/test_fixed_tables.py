"""benchmarks/fixed_tables.py's proofs over part of the catalogue: with most tables fixed, level one's model says
whether a shorter step exists — which holds only without the model's symmetry breaking (family 8), since the fixed
tables pin the bins' labels."""

from __future__ import annotations

from pathlib import Path

from ortools.sat.python import cp_model

from benchmarks.fixed_tables import Fixed
from shardwise.solver.cpsat.formulation import Assignment, Formulation
from shardwise.solver.greedy import enumerate_all
from shardwise.solver.topology import Topology
from shardwise.wire.spec import FleetSpec, ModelSpec, Placement, ShardingType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def setup() -> tuple[Formulation, Assignment]:
    """Three busy tables, whole on single GPUs of one 8-GPU host (rank mode: eight interchangeable bins), all three
    on GPU 1 — an assignment family 8 would not allow (GPU 0 empty, so bin loads rise with the index)."""
    model = ModelSpec.model_validate(
        {
            "name": "three",
            "batch_size_per_gpu": 65_536,
            "embedding_tables": [
                {"name": f"t{i}", "num_embeddings": 1_000_000 * (i + 1), "embedding_dim": 256, "pooling_factor": 4.0}
                for i in range(3)
            ],
        }
    )
    fleet = FleetSpec.model_validate_json((EXAMPLES / "fleet_8xh100.json").read_text(encoding="utf-8"))
    topo = Topology(fleet, {})
    cands = [
        [c for c in cs if c.sharding is ShardingType.table_wise and c.placement is Placement.hbm]
        for cs in enumerate_all(topo, model)
    ]
    form = Formulation(topo, model, cands, "rank", horizon_ms=1_000.0)
    assert form.symmetry_constraints  # the premise: family 8 orders these bins
    a = Assignment(choice=[0, 0, 0], shard_bins={0: [1], 1: [1], 2: [1]}, host={}, dense=[])
    return form, a


def test_a_move_family_8_would_forbid_is_found() -> None:
    form, a = setup()
    fixed = Fixed(form)
    stacked = form.per_gpu_units(a)
    # t0 (the smallest) freed, t1 and t2 kept on GPU 1: moving t0 anywhere else shortens the step
    status, _, got = fixed.solve(a, [0], stacked, 10.0)
    assert status == "OPTIMAL"
    assert got is not None
    better, step = got
    assert step < stacked
    assert better.shard_bins[0] != [1]
    assert better.shard_bins[1] == [1]  # the fixed tables stayed
    assert better.shard_bins[2] == [1]
    # the same question to the model with family 8: GPU 0 would have to carry at least GPU 1's load, which t0
    # alone cannot: no answer, although one exists
    with_symmetry = form.model.clone()
    val = form._values(a)
    for t in (1, 2):
        for cv in form.vars[t]:
            for v in (cv.x, *(u for bins in cv.shard_bins for u in bins.values())):
                with_symmetry.add(v == val[v.index])
    with_symmetry.add(stacked > form.S)

    assert cp_model.CpSolver().solve(with_symmetry) == cp_model.INFEASIBLE


def test_a_step_no_move_of_the_freed_tables_can_shorten_is_proved() -> None:
    form, a = setup()
    fixed = Fixed(form)
    # t2 (the largest) alone on GPU 1 with nothing else: freeing t0 and t1 (now on GPU 1 too) finds the spread-out
    # layout; then with every table freed no step below it exists (the three on three GPUs: the largest sets it)
    _, _, got = fixed.solve(a, [0, 1], form.per_gpu_units(a), 10.0)
    assert got is not None
    spread, step = got
    assert len({spread.shard_bins[t][0] for t in range(3)}) == 3
    status, _, none = fixed.solve(spread, [0, 1, 2], step, 10.0)
    assert status == "INFEASIBLE"
    assert none is None
