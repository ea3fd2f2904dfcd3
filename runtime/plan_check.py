"""Is this plan executable on this module and process group? Every check :func:`~shardwise.runtime.apply.apply_plan`
runs before its first collective, so a bad plan fails the same way on every rank instead of hanging one of them.

:func:`check_plan` lists every problem (names, shapes, tiling, world size, dtypes, data_parallel ranks, dense styles);
:class:`PlanMismatchError` carries them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from shardwise.runtime.replicas import group_view, layout_key
from shardwise.wire.spec import (
    DensePlan,
    DenseStyle,
    Dtype,
    ModelSpec,
    Placement,
    Plan,
    PlanStatus,
    ShardingType,
    TablePlan,
)

__all__ = ["TP_STYLES", "Checked", "PlanMismatchError", "ancestors", "check", "check_plan", "under"]

_TORCH_DTYPES: Mapping[Dtype, torch.dtype] = {
    Dtype.fp32: torch.float32,
    Dtype.fp16: torch.float16,
    Dtype.bf16: torch.bfloat16,
}
TP_STYLES = (DenseStyle.colwise, DenseStyle.rowwise)


#: problems a PlanMismatchError's message lists; the rest are counted (all of them are in ``problems``)
SHOWN_PROBLEMS = 12


class PlanMismatchError(ValueError):
    """The plan does not fit the module or the process group; ``problems`` lists every reason.

    Its message says how many there are and lists them one to a line (the first :data:`SHOWN_PROBLEMS`, then how many
    more), so that a plan made for another model reads as a list, not as one line of hundreds of reasons."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = [f"  - {p}" for p in problems[:SHOWN_PROBLEMS]]
        if len(problems) > SHOWN_PROBLEMS:
            shown.append(f"  ... and {len(problems) - SHOWN_PROBLEMS} more (PlanMismatchError.problems lists them all)")
        many = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        super().__init__(f"plan does not fit the model ({many}):\n" + "\n".join(shown))


@dataclass
class Checked:
    tables: list[tuple[TablePlan, nn.EmbeddingBag | nn.Embedding]] = field(default_factory=list)
    dense: list[tuple[DensePlan, nn.Module]] = field(default_factory=list)
    hosts: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ checks


