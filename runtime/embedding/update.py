"""Fused embedding backward + optimizer ("optimizer in backward"), with no host synchronisation.

The executor looks up a group of embedding shards that share dim and dtype as one concatenated ``weight``
(``R × C``, each table's rows at an offset); forward is ``F.embedding_bag(ids, weight, offsets, mode="sum")``. Its
backward here builds neither a sparse COO gradient nor a dense table gradient: one pass reduces the output-gradient
rows by id and applies the optimizer to the touched rows in place — FBGEMM's "optimizer in backward" class::

    state = init_state(RowOptimizer.rowwise_adagrad, *weight.shape, weight.device)
    pooled = F.embedding_bag(ids, weight, offsets, mode="sum")       # forward (weight needs no grad)
    ...                                                              # grad_out = d loss / d pooled
    bags = torch.repeat_interleave(torch.arange(B), lengths)         # the output row of every id
    fused_backward_update(weight, state, ids, bags, grad_out, UpdateConfig("rowwise_adagrad", lr=0.01), step=t)

Semantics
---------
For every distinct row ``r`` among ``ids``, ``g_r = Σ_{i: ids[i] = r} grad_out[bags[i]]`` (accumulated in fp32),
then, once per touched row (weights fp32 / fp16 / bf16, read into fp32 and rounded back once; state fp32):

* ``sgd``: ``w_r -= lr·g_r``
* ``adagrad`` (``torch.optim.Adagrad`` on sparse gradients, no lr decay or weight decay):
  ``s_r += g_r²`` (elementwise), ``w_r -= lr·g_r / (√s_r + eps)``
* ``rowwise_adagrad`` (one fp32 per row, as FBGEMM's and :class:`~shardwise.runtime.embedding.optim.RowWiseAdagrad`):
  ``s_r += mean_j g_r[j]²``, ``w_r -= lr·g_r / (√s_r + eps)``
* ``adam`` (``torch.optim.SparseAdam``: lazy, only touched rows' moments move; bias correction by the global step t):
  ``m_r = β1·m_r + (1−β1)·g_r``, ``v_r = β2·v_r + (1−β2)·g_r²``,
  ``w_r -= lr·√(1−β2^t)/(1−β1^t) · m_r / (√v_r + eps)``
  (computed as SparseAdam does: ``m_r += (1−β1)(g_r − m_r)``, likewise ``v_r``)

Untouched rows and their state never change. Ids must lie in ``[0, R)`` and bags in ``[0, B)``: checking them would
read data back to the host, so they are not checked (out-of-range ids are undefined behaviour on the Triton
backend, an indexing error on the torch one).

Padding: ``valid`` (an ``(n,)`` bool mask on the device) leaves out the ids where it is False, as if they were not
in ``ids`` at all — the padding of a fixed-capacity input buffer (:mod:`shardwise.runtime.embedding.padding`). A
zero gradient would not do: Adam's moments decay on it, and an Adagrad row at zero state with ``eps=0`` divides
zero by zero. Left-out ids sort after every real id (their sort key is the key dtype's largest value), the segment
starts end at the device count of real ids instead of ``n``, so every segment from the first left-out position on is
empty:
the real ids get the segments, sums and order they get without the padding (the sort is stable), bit for bit, and
no row a left-out id names is read or written for it. Nothing is read back to the host.

No host synchronisation
-----------------------
Every size is static in ``n`` (the number of ids): the ids are sorted (``torch.sort``; as int32 keys for the Triton
backend where the rows fit, half the radix passes of int64), segment heads marked where a sorted id differs from its
predecessor, each position's segment index is the cumulative sum of the heads, and each head writes its position as
its segment's start into an ``(n + 1)``-long buffer filled with ``n`` (no atomics: a hot row's many ids do not
contend for one address; the Triton backend's heads alone store, the torch one's other positions store into one
slot past the end). There are at
most ``n`` segments; those past the real count (which stays on the device) are inert. Nothing calls ``.item()``,
``.tolist()``, ``torch.unique``, ``nonzero`` or boolean-mask indexing, and no output size depends on the data.

Backends (same semantics)
-------------------------
``"torch"``: torch ops alone, on any device; it holds an ``n × C`` fp32 buffer of per-segment sums (and a few more
of that size for the update). ``"triton"``: one Triton kernel, blocks of segments claimed by a grid of a few
programs per multiprocessor (:mod:`shardwise.runtime.kernels.fused_update` describes the grid, the blocks and the
bytes moved); CUDA tensors, or CPU
tensors under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is imported — tests run it in a
subprocess). ``"auto"`` takes Triton for CUDA tensors when it imports, else torch. Both capture into a CUDA graph
(checked on an H200); Adam's step size is computed on the host from an int ``step``, so a graph captured with one
replays the step it was captured at — pass ``step`` as a device tensor (a counter the graph increments) and it is
computed on the device instead (what :class:`shardwise.runtime.graphed.GraphedStep` does). The Triton backend is
deterministic run to run; the torch one on CUDA is not (``index_add_`` accumulates with atomics).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "RowOptimizer",
    "UpdateConfig",
    "fused_backward_update",
    "init_state",
    "pooled_sum",
    "segments",
    "state_bytes",
    "triton_available",
]


class RowOptimizer(StrEnum):
    """The row optimizers of the fused update; the values are :class:`shardwise.wire.spec.Optimizer`'s."""

    sgd = "sgd"
    adagrad = "adagrad"
    rowwise_adagrad = "rowwise_adagrad"
    adam = "adam"


