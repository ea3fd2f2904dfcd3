"""fused_backward_update: the fused embedding backward + optimizer, against plain torch autograd and torch.optim.

* The torch backend, per optimizer × weight dtype × width, over 3 steps with the state carried, against a reference
  built from ``F.embedding_bag(..., sparse=True)`` on a leaf copy of the weight, ``.backward(grad_out)`` and the
  matching torch.optim optimizer (SGD, Adagrad, SparseAdam; row-wise Adagrad written out on the coalesced gradient).
  fp16 / bf16 weights: the reference keeps an fp32 copy rounded to the weight's dtype after every step (what the
  fused update stores), so the two differ by op order alone; rows no step touched stay equal bit for bit.
* The Triton backend under Triton's interpreter (CPU tensors) against the torch backend, every optimizer, 2 steps,
  tiny shapes. ``TRITON_INTERPRET=1`` must be set before Triton is imported, so those cases run in one subprocess
  (this file's :func:`run_triton_cases`, started with the module's first test and read by the interpreter tests)
  and this process never sees the variable.
* Edge cases: no ids, one row taking every id, ids on the last row; the state's layout and size; refused inputs.
* On a CUDA machine (skipped elsewhere): the Triton kernel against the torch backend at full widths, under
  ``torch.cuda.set_sync_debug_mode("error")`` (a host synchronisation raises), and both backends captured into a
  CUDA graph and replayed on a new batch.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import interpreter_support
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402  (after the importorskip)

from shardwise.runtime.embedding.update import (  # noqa: E402
    RowOptimizer,
    UpdateConfig,
    fused_backward_update,
    init_state,
    pooled_sum,
    segments,
    state_bytes,
    triton_available,
)

pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")  # torch.optim.Adagrad's


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: weight tolerance per dtype (rtol = atol): fp32 op-order noise; about two units in the last place otherwise
WEIGHT_TOL = {"fp32": 2e-5, "fp16": 2e-3, "bf16": 1.6e-2}
STATE_TOL = 2e-5  # the state is fp32 and sees the same fp32 gradients in both
LR = {RowOptimizer.sgd: 0.05, RowOptimizer.adagrad: 0.1, RowOptimizer.rowwise_adagrad: 0.1, RowOptimizer.adam: 0.01}


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for these tiny tensors: on a shared machine, OpenMP's fork-join around a 30-row
    ``index_add_`` costs tens of milliseconds, the work microseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_close(got: Any, want: Any, tol: float, where: str, atol: float | None = None) -> None:
    """torch.testing.assert_close with rtol = tol (atol = tol unless given), its message prefixed by ``where``."""
    try:
        torch.testing.assert_close(got, want, rtol=tol, atol=tol if atol is None else atol)
    except AssertionError as err:
        raise AssertionError(f"{where}: {err}") from None


@dataclass
class Batch:
    ids: Any  # (n,) int64
    bags: Any  # (n,) int64: the output row of each id
    offsets: Any  # (B,) int64: bag starts, for F.embedding_bag
    grad_out: Any  # (B, C)


def make_batch(gen: Any, rows: int, cols: int, bags: int, dtype: Any, *, pool: int = 6, last_row: bool = True) -> Batch:
    """A batch with many duplicate ids (drawn from ``pool`` rows, the last row among them when ``last_row``) and
    some empty bags (the first, the last, and about a third of the others)."""
    candidates = torch.randperm(rows - 1, generator=gen)[:pool]
    if last_row:
        candidates[0] = rows - 1
    lengths = torch.randint(0, 5, (bags,), generator=gen)
    lengths[torch.rand(bags, generator=gen) < 0.3] = 0
    lengths[0] = 0
    lengths[-1] = 0
    lengths[1] = max(int(lengths[1]), 1)
    n = int(lengths.sum())
    ids = candidates[torch.randint(0, len(candidates), (n,), generator=gen)]
    bag_of = torch.repeat_interleave(torch.arange(bags), lengths)
    offsets = torch.cumsum(lengths, 0) - lengths
    grad_out = torch.randn(bags, cols, generator=gen).to(dtype)
    return Batch(ids.long(), bag_of.long(), offsets.long(), grad_out)


class Reference:
    """The unfused update: embedding_bag(sparse=True) backward, then torch.optim (or row-wise Adagrad by hand)."""

    def __init__(self, weight: Any, opt: RowOptimizer, lr: float) -> None:
        self.dtype = weight.dtype
        self.weight = torch.nn.Parameter(weight.detach().float().clone())
        self.opt = opt
        self.lr = lr
        self.sum = torch.zeros(weight.shape[0])  # row-wise Adagrad's accumulator
        self.optim: Any = None
        if opt is RowOptimizer.sgd:
            self.optim = torch.optim.SGD([self.weight], lr=lr)
        elif opt is RowOptimizer.adagrad:
            self.optim = torch.optim.Adagrad([self.weight], lr=lr, eps=1e-10)
        elif opt is RowOptimizer.adam:
            self.optim = torch.optim.SparseAdam([self.weight], lr=lr, betas=(0.9, 0.999), eps=1e-8)

    def step(self, batch: Batch) -> None:
        pooled = F.embedding_bag(batch.ids, self.weight, batch.offsets, mode="sum", sparse=True)
        pooled.backward(batch.grad_out.float())
        if self.optim is not None:
            self.optim.step()
        else:
            grad = self.weight.grad.coalesce()
            rows, values = grad.indices()[0], grad.values()
            with torch.no_grad():
                self.sum[rows] += values.pow(2).mean(dim=1)
                self.weight[rows] -= self.lr * values / (self.sum[rows].sqrt() + 1e-10).unsqueeze(1)
        self.weight.grad = None
        with torch.no_grad():  # store in the weight's dtype, as the fused update does
            self.weight.copy_(self.weight.to(self.dtype).float())

    def state(self) -> dict[str, Any]:
        if self.opt is RowOptimizer.rowwise_adagrad:
            return {"sum": self.sum}
        st = self.optim.state[self.weight]
        if self.opt is RowOptimizer.adagrad:
            return {"sum": st["sum"]}
        if self.opt is RowOptimizer.adam:
            return {"exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"]}
        return {}


def check_against_reference(
    opt: RowOptimizer, dtype_name: str, cols: int, batches: list[Batch], rows: int, gen: Any
) -> None:
    dtype = DTYPES[dtype_name]
    weight = torch.randn(rows, cols, generator=gen).to(dtype)
    initial = weight.clone()
    ref = Reference(weight, opt, LR[opt])
    state = init_state(opt, rows, cols)
    config = UpdateConfig(opt, lr=LR[opt])
    touched = torch.zeros(rows, dtype=torch.bool)
    tol = WEIGHT_TOL[dtype_name]
    for step, batch in enumerate(batches, start=1):
        fused_backward_update(weight, state, batch.ids, batch.bags, batch.grad_out, config, step=step, backend="torch")
        ref.step(batch)
        touched[batch.ids] = True
        assert_close(weight.float(), ref.weight.detach(), tol, f"weight, step {step}")
        for key, expected in ref.state().items():
            assert_close(state[key], expected, STATE_TOL, f"{key}, step {step}")
        assert torch.equal(weight[~touched].view(torch.uint8), initial[~touched].view(torch.uint8))
        for value in state.values():
            assert not value[~touched].any()
    assert touched.any()
    assert not touched.all()


@pytest.mark.parametrize("cols", [4, 20, 128])
@pytest.mark.parametrize("dtype_name", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("opt", list(RowOptimizer))
def test_torch_backend_matches_autograd_and_torch_optim(opt: RowOptimizer, dtype_name: str, cols: int) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{opt.value}-{dtype_name}-{cols}".encode()))
    rows = 40
    batches = [make_batch(gen, rows, cols, bags=12, dtype=DTYPES[dtype_name], pool=8) for _ in range(3)]
    check_against_reference(opt, dtype_name, cols, batches, rows, gen)


@pytest.mark.parametrize("opt", list(RowOptimizer))
def test_one_row_touched_by_every_id(opt: RowOptimizer) -> None:
    gen = torch.Generator().manual_seed(7)
    rows, cols, bags = 10, 8, 6
    batches = []
    for _ in range(3):
        batch = make_batch(gen, rows, cols, bags, torch.float32)
        batch.ids = torch.full_like(batch.ids, 3)
        batches.append(batch)
    check_against_reference(opt, "fp32", cols, batches, rows, gen)


@pytest.mark.parametrize("opt", list(RowOptimizer))
def test_ids_at_the_last_row(opt: RowOptimizer) -> None:
    gen = torch.Generator().manual_seed(11)
    rows, cols, bags = 16, 20, 8
    batches = []
    for _ in range(3):
        batch = make_batch(gen, rows, cols, bags, torch.float32, pool=3)
        batch.ids[: len(batch.ids) // 2] = rows - 1
        batches.append(batch)
    check_against_reference(opt, "fp32", cols, batches, rows, gen)


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("opt", list(RowOptimizer))
def test_no_ids_changes_nothing(opt: RowOptimizer, backend: str) -> None:
    weight = torch.randn(6, 4)
    state = init_state(opt, 6, 4)
    for value in state.values():
        value.uniform_()
    before = weight.clone(), {k: v.clone() for k, v in state.items()}
    empty = torch.zeros(0, dtype=torch.int64)
    fused_backward_update(weight, state, empty, empty, torch.randn(3, 4), UpdateConfig(opt, lr=0.1), step=1)
    assert torch.equal(weight, before[0])
    assert all(torch.equal(state[k], before[1][k]) for k in state)


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("opt", list(RowOptimizer))
def test_a_step_tensor_updates_as_the_host_step(opt: RowOptimizer, dtype_name: str) -> None:
    """A step given as a device counter (what a graphed step passes: Adam's step size then computed from it in
    float64 on the device) updates bit for bit as the same step given as a host int, over steps 1-4."""
    gen = torch.Generator().manual_seed(21)
    rows, cols = 30, 12
    weight = torch.randn(rows, cols, generator=gen).to(DTYPES[dtype_name])
    by_int, by_tensor = weight.clone(), weight.clone()
    s_int, s_tensor = init_state(opt, rows, cols), init_state(opt, rows, cols)
    config = UpdateConfig(opt, lr=LR[opt])
    counter = torch.zeros(1, dtype=torch.float64)
    for step in range(1, 5):
        b = make_batch(gen, rows, cols, bags=10, dtype=DTYPES[dtype_name])
        fused_backward_update(by_int, s_int, b.ids, b.bags, b.grad_out, config, step=step, backend="torch")
        counter.add_(1.0)
        fused_backward_update(by_tensor, s_tensor, b.ids, b.bags, b.grad_out, config, step=counter, backend="torch")
        assert torch.equal(by_tensor.view(torch.uint8), by_int.view(torch.uint8)), f"step {step}"
        assert all(torch.equal(s_tensor[k], s_int[k]) for k in s_int)
    assert not torch.equal(by_int, weight)


def test_a_step_tensor_must_be_one_value_on_the_weights_device() -> None:
    config = UpdateConfig(RowOptimizer.adam, lr=0.1)
    ids = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="one value"):
        fused_backward_update(
            torch.randn(4, 3), init_state(RowOptimizer.adam, 4, 3), ids, ids, torch.randn(1, 3), config,
            step=torch.ones(2, dtype=torch.float64),
        )  # fmt: skip


def test_state_layout_and_bytes() -> None:
    rows, cols = 7, 5
    expected = {
        RowOptimizer.sgd: {},
        RowOptimizer.adagrad: {"sum": (rows, cols)},
        RowOptimizer.rowwise_adagrad: {"sum": (rows,)},
        RowOptimizer.adam: {"exp_avg": (rows, cols), "exp_avg_sq": (rows, cols)},
    }
    for opt, shapes in expected.items():
        state = init_state(opt, rows, cols, "cpu")
        assert {k: tuple(v.shape) for k, v in state.items()} == shapes
        assert all(v.dtype == torch.float32 and not v.any() for v in state.values())
        assert state_bytes(opt, rows, cols) == sum(v.numel() * v.element_size() for v in state.values())


def test_optimizer_values_are_the_wires() -> None:
    from shardwise.wire.spec import Optimizer

    assert [o.value for o in RowOptimizer] == [o.value for o in Optimizer]
    assert UpdateConfig(Optimizer.adam, lr=1.0).optimizer is RowOptimizer.adam  # type: ignore[arg-type]


def test_config_defaults_and_validation() -> None:
    assert UpdateConfig(RowOptimizer.adagrad, lr=0.1).eps == 1e-10
    assert UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1).eps == 1e-10
    assert UpdateConfig(RowOptimizer.adam, lr=0.1).eps == 1e-8
    assert UpdateConfig(RowOptimizer.adam, lr=0.1, eps=1e-6).eps == 1e-6
    adam = UpdateConfig(RowOptimizer.adam, lr=0.1)
    assert (adam.beta1, adam.beta2) == (0.9, 0.999)
    with pytest.raises(ValueError, match="lr"):
        UpdateConfig(RowOptimizer.sgd, lr=0.0)
    with pytest.raises(ValueError, match="beta2"):
        UpdateConfig(RowOptimizer.adam, lr=0.1, beta2=1.0)


def test_bad_inputs_are_refused_before_any_work() -> None:
    weight = torch.randn(6, 4)
    ids = torch.tensor([1, 2])
    cfg = UpdateConfig(RowOptimizer.adagrad, lr=0.1)
    with pytest.raises(ValueError, match="state"):
        fused_backward_update(weight, {}, ids, ids, torch.randn(3, 4), cfg, step=1)
    with pytest.raises(ValueError, match="grad_out"):
        fused_backward_update(weight, init_state("adagrad", 6, 4), ids, ids, torch.randn(3, 5), cfg, step=1)
    with pytest.raises(ValueError, match="same length"):
        fused_backward_update(weight, init_state("adagrad", 6, 4), ids, ids[:1], torch.randn(3, 4), cfg, step=1)
    adam = UpdateConfig(RowOptimizer.adam, lr=0.1)
    with pytest.raises(ValueError, match="1-based"):
        fused_backward_update(weight, init_state("adam", 6, 4), ids, ids, torch.randn(3, 4), adam, step=0)
    with pytest.raises(ValueError, match="backend"):
        fused_backward_update(
            weight, init_state("adagrad", 6, 4), ids, ids, torch.randn(3, 4), cfg, step=1, backend="x"
        )
    # the Triton backend takes CPU tensors only under the interpreter, which this process never switches on
    with pytest.raises(RuntimeError, match=r"Triton|TRITON_INTERPRET"):
        fused_backward_update(
            weight, init_state("adagrad", 6, 4), ids, ids, torch.randn(3, 4), cfg, step=1, backend="triton"
        )


# --- the Triton backend under the interpreter (one subprocess) ---------------------------------------------------

#: (dtype, cols, max_block_c, pool, all_last_row, long_segment): widths ≤ 32 and n ≤ 64 keep the interpreter to a few
#: seconds. max_block_c 8 splits 20 columns into three blocks: the kernel of one program per segment (row-wise
#: Adagrad's two-pass path); the other cases take the grouped kernel. The all-last-row cases send every id to the last
#: row (one live segment, the rest past the last one), one at a width with no masked column, one with more ids than
#: ``long_segment`` (``LONG_SEGMENT``: summed on its own, in long tiles); the last case mixes short segments (summed
#: side by side) and long ones in the same blocks. The cases run with ``LONG_TILE_ELEMENTS`` at 256 (a long tile of 8
#: ids at these widths), so that long segments of these small batches take both loops (``BLOCK_L``, then ``BLOCK_N``),
#: and ``UPDATE_ELEMENTS`` and ``POOL_ELEMENTS`` at 128 (blocks of 4-8 segments or bags), so that a batch spans
#: several blocks. The last field is ``(SPLIT_SEGMENT, SPLIT_CHUNK)``: the fourth case's one live segment (about 48
#: ids) is split into chunks of 5 that programs sum apart and the last one adds up; the fifth mixes split segments
#: (over 6 ids, chunks of 4), long ones (3-6 ids) and short ones in the same blocks
TRITON_CASES = [
    ("fp32", 20, 512, 6, False, 64, (1024, 512)),
    ("bf16", 20, 8, 5, False, 64, (1024, 512)),
    ("fp16", 32, 512, 1, True, 64, (1024, 512)),
    ("fp32", 20, 512, 3, True, 8, (16, 5)),
    ("fp16", 16, 512, 4, False, 2, (6, 4)),
]


def _triton_cases() -> Iterator[dict[str, Any]]:
    """Triton (interpreted, CPU) against torch on the same inputs: every optimizer × TRITON_CASES, 2 steps."""
    from shardwise.runtime.kernels import fused_update as fused_kernel

    assert fused_kernel.interpreting(), "run with TRITON_INTERPRET=1 set before Triton is imported"
    default_block, default_long = fused_kernel.MAX_BLOCK_C, fused_kernel.LONG_SEGMENT
    default_split = fused_kernel.SPLIT_SEGMENT, fused_kernel.SPLIT_CHUNK
    fused_kernel.LONG_TILE_ELEMENTS = 256
    fused_kernel.UPDATE_ELEMENTS = 128  # blocks of 4-8 segments at these widths: a batch spans several
    for opt in RowOptimizer:
        for dtype_name, cols, max_block_c, pool, all_last, long_segment, split in TRITON_CASES:
            gen = torch.Generator().manual_seed(3)
            rows, dtype = 24, DTYPES[dtype_name]
            weight = torch.randn(rows, cols, generator=gen).to(dtype)
            initial = weight.clone()
            tri_w, tri_state = weight.clone(), init_state(opt, rows, cols)
            ptr_w, ptr_state = weight.clone(), init_state(opt, rows, cols)
            ref_w, ref_state = weight.clone(), init_state(opt, rows, cols)
            config = UpdateConfig(opt, lr=LR[opt])
            touched = torch.zeros(rows, dtype=torch.bool)
            result: dict[str, Any] = {"opt": opt.value, "dtype": dtype_name, "cols": cols, "errors": []}
            fused_kernel.MAX_BLOCK_C, fused_kernel.LONG_SEGMENT = max_block_c, long_segment
            fused_kernel.SPLIT_SEGMENT, fused_kernel.SPLIT_CHUNK = split
            try:
                for step in (1, 2):
                    batch = make_batch(gen, rows, cols, bags=16, dtype=dtype, pool=pool)
                    if all_last:
                        batch.ids.fill_(rows - 1)
                    assert 0 < len(batch.ids) <= 64
                    touched[batch.ids] = True
                    args = (batch.ids, batch.bags, batch.grad_out, config)
                    fused_backward_update(tri_w, tri_state, *args, step=step, backend="triton")
                    fused_backward_update(ref_w, ref_state, *args, step=step, backend="torch")
                    # the step as a device counter (the kernel loads Adam's step size): the same bits
                    counter = torch.full((1,), float(step), dtype=torch.float64)
                    fused_backward_update(ptr_w, ptr_state, *args, step=counter, backend="triton")
                    if not torch.equal(ptr_w.view(torch.uint8), tri_w.view(torch.uint8)):
                        result["errors"].append(f"step {step}: a step tensor updated otherwise than a host step")
                    # the interpreter truncates when it stores bf16 (a GPU rounds to nearest): one bf16 unit apart
                    tol = WEIGHT_TOL[dtype_name]
                    checks = [("weight", tri_w.float(), ref_w.float(), tol)]
                    checks += [(k, tri_state[k], ref_state[k], STATE_TOL) for k in ref_state]
                    for name, got, want, t in checks:
                        try:
                            torch.testing.assert_close(got, want, rtol=t, atol=t)
                        except AssertionError as err:
                            result["errors"].append(f"step {step} {name}: {err}")
                    if not torch.equal(tri_w[~touched].view(torch.uint8), initial[~touched].view(torch.uint8)):
                        result["errors"].append(f"step {step}: an untouched row changed")
                    if any(v[~touched].any() for v in tri_state.values()):
                        result["errors"].append(f"step {step}: an untouched row's state changed")
            finally:
                fused_kernel.MAX_BLOCK_C, fused_kernel.LONG_SEGMENT = default_block, default_long
                fused_kernel.SPLIT_SEGMENT, fused_kernel.SPLIT_CHUNK = default_split
            yield result


def _pooled_cases() -> Iterator[dict[str, Any]]:
    """The Triton forward (interpreted, CPU) against ``embedding_bag``: every dtype and width of TRITON_CASES,
    bags of 0–4 ids (empty ones first, inside and last), several column blocks when ``max_block_c`` is small."""
    from shardwise.runtime.kernels import fused_update as fused_kernel

    default_block = fused_kernel.MAX_BLOCK_C
    fused_kernel.POOL_ELEMENTS = 128  # 4-8 bags a program at these widths: the 12 bags span several programs
    for dtype_name, cols, max_block_c, *_ in TRITON_CASES:
        gen = torch.Generator().manual_seed(4)
        dtype = DTYPES[dtype_name]
        weight = torch.randn(24, cols, generator=gen).to(dtype)
        lengths = torch.randint(0, 5, (12,), generator=gen)
        lengths[0], lengths[5], lengths[-1] = 0, 0, 0
        ids = torch.randint(0, 24, (int(lengths.sum()),), generator=gen)
        offsets = torch.cumsum(lengths, 0) - lengths
        result: dict[str, Any] = {"opt": "forward", "dtype": dtype_name, "cols": cols, "errors": []}
        fused_kernel.MAX_BLOCK_C = max_block_c
        try:
            got = pooled_sum(weight, ids, offsets, backend="triton")
        finally:
            fused_kernel.MAX_BLOCK_C = default_block
        want = torch.nn.functional.embedding_bag(ids, weight.float(), offsets, mode="sum").to(dtype)
        tol = WEIGHT_TOL[dtype_name]
        try:
            torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
        except AssertionError as err:
            result["errors"].append(str(err))
        yield result


def _fallback_case() -> Iterator[dict[str, Any]]:
    """The grouped update made not to build (its compile step raises, as a Triton it was not checked on might): the
    update runs the per-segment kernel instead — the same bits as asking for it — says why once, and keeps to it."""
    import warnings

    from shardwise.runtime.kernels import fused_update as fused_kernel

    result: dict[str, Any] = {"opt": "fallback", "errors": []}
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(24, 16, generator=gen)
    batch = make_batch(gen, 24, 16, bags=8, dtype=torch.float32, pool=4)
    config = UpdateConfig(RowOptimizer.rowwise_adagrad, lr=0.1)
    grouped_w, fallback_w, per_w = weight.clone(), weight.clone(), weight.clone()
    states = [init_state(config.optimizer, 24, 16) for _ in range(3)]
    args = (batch.ids, batch.bags, batch.grad_out, config)
    fused_backward_update(grouped_w, states[0], *args, step=1, backend="triton")

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("no such instruction")

    kernel, compiles = fused_kernel._fused_groups_kernel, fused_kernel._compiles
    fused_kernel._compiles = lambda: True  # (the interpreter compiles nothing: its build step is made to run)
    fused_kernel._fused_groups_kernel.warmup = broken  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fused_backward_update(fallback_w, states[1], *args, step=1, backend="triton")
            fused_backward_update(fallback_w, states[1], *args, step=2, backend="triton")
    finally:
        del fused_kernel._fused_groups_kernel.warmup
        fused_kernel._compiles = compiles
        failure, fused_kernel._grouped_failure = fused_kernel._grouped_failure, None
    assert fused_kernel._fused_groups_kernel is kernel
    sorted_ids, sorted_bags, _, starts = segments(batch.ids, batch.bags, narrow=True)
    for _ in (1, 2):
        fused_kernel.launch(
            per_w, states[2]["sum"], None, sorted_ids, sorted_bags, starts, batch.grad_out,
            opt=fused_kernel.ROWWISE_ADAGRAD, lr=0.1, eps=config.epsilon, beta1=0.9, beta2=0.999, step_size=0.0,
            per_segment=True,
        )  # fmt: skip
    if not torch.equal(fallback_w, per_w):
        result["errors"].append("the fallback's weights are not the per-segment kernel's")
    if torch.equal(fallback_w, grouped_w):
        result["errors"].append("the fallback's two updates look like the grouped kernel's one")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if len(messages) != 1 or "no such instruction" not in messages[0] or "per-segment" not in messages[0]:
        result["errors"].append(f"the fallback warned {messages}")
    if failure is None or "no such instruction" not in failure:
        result["errors"].append(f"the failure recorded is {failure!r}")
    yield result


def _starts_cases() -> Iterator[dict[str, Any]]:
    """The Triton backend's segment starts (one store a head) against :func:`segments`' (a scatter of every
    position): one id, all distinct, all equal, repeats, int32 and int64 keys, and padded calls whose real count is
    none, some and all of the ids."""
    from shardwise.runtime.kernels import fused_update as fused_kernel

    result: dict[str, Any] = {"opt": "starts", "errors": [], "cases": 0}
    gen = torch.Generator().manual_seed(12)
    calls = [
        torch.tensor([5]),
        torch.arange(40).flip(0),
        torch.full((33,), 7),
        torch.randint(0, 9, (70,), generator=gen),
        torch.randint(0, 3000, (2500,), generator=gen),  # several programs of the kernel
    ]
    for ids in calls:
        bags = torch.arange(ids.numel())
        masks: list[Any] = [None, torch.zeros(ids.numel(), dtype=torch.bool), torch.ones(ids.numel(), dtype=torch.bool)]
        masks.append(torch.rand(ids.numel(), generator=gen) < 0.6)
        for valid in masks:
            for narrow in (False, True):
                sorted_ids, _, _, want = segments(ids, bags, valid, narrow=narrow)
                real = None if valid is None else valid.sum()
                got = fused_kernel.segment_starts(sorted_ids, real)
                result["cases"] += 1
                if not torch.equal(got, want):
                    kept = "all" if valid is None else int(valid.sum())
                    result["errors"].append(f"n={ids.numel()} real={kept} narrow={narrow}: {got} != {want}")
    yield result


def run_triton_cases() -> None:
    """Entry point of the interpreter subprocess: one JSON line per case on stdout."""
    torch.set_num_threads(1)
    for result in (*_triton_cases(), *_pooled_cases(), *_fallback_case(), *_starts_cases()):
        print(json.dumps(result), flush=True)  # noqa: T201


interpreter_child, interpreter_results = interpreter_support.module_fixtures(
    "test_triton_interpreter", "run_triton_cases", "the Triton backend's tests need Triton (the dev extra installs it)"
)


@pytest.mark.parametrize("opt", list(RowOptimizer))
def test_triton_interpreter_matches_torch_backend(interpreter_results: list[dict[str, Any]], opt: RowOptimizer) -> None:
    mine = [r for r in interpreter_results if r["opt"] == opt.value]
    assert len(mine) == len(TRITON_CASES)
    failures = [f"{r['dtype']} C={r['cols']}: {e}" for r in mine for e in r["errors"]]
    assert not failures, "\n".join(failures)


def test_triton_interpreter_pooled_rows_match_embedding_bag(interpreter_results: list[dict[str, Any]]) -> None:
    mine = [r for r in interpreter_results if r["opt"] == "forward"]
    assert len(mine) == len(TRITON_CASES)
    failures = [f"{r['dtype']} C={r['cols']}: {e}" for r in mine for e in r["errors"]]
    assert not failures, "\n".join(failures)


def test_an_update_whose_grouped_kernel_does_not_build_runs_the_per_segment_kernel(
    interpreter_results: list[dict[str, Any]],
) -> None:
    (mine,) = [r for r in interpreter_results if r["opt"] == "fallback"]
    assert mine["errors"] == []


def test_triton_interpreter_segment_starts_match_the_torch_path(interpreter_results: list[dict[str, Any]]) -> None:
    (mine,) = [r for r in interpreter_results if r["opt"] == "starts"]
    assert mine["cases"] == 40
    assert mine["errors"] == []


def test_the_interpreter_stays_in_its_subprocess() -> None:
    assert "TRITON_INTERPRET" not in os.environ


# --- on a CUDA machine ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("opt", list(RowOptimizer))
def test_triton_on_cuda_matches_torch_without_syncs(opt: RowOptimizer) -> None:
    """Full widths (one column block up to 512, several past it), hot rows of thousands of ids (row 0's, about 2,400,
    split into chunks by the grouped kernel), 3 steps.

    The output gradients are multiples of 1/8 below 2 in magnitude, so every per-row sum is exact in fp32 whatever
    the order (the torch backend's atomics, the kernel's tiles): the backends then differ only by the optimizer's
    arithmetic (Triton's fast sqrt and division, fused multiply-adds), not by Adam's sign-like first step amplifying
    summation noise on rows whose gradient nearly cancels.
    """
    assert triton_available()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(5)
    rows, bags, n = 5000, 512, 20000
    for dtype_name, cols in [("fp32", 128), ("fp16", 96), ("bf16", 512), ("fp32", 1000), ("fp32", 3)]:
        dtype = DTYPES[dtype_name]
        weight = torch.randn(rows, cols, generator=gen).to(dtype).to(dev)
        tri_w, tri_state = weight.clone(), init_state(opt, rows, cols, dev)
        ref_w, ref_state = weight.clone(), init_state(opt, rows, cols, dev)
        config = UpdateConfig(opt, lr=LR[opt])
        touched = torch.zeros(rows, dtype=torch.bool, device=dev)
        for step in (1, 2, 3):
            # heavy-tailed ids: row 0 takes about a tenth of the batch
            ids = (torch.rand(n, generator=gen).pow(4) * rows).long().clamp(max=rows - 1).to(dev)
            bag_of = torch.randint(0, bags, (n,), generator=gen).to(dev)
            grad_out = (torch.randint(-15, 16, (bags, cols), generator=gen) / 8).to(dtype).to(dev)
            touched[ids] = True
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
            try:
                fused_backward_update(tri_w, tri_state, ids, bag_of, grad_out, config, step=step)  # auto: Triton
                fused_backward_update(ref_w, ref_state, ids, bag_of, grad_out, config, step=step, backend="torch")
            finally:
                torch.cuda.set_sync_debug_mode("default")
            where = f"{dtype_name} C={cols} step {step}"
            tol = WEIGHT_TOL[dtype_name]
            assert_close(tri_w.float(), ref_w.float(), tol, where)
            for key in ref_state:
                assert_close(tri_state[key], ref_state[key], 1e-5, f"{where} {key}", atol=1e-6)
        assert torch.equal(tri_w[~touched].view(torch.uint8), weight[~touched].view(torch.uint8))
        assert all(not v[~touched].any() for v in tri_state.values())
        if opt is RowOptimizer.sgd:  # the forward kernel once per width, against embedding_bag (empty bags included)
            lengths = torch.randint(0, 40, (bags,), generator=gen).to(dev)
            ids = torch.randint(0, rows, (int(lengths.sum()),), generator=gen).to(dev)
            offsets = torch.cumsum(lengths, 0) - lengths
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = pooled_sum(weight, ids, offsets)  # auto: Triton
            finally:
                torch.cuda.set_sync_debug_mode("default")
            want = torch.nn.functional.embedding_bag(ids, weight.float(), offsets, mode="sum")
            assert_close(got.float(), want, WEIGHT_TOL[dtype_name] * 4, f"{dtype_name} C={cols} forward")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_cuda_graph_capture(backend: str) -> None:
    """The update captures into a CUDA graph (capture fails on any host synchronisation) and its replay on a new
    batch, copied into the captured buffers, gives what an eager call gives."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(9)
    rows, cols, bags, n = 3000, 64, 256, 4096
    for opt in RowOptimizer:
        config = UpdateConfig(opt, lr=LR[opt])

        def batch() -> tuple[Any, Any, Any]:
            # row 0 takes about 1,500 ids (a segment split into chunks), rows 1-20 tens to hundreds (long ones)
            ids = (torch.rand(n, generator=gen).pow(8) * rows).long().to(dev)
            bag_of = torch.randint(0, bags, (n,), generator=gen).to(dev)
            grad_out = (torch.randint(-15, 16, (bags, cols), generator=gen) / 8).to(dev)  # exact sums
            return ids, bag_of, grad_out

        weight0 = torch.randn(rows, cols, generator=gen).to(dev)
        weight, state = weight0.clone(), init_state(opt, rows, cols, dev)
        static = batch()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile the kernel outside the capture
            fused_backward_update(weight, state, *static, config, step=1, backend=backend)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fused_backward_update(weight, state, *static, config, step=1, backend=backend)
        fresh = batch()
        for buf, value in zip(static, fresh, strict=True):
            buf.copy_(value)
        weight.copy_(weight0)
        for value in state.values():
            value.zero_()
        graph.replay()
        eager_w, eager_state = weight0.clone(), init_state(opt, rows, cols, dev)
        fused_backward_update(eager_w, eager_state, *fresh, config, step=1, backend=backend)
        torch.cuda.synchronize()
        assert_close(weight, eager_w, 1e-6, f"{opt.value} weight")
        for key in state:
            assert_close(state[key], eager_state[key], 1e-6, f"{opt.value} {key}")