def ancestors(name: str) -> list[str]:
    """The FQNs of the modules above ``name``: ``"a.b.c"`` → ``["a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def under(name: str, roots: set[str]) -> bool:
    """``name`` is one of ``roots`` or lies inside one of them."""
    return name in roots or any(a in roots for a in ancestors(name))


def _hosts(plan: Plan, world_size: int, problems: list[str]) -> list[int]:
    if not plan.ranks:
        return [0] * world_size
    if len(plan.ranks) != world_size:
        problems.append(f"world size: the plan is for {len(plan.ranks)} ranks, the process group has {world_size}")
        return [0] * world_size
    by_rank = sorted(plan.ranks, key=lambda r: r.rank)
    if [r.rank for r in by_rank] != list(range(world_size)):
        problems.append(f"plan ranks must be numbered 0..{world_size - 1}")
        return [0] * world_size
    return [r.host for r in by_rank]


def _check_tiling(tp: TablePlan, rows: int, cols: int, world_size: int, hosts: Sequence[int]) -> list[str]:
    """The plan's own geometry (:meth:`~shardwise.wire.spec.TablePlan.layout_problems`), then what this executor needs
    on top: a data_parallel copy on every rank (lookups are local), and shards that form column bands, each tiled by
    row blocks (the shape a lookup is routed by)."""
    out = tp.layout_problems(rows, cols, world_size, lambda r: hosts[r], ranks_in="the process group")
    if out:
        return out
    where = f"table {tp.name}"
    if tp.sharding_type is ShardingType.data_parallel:
        if sorted(s.rank for s in tp.shards) != list(range(world_size)):
            out.append(f"{where}: data_parallel needs one copy on every rank (lookups are local)")
        return out
    bands: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s in tp.shards:
        bands.setdefault((s.col_offset, s.num_cols), []).append((s.row_offset, s.num_rows))
    pos = 0
    for c0, nc in sorted(bands):
        if c0 != pos:
            out.append(f"{where}: columns {min(c0, pos)}..{max(c0, pos)} do not form column bands of whole shards")
            return out
        pos = c0 + nc
    return out


def _check_table(
    tp: TablePlan,
    mod: nn.Module | None,
    spec: ModelSpec | None,
    checked: Checked,
    W: int,
    hosts: Sequence[int] | None = None,
) -> None:
    """``tp`` on ``W`` ranks on ``hosts`` (default: the plan's; a 2D plan passes one group's view and hosts)."""
    where = f"table {tp.name}"
    problems = checked.problems
    if mod is None:
        problems.append(f"{where}: the model has no module named {tp.name!r}")
        return
    if not isinstance(mod, (nn.EmbeddingBag, nn.Embedding)):
        problems.append(
            f"{where}: is a {type(mod).__name__}; apply_plan shards nn.EmbeddingBag and nn.Embedding modules only"
        )
        return
    before = len(problems)
    rows, cols = mod.num_embeddings, mod.embedding_dim
    mode = mod.mode if isinstance(mod, nn.EmbeddingBag) else "none"  # nn.Embedding: unpooled, a row per id
    if mode not in ("sum", "mean", "none"):
        problems.append(f"{where}: pooling mode {mode!r} is not supported (sum or mean)")
    for attr in ("padding_idx", "max_norm"):
        if getattr(mod, attr) is not None:
            problems.append(f"{where}: {attr} is not supported")
    if mod.scale_grad_by_freq:
        problems.append(f"{where}: scale_grad_by_freq is not supported")
    if not mod.weight.dtype.is_floating_point:
        problems.append(f"{where}: weight dtype {mod.weight.dtype} is not a floating-point type")
    if spec is not None:
        try:
            t = spec.table(tp.name)
        except KeyError:
            problems.append(f"{where}: not in the model spec {spec.name!r}")
        else:
            if (t.num_embeddings, t.embedding_dim) != (rows, cols):
                problems.append(
                    f"{where}: the spec says {t.num_embeddings} × {t.embedding_dim}, the module is {rows} × {cols}"
                )
            want = _TORCH_DTYPES.get(t.dtype)
            if want is None:
                problems.append(f"{where}: dtype {t.dtype.value} has no executable torch dtype here")
            elif want != mod.weight.dtype:
                problems.append(f"{where}: the spec says {t.dtype.value}, the module's weight is {mod.weight.dtype}")
            if t.pooling.value != mode:
                problems.append(
                    f"{where}: the spec says pooling {t.pooling.value}, the module "
                    + ("is an nn.Embedding (unpooled: pooling none)" if mode == "none" else f"pools by {mode}")
                )
    problems.extend(_check_tiling(tp, rows, cols, W, checked.hosts if hosts is None else hosts))
    if len(problems) == before:
        checked.tables.append((tp, mod))


def _check_dense(
    dp: DensePlan, mod: nn.Module | None, spec: ModelSpec | None, checked: Checked, W: int, is_parameter: bool
) -> None:
    where = f"dense layer {dp.name}"
    problems = checked.problems
    if mod is None and is_parameter:  # describe()'s layer for a parameter held beside tables: replicated as loose
        if dp.style is not DenseStyle.replicate:
            problems.append(f"{where}: a parameter, not a module, runs replicate; the plan says {dp.style.value}")
        if sorted(dp.ranks) != list(range(W)):
            problems.append(f"{where}: must run on all {W} ranks, the plan says {sorted(dp.ranks)}")
        return
    layer = next((d for d in spec.dense_layers if d.name == dp.name), None) if spec is not None else None
    if (layer is not None and layer.num_params == 0) or (mod is not None and not any(True for _ in mod.parameters())):
        return  # compute with no parameters (describe()'s parameterless layers): nothing to place
    if mod is None:
        problems.append(f"{where}: the model has no module named {dp.name!r}")
        return
    before = len(problems)
    if sorted(dp.ranks) != list(range(W)):
        problems.append(f"{where}: must run on all {W} ranks, the plan says {sorted(dp.ranks)}")
    if dp.style in TP_STYLES and not isinstance(mod, nn.Linear):
        problems.append(f"{where}: {dp.style.value} needs an nn.Linear, got {type(mod).__name__}")
    params = list(mod.parameters())
    if not any(p.requires_grad for p in params):
        problems.append(f"{where}: has no trainable parameters")
    if any(p.is_meta for p in params):
        problems.append(f"{where}: has parameters on the meta device; materialise dense layers first")
    if spec is not None and layer is not None and layer.kind == "unclassified":
        count = sum(p.numel() for p in mod.parameters())
        if count != layer.num_params:
            problems.append(f"{where}: the spec says {layer.num_params:,} parameters, the module holds {count:,}")
    elif spec is not None and isinstance(mod, nn.Linear):
        if layer is None:
            problems.append(f"{where}: not in the model spec {spec.name!r}")
        else:
            if (layer.in_features, layer.out_features) != (mod.in_features, mod.out_features):
                problems.append(
                    f"{where}: the spec says {layer.in_features} → {layer.out_features}, the module is "
                    f"{mod.in_features} → {mod.out_features}"
                )
            want = _TORCH_DTYPES.get(layer.dtype)
            if want is not None and want != mod.weight.dtype:
                problems.append(
                    f"{where}: the spec says {layer.dtype.value}, the module's weight is {mod.weight.dtype}"
                )
    if len(problems) == before:
        checked.dense.append((dp, mod))


def _compute_only(plan: Plan, modules: Mapping[str, nn.Module], spec: ModelSpec | None) -> set[str]:
    """The plan's dense entries that hold no parameters (describe()'s parameterless layers)."""
    empty = {d.name for d in spec.dense_layers if d.num_params == 0} if spec is not None else set()
    for d in plan.dense:
        mod = modules.get(d.name)
        if mod is not None and not any(True for _ in mod.parameters()):
            empty.add(d.name)
    return empty & {d.name for d in plan.dense}


def _check_two_d(
    plan: Plan,
    modules: Mapping[str, nn.Module],
    spec: ModelSpec | None,
    checked: Checked,
    world_size: int,
    default_group: bool,
) -> None:
    """A 2D plan (``plan.sparse_groups``): the groups cover the process group's ranks; every table's shards on each
    group tile it as group 0's do, rank for rank (the ``j``-th rank of every group holds the same shards); group 0's
    view passes the 1D checks on its ``G`` ranks; and what the executor does not run in 2D is refused.
    ``checked.tables`` gets group 0's views (group ranks; every group's view is the same, see
    :func:`~shardwise.runtime.replicas.group_view`)."""
    sg = plan.sparse_groups
    assert sg is not None
    problems = checked.problems
    flat = sorted(r for g in sg.groups for r in g)
    if flat != list(range(world_size)):
        problems.append(
            f"sparse_groups: {sg.num_groups} groups of {sg.group_size} cover ranks {_ranges(flat)}, "
            f"but the process group has ranks 0..{world_size - 1}"
        )
        return
    if not default_group:
        problems.append("sparse_groups: a 2D plan runs on the default process group only (its mesh spans the world)")
    first = sg.groups[0]
    hosts = [checked.hosts[r] for r in sorted(first)]
    for tp in plan.tables:
        want = layout_key(tp, first)
        for k, g in enumerate(sg.groups[1:], start=1):
            if layout_key(tp, g) != want:
                problems.append(
                    f"table {tp.name}: group {k} {g} does not hold the shards of group 0 {first} rank for rank "
                    "(the j-th rank of every group must hold the same shards)"
                )
                break
        if any(s.placement is Placement.uvm_cache for s in tp.shards):
            problems.append(
                f"table {tp.name}: uvm_cache shards do not run in a 2D plan (their cache has no replica sync)"
            )
        _check_table(group_view(tp, first), modules.get(tp.name), spec, checked, len(first), hosts)


def _ranges(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"


def check(module: nn.Module, plan: Plan, world_size: int, model_spec: ModelSpec | None, default_group: bool) -> Checked:
    checked = Checked()
    problems = checked.problems
    if plan.status is PlanStatus.infeasible:
        problems.append("the plan is infeasible; there is nothing to apply")
    checked.hosts = _hosts(plan, world_size, problems)
    modules = dict(module.named_modules())
    names = [t.name for t in plan.tables] + [d.name for d in plan.dense]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{n}: named more than once in the plan")
    parameters = {n for n, _ in module.named_parameters()}
    # compute-only and parameter entries place nothing (apply leaves a parameter loose: replicated), so nest in nothing
    entries = set(names) - _compute_only(plan, modules, model_spec) - (parameters - set(modules))
    for b in (n for n in names if n in entries):
        for a in ancestors(b):
            if a in entries:
                problems.append(f"{b}: nested inside {a}; plan entries must not overlap")
    if plan.sparse_groups is None:
        for tp in plan.tables:
            _check_table(tp, modules.get(tp.name), model_spec, checked, world_size)
    else:
        _check_two_d(plan, modules, model_spec, checked, world_size, default_group)
    for dp in plan.dense:
        _check_dense(dp, modules.get(dp.name), model_spec, checked, world_size, dp.name in parameters)
    if model_spec is not None:
        planned = {t.name for t in plan.tables}
        for t in model_spec.embedding_tables:
            if t.name not in planned:
                problems.append(f"table {t.name}: in the model spec but not in the plan")
    if any(d.style in TP_STYLES for d in plan.dense):
        sizes: dict[int, int] = {}
        for h in checked.hosts:
            sizes[h] = sizes.get(h, 0) + 1
        contiguous = checked.hosts == sorted(checked.hosts)
        if len(sizes) > 1 and (len(set(sizes.values())) > 1 or not contiguous):
            problems.append("tensor-parallel dense layers need hosts of equal size with consecutive ranks")
        if len(sizes) > 1 and not default_group:
            problems.append("tensor-parallel dense layers over several hosts need the default process group")
    tables = {t.name for t in plan.tables}
    for name, p in module.named_parameters():
        if p.is_meta and not under(name, tables):
            problems.append(f"parameter {name}: on the meta device and not an embedding table of the plan")
    return checked


def check_plan(module: nn.Module, plan: Plan, *, world_size: int, model_spec: ModelSpec | None = None) -> list[str]:
    """Every reason ``plan`` cannot be applied to ``module`` on ``world_size`` ranks (empty: it can). No collectives."""
    return check(module, plan, world_size, model_spec, default_group=True).problems