#: eps when :class:`UpdateConfig` is given none: torch.optim.Adagrad's and FBGEMM's for the Adagrads,
#: torch.optim.SparseAdam's for Adam (SGD has no eps)
DEFAULT_EPS: dict[RowOptimizer, float] = {
    RowOptimizer.sgd: 0.0,
    RowOptimizer.adagrad: 1e-10,
    RowOptimizer.rowwise_adagrad: 1e-10,
    RowOptimizer.adam: 1e-8,
}


@dataclass(frozen=True)
class UpdateConfig:
    """Hyper-parameters of one fused update.

    ``optimizer`` takes a :class:`RowOptimizer` or its string (the wire's ``Optimizer`` too). ``eps`` left at
    ``None`` becomes the optimizer's default on construction (:data:`DEFAULT_EPS`: 1e-10 for ``adagrad`` and
    ``rowwise_adagrad``, 1e-8 for ``adam``, unused by ``sgd``), so ``config.eps`` is always a float afterwards.
    ``beta1`` / ``beta2`` (Adam's moment decays, 0.9 / 0.999 as torch.optim.SparseAdam) are read by ``adam`` alone.
    """

    optimizer: RowOptimizer
    lr: float
    eps: float | None = None
    beta1: float = 0.9
    beta2: float = 0.999

    def __post_init__(self) -> None:
        optimizer = RowOptimizer(self.optimizer)
        object.__setattr__(self, "optimizer", optimizer)
        if self.eps is None:
            object.__setattr__(self, "eps", DEFAULT_EPS[optimizer])
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")
        if not self.epsilon >= 0:
            raise ValueError(f"eps must be non-negative, got {self.eps}")
        for name, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {beta}")

    @property
    def epsilon(self) -> float:
        """``eps`` as a float (the optimizer's default when none was given)."""
        return DEFAULT_EPS[self.optimizer] if self.eps is None else self.eps


def init_state(
    optimizer: RowOptimizer | str, rows: int, cols: int, device: torch.device | str | None = None
) -> dict[str, Tensor]:
    """Zero optimizer state for an ``rows × cols`` weight, all fp32.

    ``sgd``: ``{}``; ``rowwise_adagrad``: ``{"sum": (rows,)}``; ``adagrad``: ``{"sum": (rows, cols)}``;
    ``adam``: ``{"exp_avg": (rows, cols), "exp_avg_sq": (rows, cols)}``. :func:`state_bytes` is its size.
    """
    opt = RowOptimizer(optimizer)
    if opt is RowOptimizer.sgd:
        return {}
    if opt is RowOptimizer.rowwise_adagrad:
        return {"sum": torch.zeros(rows, dtype=torch.float32, device=device)}
    if opt is RowOptimizer.adagrad:
        return {"sum": torch.zeros(rows, cols, dtype=torch.float32, device=device)}
    return {
        "exp_avg": torch.zeros(rows, cols, dtype=torch.float32, device=device),
        "exp_avg_sq": torch.zeros(rows, cols, dtype=torch.float32, device=device),
    }


