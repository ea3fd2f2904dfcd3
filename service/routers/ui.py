"""The web pages: the plan history, one plan, two plans side by side.

Server-rendered with Jinja2 (autoescaped), no JS build: ``service/static`` holds a vendored htmx, a small style
sheet and a few lines of script (table search, copy button). The history's filters and pager ask htmx to fetch
``/ui/plans`` with ``HX-Request`` set; the route then answers only the results fragment, which htmx swaps in place
and whose URL it pushes, so the page never reloads and every state has a URL (a plain request gets the full page).

Everything a template shows is computed here into small frozen view objects — bar geometry in SVG user units,
fills, colours, labels — so the templates stay loops and the numbers are testable. Errors on these routes are HTML
pages (404 for an unknown plan, 400 for missing or bad parameters), not the API's problem+json.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from shardwise.service import repository as repo
from shardwise.service.auth import ReadAccess
from shardwise.service.db import SessionDep
from shardwise.service.models import PlanRow
from shardwise.solver.extract import solver_version
from shardwise.wire.port_spec import PortReport
from shardwise.wire.resources import StoredPlan
from shardwise.wire.spec import FleetSpec, HbmBreakdown, ModelSpec, Plan, PlanStatus, RankPlan, SolveParams, TablePlan

router = APIRouter(include_in_schema=False, dependencies=[ReadAccess])

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

PAGE_SIZE = 25  # history rows per page unless ?limit= says otherwise
HEATMAP_ABOVE = 64  # more GPUs than this: one heatmap cell per GPU instead of one bar each
HOT_FILL = 0.9  # a rank whose HBM is fuller than this is flagged
BAR_UNITS = 1000.0  # SVG user units of the largest capacity (or the longest step) in a plan
CHOICES_LIMIT = 500  # distinct values offered per filter

STATUS_LABELS = {
    PlanStatus.optimal.value: "proved optimal",
    PlanStatus.feasible.value: "best found",
    PlanStatus.infeasible.value: "infeasible",
}

# the HBM categories in stacking order: (HbmBreakdown field, label)
HBM_PARTS: tuple[tuple[str, str], ...] = (
    ("weights", "weights"),
    ("optimizer", "optimizer state"),
    ("gradients", "gradients"),
    ("buffers", "buffers"),
    ("cache", "cache"),
    ("dense", "dense layers"),
)


# ------------------------------------------------------------------------------------------------- formatting


def gb(n: float | None) -> str:
    """Decimal gigabytes with one decimal: ``62.1 GB`` (``< 0.1 GB`` rather than a misleading ``0.0 GB``)."""
    if n is None:
        return "—"
    return "< 0.1 GB" if 0 < n < 0.05e9 else f"{n / 1e9:.1f} GB"


def ms(n: float | None) -> str:
    return "—" if n is None else f"{n:.3f} ms"


def pct(f: float | None, digits: int = 1) -> str:
    return "—" if f is None else f"{f * 100:.{digits}f}%"


def when(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7]`` → ``0–3, 7``."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}–{ordered[j]}")
        i = j + 1
    return ", ".join(out)


_FILL_STOPS = ((0.0, (238, 244, 251)), (0.5, (107, 174, 214)), (0.8, (33, 113, 181)), (1.0, (8, 48, 107)))
_TIME_STOPS = ((0.0, (254, 243, 224)), (0.6, (253, 174, 97)), (1.0, (179, 88, 6)))
HOT_COLOUR = "#c62828"
STEPS = 10  # heatmap colour classes: f0..f9 for fills up to HOT_FILL ("hot" above), t0..t9 for step times


def _ramp(stops: Sequence[tuple[float, tuple[int, int, int]]], f: float) -> str:
    f = min(max(f, 0.0), 1.0)
    for (f0, c0), (f1, c1) in pairwise(stops):
        if f <= f1:
            t = (f - f0) / (f1 - f0)
            r, g, b = (round(a + (z - a) * t) for a, z in zip(c0, c1, strict=True))
            return f"#{r:02x}{g:02x}{b:02x}"
    raise AssertionError("unreachable: the stops end at 1.0")


def fill_class(fill: float) -> str:
    return "hot" if fill > HOT_FILL else f"f{min(int(fill / HOT_FILL * STEPS), STEPS - 1)}"


def time_class(share: float) -> str:
    return f"t{min(max(int(share * STEPS), 0), STEPS - 1)}"


# the heatmap colours, one rule per class (emitted in the page that draws a heatmap)
HEATMAP_CSS = " ".join(
    [f".f{i}{{background:{_ramp(_FILL_STOPS, (i + 0.5) / STEPS)}}}" for i in range(STEPS)]
    + [f".t{i}{{background:{_ramp(_TIME_STOPS, (i + 0.5) / STEPS)}}}" for i in range(STEPS)]
    + [f".hot.cell,.ramp .hot{{background:{HOT_COLOUR}}}"]
)
FILL_CLASSES = [f"f{i}" for i in range(STEPS)] + ["hot"]  # the legend, coolest first


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,  # every template is HTML
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(gb=gb, ms=ms, pct=pct, when=when)
    env.globals.update(version=solver_version(), status_labels=STATUS_LABELS, hot_fill=HOT_FILL)
    return env


templates = Jinja2Templates(env=_env())


def _page(
    request: Request,
    name: str,
    context: dict[str, Any],
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> HTMLResponse:
    ctx = {"root": request.scope.get("root_path", ""), **context}
    return templates.TemplateResponse(request, name, ctx, status_code=status_code, headers=headers)


def error_page(request: Request, status: int, title: str, detail: str, **extra: Any) -> HTMLResponse:
    return _page(request, "error.html", {"status": status, "title": title, "detail": detail, **extra}, status)


class BadParam(ValueError):
    """A query parameter the page cannot use (answered with a 400 page)."""


# ------------------------------------------------------------------------------------------------- history


@dataclass(frozen=True)
class HistoryRow:
    id: str
    created_at: datetime
    model: str
    fleet: str
    gpus: str  # "2× nvidia-h100-sxm + 2× nvidia-h200"
    world_size: int
    status: str
    solver: str
    predicted_step_ms: float | None
    gap: float | None
    peak_fill: float | None

    @property
    def hot(self) -> bool:
        return self.peak_fill is not None and self.peak_fill > HOT_FILL

    @property
    def bar_pct(self) -> float:
        return round(min(self.peak_fill or 0.0, 1.0) * 100, 1)


def gpu_mix(counts: Mapping[str, int]) -> str:
    return " + ".join(f"{n}× {gpu}" for gpu, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def history_row(row: PlanRow) -> HistoryRow:
    """The page's row: the API's ``PlanSummary`` of the plan, with the GPU mix spelled out."""
    s = repo.summary(row)
    return HistoryRow(
        id=s.id,
        created_at=s.created_at,
        model=s.model,
        fleet=s.fleet,
        gpus=gpu_mix(s.gpu_types),
        world_size=s.world_size,
        status=s.status.value,
        solver=s.solver,
        predicted_step_ms=s.predicted_step_ms,
        gap=s.gap,
        peak_fill=s.peak_hbm_fill,
    )


@dataclass(frozen=True)
class Choices:
    models: Sequence[str]
    fleets: Sequence[str]
    gpus: Sequence[str]


def filter_choices(session: Session) -> Choices:
    """The distinct models, fleets and GPU types in the store, for the filter menus."""
    return Choices(
        repo.plan_model_names(session, CHOICES_LIMIT),
        repo.plan_fleet_names(session, CHOICES_LIMIT),
        repo.plan_gpu_types(session, CHOICES_LIMIT),
    )


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParam(f"{name} must be a whole number, not {raw!r}") from None
    if not lo <= value <= hi:
        raise BadParam(f"{name} must be between {lo} and {hi}, not {value}")
    return value


def _filters(request: Request) -> tuple[repo.PlanFilters, dict[str, str]]:
    """The history filters from the query string, and the non-empty ones as strings (for links)."""
    q = request.query_params
    given = {k: q.get(k, "").strip() for k in ("model", "fleet", "gpu", "status")}
    given = {k: v for k, v in given.items() if v}
    for key, value in given.items():
        if len(value) > 200:
            raise BadParam(f"{key} is longer than 200 characters")
    status: PlanStatus | None = None
    if "status" in given:
        try:
            status = PlanStatus(given["status"])
        except ValueError:
            known = ", ".join(s.value for s in PlanStatus)
            raise BadParam(f"status must be one of {known}, not {given['status']!r}") from None
    filters = repo.PlanFilters(given.get("model"), given.get("fleet"), given.get("gpu"), status)
    return filters, given


@router.get("/")
def root(request: Request) -> RedirectResponse:
    return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/plans", status_code=302)


@router.get("/ui")
def ui_root(request: Request) -> RedirectResponse:
    return root(request)


@router.get("/ui/plans", response_class=HTMLResponse)
def history(request: Request, session: SessionDep) -> Response:
    settings = request.app.state.settings
    try:
        filters, given = _filters(request)
        page = _int_param(request, "page", 1, 1, 1_000_000)
        limit = _int_param(request, "limit", PAGE_SIZE, 1, settings.max_page_size)
    except BadParam as exc:
        return error_page(request, 400, "Bad request", str(exc))
    rows, pagination = repo.list_plans(session, filters, page, limit)
    keep = dict(given, **({"limit": str(limit)} if limit != PAGE_SIZE else {}))

    def page_url(n: int) -> str:
        query = urlencode({**keep, **({"page": str(n)} if n > 1 else {})})
        return "/ui/plans" + (f"?{query}" if query else "")

    context: dict[str, Any] = {
        "rows": [history_row(r) for r in rows],
        "pagination": pagination,
        "filters": given,
        "first_url": page_url(1),
        "prev_url": page_url(page - 1) if page > 1 else None,
        "next_url": page_url(page + 1) if page < pagination.max_page else None,
        "filtered": bool(given),
    }
    headers = {"Vary": "HX-Request"}
    if request.headers.get("HX-Request") and not request.headers.get("HX-History-Restore-Request"):
        # the URL htmx pushes: this state's canonical one, without the form's empty fields
        headers["HX-Push-Url"] = request.scope.get("root_path", "") + page_url(page)
        return _page(request, "_plan_results.html", context, headers=headers)
    choices = filter_choices(session)
    context["choices"] = Choices(  # a value from the URL that the store lacks stays visible in its menu
        *(
            [*values, given[key]] if key in given and given[key] not in values else values
            for key, values in (("model", choices.models), ("fleet", choices.fleets), ("gpu", choices.gpus))
        )
    )
    context["statuses"] = [s.value for s in PlanStatus]
    return _page(request, "plans.html", context, headers=headers)


# ------------------------------------------------------------------------------------------------- one plan


@dataclass(frozen=True)
class Segment:
    kind: str
    label: str
    bytes: int
    x: float
    width: float


@dataclass(frozen=True)
class RankView:
    rank: int
    host: int
    gpu: str
    capacity: int
    used: int
    limit: int  # capacity × (1 − reserve)
    fill: float
    hot: bool
    cap_width: float  # the bar's full length (capacity) in SVG units
    limit_x: float  # where the reserve starts
    segments: tuple[Segment, ...]
    compute_ms: float
    comm_ms: float
    total_ms: float
    compute_width: float
    comm_width: float
    fill_class: str  # heatmap colour class
    time_class: str


def _parts(b: HbmBreakdown, used: int) -> list[tuple[str, str, int]]:
    parts = [(field, label, int(getattr(b, field))) for field, label in HBM_PARTS]
    rest = used - sum(n for _, _, n in parts)
    if rest > 0:  # a plan written before the breakdown was complete
        parts.append(("other", "other", rest))
    return [p for p in parts if p[2] > 0]


def rank_views(ranks: Sequence[RankPlan], reserve: float) -> list[RankView]:
    """Bars on one scale for the whole plan: ``BAR_UNITS`` is the largest capacity (HBM) or the slowest rank's
    step (time), so that lengths compare across GPUs of different sizes."""
    max_cap = max((r.hbm_capacity_bytes for r in ranks), default=0) or 1
    max_ms = max((r.predicted_ms.compute + r.predicted_ms.comm for r in ranks), default=0.0) or 1.0
    scale = BAR_UNITS / max_cap
    tscale = BAR_UNITS / max_ms
    out: list[RankView] = []
    for r in ranks:
        x = 0.0
        segments: list[Segment] = []
        for kind, label, n in _parts(r.hbm_breakdown, r.hbm_used_bytes):
            w = n * scale
            segments.append(Segment(kind, label, n, round(x, 3), round(w, 3)))
            x += w
        cap = r.hbm_capacity_bytes
        fill = r.hbm_used_bytes / cap if cap else 0.0
        limit = math.floor(cap * (1 - reserve))
        t = r.predicted_ms
        out.append(
            RankView(
                rank=r.rank,
                host=r.host,
                gpu=r.gpu,
                capacity=cap,
                used=r.hbm_used_bytes,
                limit=limit,
                fill=fill,
                hot=fill > HOT_FILL,
                cap_width=round(cap * scale, 3),
                limit_x=round(limit * scale, 3),
                segments=tuple(segments),
                compute_ms=t.compute,
                comm_ms=t.comm,
                total_ms=t.total,
                compute_width=round(t.compute * tscale, 3),
                comm_width=round(t.comm * tscale, 3),
                fill_class=fill_class(fill),
                time_class=time_class((t.compute + t.comm) / max_ms),
            )
        )
    return out


@dataclass(frozen=True)
class HostCells:
    host: int
    gpu: str
    ranks: tuple[RankView, ...]


def by_host(views: Sequence[RankView]) -> list[HostCells]:
    hosts: dict[int, list[RankView]] = {}
    for v in views:
        hosts.setdefault(v.host, []).append(v)
    return [HostCells(h, rs[0].gpu, tuple(rs)) for h, rs in hosts.items()]


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


def placement_label(tp: TablePlan) -> str:
    """``hbm``; ``uvm_cache 25%``; ``hbm ×6, host ×2``."""
    labels: dict[str, int] = {}
    for s in tp.shards:
        label = s.placement.value
        if s.cache_fraction is not None:
            label += f" {s.cache_fraction * 100:.0f}%"
        labels[label] = labels.get(label, 0) + 1
    if len(labels) == 1:
        return next(iter(labels))
    return ", ".join(f"{label} ×{n}" for label, n in sorted(labels.items()))


def table_views(plan: Plan, model: ModelSpec | None) -> list[TableView]:
    specs = {t.name: t for t in model.embedding_tables} if model is not None else {}
    out: list[TableView] = []
    for tp in plan.tables:
        spec = specs.get(tp.name)
        shape = f"{spec.num_embeddings:,} × {spec.embedding_dim} {spec.dtype.value}" if spec else ""
        ranks = {s.rank for s in tp.shards}
        out.append(
            TableView(
                name=tp.name,
                sharding_type=tp.sharding_type.value,
                ranks=rank_ranges(ranks),
                num_ranks=len(ranks),
                placement=placement_label(tp),
                shards=len(tp.shards),
                shape=shape,
                weight_bytes=spec.weight_bytes if spec else None,
            )
        )
    return out


def _model_of(row: PlanRow) -> ModelSpec | None:
    try:
        return ModelSpec.model_validate(row.request["model"])
    except (KeyError, TypeError, ValueError):  # a request stored in another shape: the page shows no sizes
        return None


def reserve_of(row: PlanRow) -> float:
    fleet = row.request.get("fleet") if isinstance(row.request, Mapping) else None
    value = fleet.get("hbm_reserve_fraction", 0.1) if isinstance(fleet, Mapping) else 0.1
    return float(value)


def snippet(base_url: str, plan: Plan) -> str:
    world = len(plan.ranks)
    return f"""import os

