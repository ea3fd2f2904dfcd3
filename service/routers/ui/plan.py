"""The page of one plan, ``/ui/plans/{plan_id}`` (``plan.html``): its head (with its throughput and the engine its
figures price), the fleet view (one row per host, a metric switch), every rank's HBM and time bars up to
``HEATMAP_ABOVE`` GPUs, where the time goes, how the solver got there, the tables with their layout and size, the
dense layers and the kernel the kernel model chose for each of their GEMMs per GPU type (collapsed past
``KERNELS_OPEN_UP_TO`` rows), the explanation and the "Apply it" snippet; a link to its TorchRec export only where
TorchRec runs the layout, else the one line that says why not (:func:`export_refusal`);
``/ui/plans/{plan_id}/fleet?metric=…``, the fleet view alone (what the switch swaps in with htmx); and its one form,
``POST /ui/plans/{plan_id}/delete`` (on ``forms``, a router outside the read check: it checks CSRF first, then read
and write access itself).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from shardwise.service import repository as repo
from shardwise.service import sessions
from shardwise.service.auth import LoginRequired, page_access
from shardwise.service.db import SessionDep
from shardwise.service.routers.ui.fleet import METRICS, fleet_view, metric_of
from shardwise.service.routers.ui.formatting import rank_ranges
from shardwise.service.routers.ui.rendering import page, plan_not_found, timed
from shardwise.service.routers.ui.snippet import snippet
from shardwise.service.routers.ui.timing import convergence_view, throughput
from shardwise.service.routers.ui.views import (
    HBM_PARTS,
    HEATMAP_ABOVE,
    PagePlan,
    history_row,
    load_plan,
    rank_views,
    reserve_of,
)
from shardwise.solver.engine import engine_words, export_problems
from shardwise.wire.spec import DensePlan, EmbeddingTableSpec, ModelSpec, PlanStatus, Pooling, TablePlan

router = APIRouter()
forms = APIRouter()


@dataclass(frozen=True)
class TableView:
    name: str
    sharding_type: str
    ranks: str
    num_ranks: int
    placement: str
    shards: int
    shape: str  # "40,000,000 × 128 fp32"
    weight_bytes: int | None
    lookups: str = ""  # "sum of 3 ids", "unpooled: 544 ids (p99 4,096) × 2 features"


def lookups_label(spec: EmbeddingTableSpec) -> str:
    """What a sample looks up in a table: the pooling and the ids per feature (mean, and the tail where the spec has
    it), times the features it serves; an unpooled (sequence) table returns a row for every one of those ids."""
    ids = f"{spec.pooling_factor:,.4g} id{'' if spec.pooling_factor == 1 else 's'}"
    if spec.pooling_factor_p99 is not None:
        ids += f" (p99 {spec.pooling_factor_p99:,.4g})"
    features = f" × {spec.num_features} features" if spec.num_features > 1 else ""
    if spec.pooling is Pooling.none:
        return f"unpooled: {ids}{features}"
    return f"{spec.pooling.value} of {ids}{features}"


def table_views(loaded: PagePlan) -> list[TableView]:
    model: ModelSpec | None = loaded.model
    specs = {t.name: t for t in model.embedding_tables} if model is not None else {}
    out: list[TableView] = []
    for tp in loaded.tables:
        spec = specs.get(tp.name)
        shape = f"{spec.num_embeddings:,} × {spec.embedding_dim} {spec.dtype.value}" if spec else ""
        ranks = tp.ranks
        out.append(
            TableView(
                name=tp.name,
                sharding_type=tp.sharding_type.value,
                ranks=rank_ranges(ranks),
                num_ranks=len(ranks),
                placement=tp.placement,
                shards=len(tp.raw),
                shape=shape,
                weight_bytes=spec.weight_bytes if spec else None,
                lookups=lookups_label(spec) if spec else "",
            )
        )
    return out


#: the kernels table is open up to this many rows (GEMMs × GPU types), collapsed to its summary line above
KERNELS_OPEN_UP_TO = 24


@dataclass(frozen=True)
class KernelView:
    """One GEMM of a dense layer on one GPU type: the configuration the kernel model chose and its predicted time
    (``tflops`` = ``2·m·n·k / predicted``)."""

    layer: str
    phase: str
    gpu: str
    shape: str  # "8192 × 1024 × 3456" (M × N × K)
    dtype: str
    config: str  # KernelConfig.label of the best Triton configuration: "128x256x64 w8 s3 g8 sk1"
    predicted_us: float  # of the kernel that runs
    tflops: float
    kernel: str = "triton"  # which runs: "vendor" (torch.matmul: cuBLAS / hipBLASLt) or "triton"
    triton_us: float | None = None  # the candidates' predicted µs (None in a plan from before the vendor was one)
    vendor_us: float | None = None


@dataclass(frozen=True)
class KernelsView:
    rows: list[KernelView]
    layers: int
    per_gpu_us: list[tuple[str, float]]  # each GPU type's GEMMs of one step, summed (predicted µs)
    open: bool


def kernels_view(dense: list[DensePlan]) -> KernelsView | None:
    """The plan's kernel choices, a row per (layer, GPU type, phase) in the plan's order; None without any (an
    unclassified model, profiles without a microarchitecture, a plan stored before plans carried them). Each GPU
    type's sum takes, where host groups of one GPU type with different GPUs per host give a phase two tensor-parallel
    GEMMs, the slower of them (the pace of that GPU type's slowest host)."""
    rows: list[KernelView] = []
    slowest: dict[tuple[str, str, str], float] = {}  # (gpu, layer, phase) → µs
    layers = 0
    for d in dense:
        layers += bool(d.kernels)
        for k in d.kernels:
            rows.append(
                KernelView(
                    layer=d.name,
                    phase=k.phase.value,
                    gpu=k.gpu,
                    shape=f"{k.m} × {k.n} × {k.k}",
                    dtype=k.dtype.value,
                    config=k.config.label,
                    predicted_us=k.predicted_us,
                    tflops=2.0 * k.m * k.n * k.k / (k.predicted_us * 1e6) if k.predicted_us > 0 else 0.0,
                    kernel=k.kernel.value,
                    triton_us=k.triton_us,
                    vendor_us=k.vendor_us,
                )
            )
            key = (k.gpu, d.name, k.phase.value)
            slowest[key] = max(slowest.get(key, 0.0), k.predicted_us)
    if not rows:
        return None
    per_gpu: dict[str, float] = {}
    for (gpu, _, _), us in slowest.items():
        per_gpu[gpu] = per_gpu.get(gpu, 0.0) + us
    return KernelsView(rows, layers, sorted(per_gpu.items()), open=len(rows) <= KERNELS_OPEN_UP_TO)


#: plans whose export check this process remembers (a stored plan never changes: the check is the plan's for good)
REFUSALS_KEPT = 1024
_refusals: OrderedDict[str, str | None] = OrderedDict()
_refusals_lock = Lock()


def export_refusal(loaded: PagePlan) -> str | None:
    """Why ``GET /api/v1/plans/{id}/torchrec`` would refuse the plan (the first of
    :func:`shardwise.solver.engine.export_problems`, what the route answers 422 with), None where it exports: the
    page links only an export that works. An infeasible plan has no layout to export, and says so elsewhere.

    The exporter reads the tables as the wire's models, which the page otherwise never builds (:class:`PagePlan`):
    at 1,024 GPUs that is ~20,000 shards validated, ~0.1 s, so each plan's answer is kept (``REFUSALS_KEPT``)."""
    if loaded.plan.status is PlanStatus.infeasible:
        return None
    if loaded.model is None:  # the export reads the request's model, which this version cannot read
        return "TorchRec cannot run this layout: its request is stored in a shape this version does not read"
    key = loaded.plan.id
    with _refusals_lock:
        if key in _refusals:
            _refusals.move_to_end(key)
            return _refusals[key]
    tables = [TablePlan.model_validate(t) for t in loaded.row.body.get("tables", [])]
    problems = export_problems(loaded.plan.model_copy(update={"tables": tables}), loaded.model)
    refusal = problems[0] if problems else None
    with _refusals_lock:
        _refusals[key] = refusal
        while len(_refusals) > REFUSALS_KEPT:
            _refusals.popitem(last=False)
    return refusal


@router.get("/ui/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(plan_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    from shardwise.service.routers.ui import breakdown  # prices the plan again: numpy and the cost model, loaded here

    started = time.perf_counter()
    loaded = load_plan(session, plan_id)
    if loaded is None:
        return plan_not_found(request, plan_id)
    row, plan = loaded.row, loaded.plan
    reserve = reserve_of(row)
    views = rank_views(plan.ranks, reserve, bars=len(plan.ranks) <= HEATMAP_ABOVE)
    heatmap = len(views) > HEATMAP_ABOVE
    metric = metric_of(request.query_params.get("metric"), "fill")
    base = str(request.base_url).rstrip("/")
    context: dict[str, Any] = {
        "plan": plan,
        "row": history_row(row),
        "status_label": plan.verdict,
        "engine": engine_words(plan.executor),
        "export_refusal": export_refusal(loaded),
        "reserve": reserve,
        "ranks": views,
        "heatmap": heatmap,
        "fleet": fleet_view(views, metric) if views else None,
        "metrics": METRICS,
        "fleet_url": f"/ui/plans/{plan.id}/fleet",
        "page_url": f"/ui/plans/{plan.id}",
        "hot": [v for v in views if v.hot],
        "parts": HBM_PARTS,
        "tables": table_views(loaded),
        "dense": [(d.name, d.style.value, rank_ranges(d.ranks)) for d in plan.dense],
        "kernels": kernels_view(plan.dense),
        "snippet": snippet(base, plan, plan.model_ref),
        "throughput": throughput(plan.predicted_step_ms, loaded.batch, len(plan.ranks)),
        "batch": loaded.batch,
        "time": breakdown.time_view(loaded, views),
        "convergence": convergence_view(plan.solver),
        "solver": plan.solver,
        "side": "",
    }
    return timed(page(request, "plan.html", context), started)


@router.get("/ui/plans/{plan_id}/fleet", response_class=HTMLResponse)
def plan_fleet(plan_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    """The fleet view alone, coloured by ``?metric=`` (``fill``, ``step``, ``compute`` or ``comm``)."""
    started = time.perf_counter()
    loaded = load_plan(session, plan_id)
    if loaded is None:
        return plan_not_found(request, plan_id)
    views = rank_views(loaded.plan.ranks, reserve_of(loaded.row), bars=False)
    metric = metric_of(request.query_params.get("metric"), "fill")
    context = {
        "fleet": fleet_view(views, metric) if views else None,
        "metrics": METRICS,
        "fleet_url": f"/ui/plans/{loaded.plan.id}/fleet",
        "page_url": f"/ui/plans/{loaded.plan.id}",
        "side": "",
    }
    return timed(page(request, "_fleet.html", context), started)


@forms.post("/ui/plans/{plan_id}/delete")
def delete_plan(
    plan_id: str,
    request: Request,
    fields: Annotated[dict[str, str], Depends(sessions.read_form)],
    session: SessionDep,
) -> Response:
    """The plan page's delete button: CSRF-checked (403 page), then the same access as ``DELETE /api/v1/plans/{id}``
    (a login when the service has tokens); back to the history afterwards."""
    sessions.check_csrf(request, fields)
    if not page_access(request, write=True):
        raise LoginRequired(f"{request.scope.get('root_path', '')}/ui/plans/{plan_id}")
    row = repo.plan_by_id(session, plan_id)
    if row is None:
        return plan_not_found(request, plan_id)
    repo.delete_plan(session, row)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/plans", status_code=303)
