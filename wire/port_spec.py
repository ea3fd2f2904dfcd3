"""The port report's wire models: a plan carried from one fleet to another versus a re-plan for the target.

Pydantic and :mod:`shardwise.wire.spec` only (no OR-Tools, no numpy), so that the HTTP client and the CLI can parse
a report without the planner or server extras; :func:`shardwise.solver.port.port_analysis` builds it. Every size is
in bytes, every time in milliseconds. Extend, never rename.

Shape::

    {"schema_version": 1, "model": "…", "source_fleet": "…", "target_fleet": "…",
     "source_plan": Plan,                       # the plan on the source fleet (given, or planned)
     "direct_port": {"feasible": false, "predicted_step_ms": null,
                     "short_ranks": [{"rank": 3, "host": 0, "gpu": "…", "hbm_used_bytes": …,
                                      "hbm_limit_bytes": …, "over_by_bytes": …}],
                     "short_hosts": […], "missing_ranks": […], "missing_shards": […], "problems": ["…"],
                     "plan": Plan | null},      # the source layout priced on the target
     "replan": Plan, "replan_from": "solver" | "direct_port",
     "speedup": 1.42, "step_ms_saved": 3.1, "direct_port_in_hbm_ms": 2.9,
     "host_to_hbm_bytes": …, "hbm_to_host_bytes": …,
     "ranks": [{"rank": 0, …, "source_hbm_bytes": …, "direct_port_hbm_bytes": …, "replan_hbm_bytes": …}],
     "table_changes": [{"table": "t_cat_0", "before": {…}, "after": {…}, "reason": "…"}],
     "hints": ["…"]}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shardwise.wire.spec import SCHEMA_VERSION, Ms, Name, NonNegInt, Placement, Plan, PositiveInt, ShardingType


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ShortRank(_Frozen):
    """A target rank whose HBM does not hold what the direct port puts on it."""

    rank: NonNegInt
    host: NonNegInt
    gpu: str
    hbm_used_bytes: NonNegInt
    hbm_limit_bytes: NonNegInt = Field(description="capacity × (1 − the fleet's reserve)")
    over_by_bytes: PositiveInt


class ShortHost(_Frozen):
    """A target host whose memory does not hold the weights the direct port offloads to it."""

    host: NonNegInt
    host_memory_used_bytes: NonNegInt
    host_memory_bytes: NonNegInt
    over_by_bytes: PositiveInt


class MissingShard(_Frozen):
    """A shard of the source plan on a rank the target fleet does not have."""

    table: Name
    rank: NonNegInt
    row_offset: NonNegInt
    num_rows: PositiveInt
    col_offset: NonNegInt
    num_cols: PositiveInt
    placement: Placement


class DirectPort(_Frozen):
    """The source plan carried rank for rank onto the target, priced with the target's profiles.

    Placements are kept (a uvm_cache shard stays uvm_cache even where the target has room for it in HBM);
    data-parallel tables and dense layers run on every rank of the target, as they did on every rank of the source.
    ``predicted_step_ms`` is set only when the port runs as is (``feasible``); ``plan`` is the port priced on the
    target — status ``infeasible`` with the per-rank figures when it does not fit — or None when shards land on
    ranks the target lacks or the source plan itself is infeasible.
    """

    feasible: bool
    predicted_step_ms: Ms | None = None
    short_ranks: list[ShortRank] = Field(default_factory=list)
    short_hosts: list[ShortHost] = Field(default_factory=list)
    missing_ranks: list[NonNegInt] = Field(default_factory=list, description="source ranks the target lacks")
    missing_shards: list[MissingShard] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list, description="why it cannot run on the target, in words")
    plan: Plan | None = None


class RankFill(_Frozen):
    """One target rank: HBM in use and predicted time under the direct port and the re-plan."""

    rank: NonNegInt
    host: NonNegInt
    gpu: str
    hbm_capacity_bytes: NonNegInt
    hbm_limit_bytes: NonNegInt = Field(description="capacity × (1 − the fleet's reserve)")
    source_gpu: str | None = Field(default=None, description="the source fleet's GPU at this rank, if it has one")
    source_hbm_bytes: NonNegInt | None = Field(default=None, description="on the source fleet, if it has this rank")
    direct_port_hbm_bytes: NonNegInt | None = None
    replan_hbm_bytes: NonNegInt | None = None
    direct_port_ms: Ms | None = None
    replan_ms: Ms | None = None


class TableLayout(_Frozen):
    """How one table is laid out in a plan, and what it costs on the target fleet."""

    sharding_type: ShardingType
    placement: str = Field(description="hbm, uvm_cache@<cache fraction>, host, or mixed")
    ranks: list[NonNegInt]
    hbm_bytes: NonNegInt = Field(description="HBM its shards take, summed over ranks")
    host_bytes: NonNegInt = Field(description="host memory its offloaded weights and optimizer state take")
    slowest_shard_ms: Ms = Field(description="compute + communication of its slowest shard")
    compute_ms: Ms = Field(description="summed over its shards")
    comm_ms: Ms = Field(description="summed over its shards")


class TableChange(_Frozen):
    """A table whose sharding type or placement differs between the direct port and the re-plan."""

    table: Name
    before: TableLayout | None = Field(description="in the direct port, priced on the target (None: not all there)")
    after: TableLayout
    reason: str


class PortReport(_Frozen):
    """Direct port versus re-plan of one model from one fleet to another (see the module docstring)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: str
    source_fleet: str
    target_fleet: str
    source_plan: Plan
    direct_port: DirectPort
    replan: Plan
    replan_from: Literal["solver", "direct_port"] = Field(
        default="solver",
        description="direct_port when the solver's plan was predicted slower than the direct port (a time limit) "
        "and the direct port's layout was kept instead",
    )
    speedup: float | None = Field(
        default=None, gt=0, description="direct port ms / re-plan ms, when both run (≥ 1 by construction)"
    )
    step_ms_saved: float | None = Field(default=None, description="direct port ms − re-plan ms, when both run")
    direct_port_in_hbm_ms: Ms | None = Field(
        default=None,
        description="the direct port with its offloaded shards held in HBM on the same ranks: what the target's "
        "larger HBM alone buys, apart from re-sharding (None: nothing offloaded, the port does not run, or it "
        "does not fit)",
    )
    host_to_hbm_bytes: NonNegInt = Field(
        default=0, description="weights + optimizer state the re-plan holds in HBM that the direct port kept in host"
    )
    hbm_to_host_bytes: NonNegInt = Field(
        default=0, description="weights + optimizer state the re-plan offloads that the direct port held in HBM"
    )
    ranks: list[RankFill] = Field(default_factory=list)
    table_changes: list[TableChange] = Field(default_factory=list)
    hints: list[str] = Field(default_factory=list)
