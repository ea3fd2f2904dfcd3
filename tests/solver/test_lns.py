"""Host mode's fleet-wide search (:func:`solver.solve.lns_fleet`): valid plans, never worse than greedy, same seed →
same plan."""

from __future__ import annotations

import json
from pathlib import Path

from solver.greedy import plan_greedy
from solver.planner import make_plan
from solver.spec import FleetSpec, ModelSpec, SolveParams
from solver.topology import Topology
from solver.validate import check_plan

EXAMPLES = Path(__file__).parents[2] / "examples"


def _fleet(hosts: int) -> FleetSpec:
    data = json.loads((EXAMPLES / "fleet_8xh100.json").read_text())
    data["hosts"][0]["count"] = hosts
    data["name"] = f"h100-{hosts}x8"
    return FleetSpec.model_validate(data)


def _model() -> ModelSpec:
    return ModelSpec.model_validate(json.loads((EXAMPLES / "dlrm_dcnv2.json").read_text()))


def test_host_mode_plan_valid_and_deterministic() -> None:
    model, fleet = _model(), _fleet(2)  # 16 GPUs: host mode, then packing and the fleet-wide search
    topo = Topology(fleet)
    params = SolveParams(time_limit_s=30, max_deterministic_time=0.5, num_workers=1, random_seed=3)
    first = make_plan(model, fleet, params)
    second = make_plan(model, fleet, params)
    assert check_plan(topo, model, first) == []
    greedy = plan_greedy(topo, model)
    assert first.predicted_step_ms is not None
    assert greedy.predicted_step_ms is not None
    assert first.predicted_step_ms <= greedy.predicted_step_ms + 1e-9
    assert first.lower_bound_ms is not None
    assert first.lower_bound_ms <= first.predicted_step_ms

    def body(plan_json: str) -> str:
        data = json.loads(plan_json)
        data["solver"].pop("seconds")
        return json.dumps(data, sort_keys=True)

    assert body(first.model_dump_json()) == body(second.model_dump_json())