def state_bytes(optimizer: RowOptimizer | str, rows: int, cols: int) -> int:
    """Bytes of state :func:`init_state` allocates: 0, ``4·rows`` (row-wise Adagrad), ``4·rows·cols`` (Adagrad),
    ``8·rows·cols`` (Adam) — what the cost model's memory check charges."""
    opt = RowOptimizer(optimizer)
    per_row = {
        RowOptimizer.sgd: 0,
        RowOptimizer.rowwise_adagrad: 4,
        RowOptimizer.adagrad: 4 * cols,
        RowOptimizer.adam: 8 * cols,
    }[opt]
    return rows * per_row


#: the state tensors each optimizer takes (init_state's keys)
_STATE_KEYS: dict[RowOptimizer, tuple[str, ...]] = {
    RowOptimizer.sgd: (),
    RowOptimizer.adagrad: ("sum",),
    RowOptimizer.rowwise_adagrad: ("sum",),
    RowOptimizer.adam: ("exp_avg", "exp_avg_sq"),
}

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.cache
def _triton_module() -> ModuleType | None:
    """The kernel module, or None when Triton does not import."""
    try:
        from shardwise.runtime.kernels import fused_update as fused_kernel
    except ImportError:
        return None
    return fused_kernel


def triton_available() -> bool:
    """Whether the Triton backend can be loaded in this process."""
    return _triton_module() is not None


def fused_backward_update(
    weight: Tensor,
    state: dict[str, Tensor],
    ids: Tensor,
    bags: Tensor,
    grad_out: Tensor,
    config: UpdateConfig,
    *,
    step: int | Tensor,
    backend: str = "auto",
    valid: Tensor | None = None,
) -> None:
    """Reduce ``grad_out`` rows by id and apply ``config``'s optimizer to the touched rows of ``weight``, in place.

    ``weight`` (R × C, fp32 / fp16 / bf16) and ``state`` (from :func:`init_state`) are updated in place; ``ids`` (n,)
    int64 are rows of ``weight``, ``bags`` (n,) int64 the output row each id was pooled into, ``grad_out`` (B × C,
    fp32 / fp16 / bf16) the gradient of the pooled rows; ``step`` is the 1-based optimizer step (Adam's bias
    correction): a host int, or a one-element float64 tensor on ``weight``'s device whose value is the step (a
    counter that lives on the device: Adam's step size is then computed there, with no host read). ``backend``:
    ``"auto"``, ``"torch"`` or ``"triton"`` (see the module's docstring). ``valid``: an ``(n,)`` bool mask of the ids
    that take part; the others (padding) are left out as if absent (module docstring, "Padding"). Nothing is read
    back to the host: the call only enqueues work on the tensors' device.
    """
    opt = config.optimizer
    _check(weight, state, ids, bags, grad_out, opt, step)
    if valid is not None and (valid.shape != ids.shape or valid.dtype != torch.bool or valid.device != ids.device):
        raise ValueError(
            f"valid must be a bool mask of the ids' shape {tuple(ids.shape)} on {ids.device}, got "
            f"{tuple(valid.shape)} {valid.dtype} on {valid.device}"
        )
    chosen = _choose_backend(backend, weight)
    n = ids.numel()
    if n == 0:
        return
    with torch.no_grad():
        # the Triton kernel takes int32 row ids: half the sort's radix passes where the rows fit
        narrow = chosen == "triton" and weight.shape[0] < _NARROW_LIMIT
        real = None if valid is None else valid.sum()
        if chosen == "triton":
            mod = _triton_module()
            assert mod is not None  # _choose_backend checked
            sorted_ids, sorted_bags = sort_by_id(ids, bags, valid, narrow=narrow)
            starts = mod.segment_starts(sorted_ids, real)
            _triton_update(weight, state, sorted_ids, sorted_bags, starts, grad_out, config, step)
        else:
            sorted_ids, sorted_bags, seg, starts = segments(ids, bags, valid, narrow=narrow)
            _torch_update(weight, state, sorted_ids, sorted_bags, seg, starts, grad_out, config, step, real)