import torch
import torch.distributed as dist

from shardwise.clients.apply import apply_plan
from shardwise.clients.client import ShardwiseClient

# launch with torchrun: one process per rank of the plan ({world} in all)
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
plan = ShardwiseClient("{base_url}").get_plan("{plan.id}")
model = build_model()  # your nn.Module, its tables and dense layers named as in the plan
model = apply_plan(model, plan)  # shards it in place on this rank's GPU
"""


def _load(session: Session, plan_id: str) -> tuple[PlanRow, StoredPlan] | None:
    row = repo.plan_by_id(session, plan_id)
    return None if row is None else (row, repo.stored_plan(row))


def _not_found(request: Request, plan_id: str) -> HTMLResponse:
    return error_page(request, 404, "Plan not found", f"No plan has the id {plan_id!r}.")


@router.get("/ui/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(plan_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    loaded = _load(session, plan_id)
    if loaded is None:
        return _not_found(request, plan_id)
    row, plan = loaded
    reserve = reserve_of(row)
    views = rank_views(plan.ranks, reserve)
    heatmap = len(views) > HEATMAP_ABOVE
    base = str(request.base_url).rstrip("/")
    context: dict[str, Any] = {
        "plan": plan,
        "row": history_row(row),
        "status_label": STATUS_LABELS.get(plan.status.value, plan.status.value),
        "reserve": reserve,
        "ranks": views,
        "heatmap": heatmap,
        "hosts": by_host(views) if heatmap else [],
        "hot": [v for v in views if v.hot],
        "fullest": sorted(views, key=lambda v: (-v.fill, v.rank))[:8] if heatmap else [],
        "slowest": sorted(views, key=lambda v: (-v.total_ms, v.rank))[:8] if heatmap else [],
        "parts": HBM_PARTS,
        "tables": table_views(plan, _model_of(row)),
        "dense": [(d.name, d.style.value, rank_ranges(d.ranks)) for d in plan.dense],
        "snippet": snippet(base, plan),
        "fill_classes": FILL_CLASSES,
        "heatmap_css": HEATMAP_CSS,
    }
    return _page(request, "plan.html", context)


# ------------------------------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class Layout:
    sharding_type: str
    ranks: str
    placement: str

    def __str__(self) -> str:
        return f"{self.sharding_type} on {self.ranks} ({self.placement})"


@dataclass(frozen=True)
class TableMove:
    name: str
    a: Layout | None
    b: Layout | None
    changes: tuple[str, ...]  # "sharding type", "ranks", "placement", "shard bounds", "only in A", "only in B"

    @property
    def moved(self) -> bool:
        return bool(self.changes)


def _layout(tp: TablePlan) -> Layout:
    return Layout(tp.sharding_type.value, rank_ranges(s.rank for s in tp.shards), placement_label(tp))


def _tiers(t: TablePlan) -> list[tuple[int, str, float]]:
    return sorted((s.rank, s.placement.value, s.cache_fraction or 0.0) for s in t.shards)


def _bounds(t: TablePlan) -> list[tuple[int, int, int, int, int]]:
    return sorted((s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in t.shards)


def table_moves(a: Plan, b: Plan) -> list[TableMove]:
    """Every table of either plan and what differs between its two layouts: moved ones first, each group in the
    plans' table order. A table moved when its sharding type, its ranks, its placements or its shard bounds differ."""
    ta = {t.name: t for t in a.tables}
    tb = {t.name: t for t in b.tables}
    out: list[TableMove] = []
    for name in [*ta, *(n for n in tb if n not in ta)]:
        x, y = ta.get(name), tb.get(name)
        if x is None or y is None:
            out.append(
                TableMove(
                    name, _layout(x) if x else None, _layout(y) if y else None, ("only in A" if x else "only in B",)
                )
            )
            continue
        changes: list[str] = []
        if x.sharding_type != y.sharding_type:
            changes.append("sharding type")
        if sorted({s.rank for s in x.shards}) != sorted({s.rank for s in y.shards}):
            changes.append("ranks")
        if placement_label(x) != placement_label(y) or ("ranks" not in changes and _tiers(x) != _tiers(y)):
            changes.append("placement")
        if not changes and _bounds(x) != _bounds(y):
            changes.append("shard bounds")
        out.append(TableMove(name, _layout(x), _layout(y), tuple(changes)))
    out.sort(key=lambda m: not m.moved)  # stable: moved first, each group in plan order
    return out


@dataclass(frozen=True)
class FillPair:
    rank: int
    a: RankView | None
    b: RankView | None


@dataclass(frozen=True)
class Side:
    label: str
    row: HistoryRow
    plan: StoredPlan
    status_label: str
    ranks: list[RankView]
    hosts: list[HostCells]


def _side(label: str, row: PlanRow, plan: StoredPlan, heatmap: bool) -> Side:
    views = rank_views(plan.ranks, reserve_of(row))
    return Side(
        label,
        history_row(row),
        plan,
        STATUS_LABELS.get(plan.status.value, ""),
        views,
        by_host(views) if heatmap else [],
    )


def _recent(session: Session, n: int = 50) -> list[HistoryRow]:
    rows, _ = repo.list_plans(session, repo.PlanFilters(), 1, n)
    return [history_row(r) for r in rows]


def port_view(row_a: PlanRow, row_b: PlanRow) -> PortReport | None:
    """When A and B plan the same model on two fleets, B is a re-plan of A's port: the port analysis of A's plan
    carried rank for rank onto B's fleet, against B (the same report as ``POST /api/v1/port``)."""
    from shardwise.solver.port import PortError, port_analysis

    req_a, req_b = row_a.request, row_b.request
    if req_a["model"] != req_b["model"] or req_a["fleet"] == req_b["fleet"]:
        return None
    source = Plan.model_validate(row_a.body)
    if source.status is PlanStatus.infeasible:
        return None
    try:
        return port_analysis(
            ModelSpec.model_validate(req_a["model"]),
            FleetSpec.model_validate(req_a["fleet"]),
            FleetSpec.model_validate(req_b["fleet"]),
            SolveParams.model_validate(req_b["options"]),
            source_plan=source,
            target_plan=Plan.model_validate(row_b.body),
        )
    except PortError:
        return None