def pooled_sum(weight: Tensor, ids: Tensor, offsets: Tensor, *, backend: str = "auto", interleave: int = 0) -> Tensor:
    """Sum-pooled rows ``(len(offsets), C)`` of ``weight``: ``embedding_bag(ids, weight, offsets, mode="sum")``, by the
    Triton kernel where :func:`fused_backward_update` would use Triton (``backend`` as there), else by torch.

    The lookup's forward beside its fused backward: one program per bag gathers and sums its rows in fp32, in id
    order. Ids must lie in ``[0, len(weight))`` (not checked: the caller clamps them). ``interleave`` (T > 0): the
    bags are T equal runs (one per table) and the rows come out sample-major, table ``t``'s bag ``s`` at row
    ``s·T + t`` (the Triton kernel writes them there; torch's result is reordered).
    """
    if offsets.numel() == 0:
        return weight.new_zeros((0, weight.shape[1]))
    if interleave < 0 or (interleave and offsets.numel() % interleave):
        raise ValueError(f"interleave={interleave} must divide the {offsets.numel()} bags into equal runs")
    if _choose_backend(backend, weight) == "triton" and weight.stride(1) == 1:
        mod = _triton_module()
        assert mod is not None
        out: Tensor = mod.pooled_rows(weight, ids, offsets, interleave=interleave)
        return out
    rows = F.embedding_bag(ids, weight, offsets, mode="sum")
    if interleave > 1:
        rows = rows.view(interleave, -1, rows.shape[1]).transpose(0, 1).reshape(-1, rows.shape[1])
    return rows


def _check(
    weight: Tensor,
    state: dict[str, Tensor],
    ids: Tensor,
    bags: Tensor,
    grad_out: Tensor,
    opt: RowOptimizer,
    step: int | Tensor,
) -> None:
    """Shapes, dtypes and devices (tensor metadata alone: no data is read)."""
    if weight.dim() != 2 or weight.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"weight must be a 2-D fp32/fp16/bf16 tensor, got {tuple(weight.shape)} {weight.dtype}")
    rows, cols = weight.shape
    if ids.dim() != 1 or bags.dim() != 1 or ids.dtype != torch.int64 or bags.dtype != torch.int64:
        raise ValueError("ids and bags must be 1-D int64 tensors")
    if ids.shape != bags.shape:
        raise ValueError(f"ids and bags must have the same length, got {ids.numel()} and {bags.numel()}")
    if grad_out.dim() != 2 or grad_out.shape[1] != cols or grad_out.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"grad_out must be a (B, {cols}) fp32/fp16/bf16 tensor, got {tuple(grad_out.shape)}")
    for name, t in (("ids", ids), ("bags", bags), ("grad_out", grad_out)):
        if t.device != weight.device:
            raise ValueError(f"{name} is on {t.device}, weight on {weight.device}")
    keys = _STATE_KEYS[opt]
    if set(state) != set(keys):
        raise ValueError(f"{opt.value} takes state {sorted(keys)}, got {sorted(state)}: use init_state")
    shape = (rows,) if opt is RowOptimizer.rowwise_adagrad else (rows, cols)
    for key in keys:
        t = state[key]
        if tuple(t.shape) != shape or t.dtype != torch.float32 or t.device != weight.device or not t.is_contiguous():
            raise ValueError(f"state[{key!r}] must be a contiguous fp32 {shape} tensor on {weight.device}")
    if isinstance(step, Tensor):
        if step.numel() != 1 or step.device != weight.device:
            raise ValueError(
                f"a step tensor must hold one value on {weight.device}, got {tuple(step.shape)} on {step.device}"
            )
    elif opt is RowOptimizer.adam and step < 1:
        raise ValueError(f"step is 1-based, got {step}")


def _choose_backend(backend: str, weight: Tensor) -> str:
    if backend == "torch":
        return "torch"
    if backend == "auto":
        return "triton" if weight.is_cuda and triton_available() else "torch"
    if backend != "triton":
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    mod = _triton_module()
    if mod is None:
        raise RuntimeError("backend='triton' needs Triton, which does not import here")
    if not weight.is_cuda and not mod.interpreting():
        raise RuntimeError(
            "backend='triton' needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before Triton is imported"
        )
    return "triton"


#: rows below this take int32 sort keys with ``narrow`` (the int32 maximum is the left-out key)
_NARROW_LIMIT = torch.iinfo(torch.int32).max


def sort_by_id(
    ids: Tensor, bags: Tensor, valid: Tensor | None = None, *, narrow: bool = False
) -> tuple[Tensor, Tensor]:
    """``(sorted_ids, sorted_bags)``: the ids sorted (stable) and each one's bag beside it, as :func:`segments`
    returns them (``narrow``: int32 keys; ``valid``: the left-out ids last, with the key dtype's maximum)."""
    key = ids.to(torch.int32) if narrow else ids
    if valid is not None:
        key = torch.where(valid, key, torch.iinfo(key.dtype).max)
    sorted_ids, perm = torch.sort(key, stable=True)
    return sorted_ids, bags.index_select(0, perm)


def segments(
    ids: Tensor, bags: Tensor, valid: Tensor | None = None, *, narrow: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sort the ids and find the segments of equal ids, with sizes static in n (n ≥ 1).

    Returns ``sorted_ids`` (n,), ``sorted_bags`` (n,), ``seg`` (n,) — the segment of each sorted position, 0-based —
    and ``starts`` (n + 1,) — the first sorted position of each segment, ``n`` for every index at or past the
    segment count (so ``starts[k + 1]`` ends segment ``k``). ``narrow``: the ids are sorted as int32 keys (half the
    radix sort's passes) and ``sorted_ids`` is int32; every id must be below the int32 maximum.

    With ``valid`` (module docstring, "Padding") the left-out ids sort last, with the key's dtype's maximum in
    ``sorted_ids``, and ``starts`` holds the count ``m`` of real ids (on the device) where it would hold ``n``:
    the segments of the left-out ids (at most one, the key being one value) and every index past them start and end
    at ``m``, empty; the first ``m`` positions are what the real ids alone give.

    A segment's start is the position of its head (the first of its ids in sorted order), written by the heads alone:
    the other positions write into one slot past the end, which is dropped.
    """
    n = ids.numel()
    sorted_ids, sorted_bags = sort_by_id(ids, bags, valid, narrow=narrow)
    head = torch.ones(n, dtype=torch.bool, device=ids.device)
    head[1:] = sorted_ids[1:] != sorted_ids[:-1]
    seg = torch.cumsum(head, 0) - 1
    positions = torch.arange(n, dtype=torch.int64, device=ids.device)
    if valid is None:
        starts = torch.full((n + 2,), n, dtype=torch.int64, device=ids.device)
    else:  # left-out positions (the last n - m) give m, the fill: their segment starts, empty, at m
        real = valid.sum()
        starts = real.expand(n + 2).clone()
        positions = torch.minimum(positions, real)
    starts.scatter_(0, torch.where(head, seg, n + 1), positions)
    return sorted_ids, sorted_bags, seg, starts[: n + 1]


def _torch_update(
    weight: Tensor,
    state: dict[str, Tensor],
    sorted_ids: Tensor,
    sorted_bags: Tensor,
    seg: Tensor,
    starts: Tensor,
    grad_out: Tensor,
    config: UpdateConfig,
    step: int | Tensor,
    real: Tensor | None = None,
) -> None:
    """The update in torch ops, over all n possible segments.

    Segment ``k`` sums its gradient rows into ``g[k]`` (an ``n × C`` fp32 buffer, ``index_add_``). Each segment's
    row is ``sorted_ids[starts[k]]``; past the segment count ``starts[k] = n`` is clamped to ``n - 1``, the last
    segment's row. Every segment computes its new row (the inert ones from a zero gradient), then the inert ones
    take the last real segment's results (``index_select`` by ``min(k, last)``), so the scatter back writes that row
    several times with the same bits: untouched rows are never written, and no count reaches the host.

    ``real``: the device count ``m`` of real ids when some were left out (:func:`segments`): positions are clamped
    to ``m - 1`` instead, so the segments from the left-out one on are inert the same way (the left-out ids' sums
    go to the left-out segment, whose result is replaced); with no real id at all every segment writes the row it
    read back unchanged (that row clamped into the weight: it is a left-out key).
    """
    n = sorted_ids.numel()
    cols = weight.shape[1]
    eps = config.epsilon
    g = torch.zeros(n, cols, dtype=torch.float32, device=weight.device)
    g.index_add_(0, seg, grad_out.index_select(0, sorted_bags).float())
    if real is None:
        rows = sorted_ids.index_select(0, starts[:n].clamp(max=n - 1))
        last = seg[-1]
        none: Tensor | None = None
    else:
        end = (real - 1).clamp(min=0)  # the last real position (0 when there is none)
        rows = sorted_ids.index_select(0, torch.minimum(starts[:n], end)).clamp_(max=weight.shape[0] - 1)
        last = seg.index_select(0, end.reshape(1)).squeeze(0)
        none = real == 0
    live = torch.minimum(torch.arange(n, device=weight.device), last)  # k, or the last real segment past it

    def write(target: Tensor, new: Tensor) -> None:
        picked = new.index_select(0, live).to(target.dtype)
        if none is not None:  # no real id: write back what was read
            picked = torch.where(none, target.index_select(0, rows), picked)
        target.index_copy_(0, rows, picked)

    w = weight.index_select(0, rows).float()
    opt = config.optimizer
    if opt is RowOptimizer.sgd:
        w.sub_(config.lr * g)
    elif opt is RowOptimizer.adagrad:
        s = state["sum"].index_select(0, rows).add_(g * g)
        w.sub_(config.lr * (g / s.sqrt().add_(eps)))
        write(state["sum"], s)
    elif opt is RowOptimizer.rowwise_adagrad:
        s = state["sum"].index_select(0, rows).add_((g * g).mean(dim=1))
        w.sub_(config.lr * (g / s.sqrt().add_(eps).unsqueeze(1)))
        write(state["sum"], s)
    else:
        m = state["exp_avg"].index_select(0, rows)
        v = state["exp_avg_sq"].index_select(0, rows)
        m.add_((g - m).mul_(1.0 - config.beta1))
        v.add_((g * g - v).mul_(1.0 - config.beta2))
        w.sub_(_adam_step_size(config, step) * (m / v.sqrt().add_(eps)))
        write(state["exp_avg"], m)
        write(state["exp_avg_sq"], v)
    write(weight, w)


def _adam_step_size(config: UpdateConfig, step: int | Tensor) -> float | Tensor:
    """``lr·√(1−β2^t)/(1−β1^t)``: on the host for an int ``step``; for a device tensor, on the device in float64 and
    returned as a one-element fp32 tensor (nothing read back)."""
    if isinstance(step, Tensor):
        t = step.to(torch.float64).reshape(1)
        return (config.lr * torch.sqrt(1.0 - config.beta2**t) / (1.0 - config.beta1**t)).to(torch.float32)
    return config.lr * math.sqrt(1.0 - config.beta2**step) / (1.0 - config.beta1**step)


def _triton_update(
    weight: Tensor,
    state: dict[str, Tensor],
    sorted_ids: Tensor,
    sorted_bags: Tensor,
    starts: Tensor,
    grad_out: Tensor,
    config: UpdateConfig,
    step: int | Tensor,
) -> None:
    mod = _triton_module()
    assert mod is not None  # _choose_backend checked
    if weight.stride(1) != 1:
        raise ValueError("the Triton backend updates weight in place and needs unit column stride")
    if grad_out.stride(1) != 1:
        grad_out = grad_out.contiguous()
    opt = config.optimizer
    codes = {
        RowOptimizer.sgd: mod.SGD,
        RowOptimizer.adagrad: mod.ADAGRAD,
        RowOptimizer.rowwise_adagrad: mod.ROWWISE_ADAGRAD,
        RowOptimizer.adam: mod.ADAM,
    }
    keys = _STATE_KEYS[opt]
    mod.launch(
        weight,
        state[keys[0]] if keys else None,
        state[keys[1]] if len(keys) > 1 else None,
        sorted_ids,
        sorted_bags,
        starts,
        grad_out,
        opt=codes[opt],
        lr=config.lr,
        eps=config.epsilon,
        beta1=config.beta1,
        beta2=config.beta2,
        step_size=_adam_step_size(config, step) if opt is RowOptimizer.adam else 0.0,
    )