@router.get("/ui/compare", response_class=HTMLResponse)
def compare(request: Request, session: SessionDep) -> HTMLResponse:
    a_id = request.query_params.get("a", "").strip()
    b_id = request.query_params.get("b", "").strip()
    if not a_id or not b_id:  # the bare page (the nav link) is a picker; a half-given pair is a 400 with one
        status, detail = 200, "Choose the two plans to compare."
        if a_id or b_id:
            status, detail = 400, f"The comparison needs two plan ids, ?a=…&b=…; {'b' if a_id else 'a'} is missing."
        return error_page(request, status, "Pick two plans", detail, pick=_recent(session), a=a_id, b=b_id)
    loaded_a, loaded_b = _load(session, a_id), _load(session, b_id)
    if loaded_a is None or loaded_b is None:
        return _not_found(request, a_id if loaded_a is None else b_id)
    heatmap = max(len(loaded_a[1].ranks), len(loaded_b[1].ranks)) > HEATMAP_ABOVE
    a = _side("A", *loaded_a, heatmap)
    b = _side("B", *loaded_b, heatmap)
    pairs: list[FillPair] = []
    if not heatmap:
        for i in range(max(len(a.ranks), len(b.ranks))):
            pairs.append(
                FillPair(i, a.ranks[i] if i < len(a.ranks) else None, b.ranks[i] if i < len(b.ranks) else None)
            )
    ratio = None
    if a.plan.predicted_step_ms and b.plan.predicted_step_ms is not None:
        ratio = b.plan.predicted_step_ms / a.plan.predicted_step_ms
    moves = table_moves(a.plan, b.plan)
    context: dict[str, Any] = {
        "port": port_view(loaded_a[0], loaded_b[0]),
        "a": a,
        "b": b,
        "ratio": ratio,
        "pairs": pairs,
        "heatmap": heatmap,
        "fill_classes": FILL_CLASSES,
        "heatmap_css": HEATMAP_CSS,
        "moves": [m for m in moves if m.moved],
        "unmoved": [m for m in moves if not m.moved],
    }
    return _page(request, "compare.html", context)


@router.get("/ui/{rest:path}")
def ui_not_found(rest: str, request: Request) -> Response:
    if rest.endswith("/") and rest.strip("/"):  # /ui/plans/ → /ui/plans
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/{rest.rstrip('/')}{query}", status_code=307)
    return error_page(request, 404, "Page not found", f"There is no page at /ui/{rest}.")
