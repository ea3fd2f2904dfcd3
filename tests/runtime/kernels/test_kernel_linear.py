"""The Triton matmul and the linear layer that runs a plan's kernel choices, against torch.

* The kernel under Triton's interpreter (CPU tensors) against ``torch.matmul`` on the same operands: fp32, fp16 and
  bf16; the three operand layouts of a linear layer (``X·Wᵀ``, ``dY·W``, ``dYᵀ·X`` — transposed operands as views);
  ragged edges (M, N, K no multiple of the tile, M smaller than one tile, a split-K slice past the end of K); split-K
  1 and 4 (4 the same bits on a second run). ``TRITON_INTERPRET=1`` must be set before Triton is imported, so these
  run in one subprocess (:func:`run_interpreter_cases`, started with the module's first test) and this process never
  sees the variable.
* :class:`KernelLinearFunction` under the interpreter: output and the gradients of input, weight and bias against
  ``F.linear``'s autograd, 3-D input, with and without bias, every dtype.
* On the CPU (no interpreter): ``KernelLinear`` keeps the layer's Parameters and state_dict and runs ``nn.Linear``'s
  forward; ``apply_plan`` on a gloo world of one leaves every layer an ``nn.Linear`` though the plan has choices;
  :func:`layer_configs` picks by GPU type and dtype.
* On a CUDA machine (skipped elsewhere): ``apply_plan`` swaps the planned layers for ``KernelLinear`` and a training
  step matches ``nn.Linear``'s.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import interpreter_support
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402  (after the importorskip)
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from shardwise.runtime.apply import apply_plan  # noqa: E402
from shardwise.runtime.kernels.linear import (  # noqa: E402
    KernelLinear,
    KernelLinearFunction,
    layer_configs,
    triton_matmul_available,
)
from shardwise.wire.spec import (  # noqa: E402
    DensePlan,
    DenseStyle,
    Dtype,
    GemmPhase,
    KernelChoice,
    KernelConfig,
    KernelLibrary,
    Plan,
    PlanStatus,
    RankPlan,
)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: rtol per output dtype: two units in the last place (both sides round once; the interpreter truncates bf16);
#: atol for outputs near zero, where only the fp32 accumulation order differs
RTOL = {"fp32": 2e-5, "fp16": 2e-3, "bf16": 1.6e-2}
ATOL = {"fp32": 1e-4, "fp16": 1e-3, "bf16": 1e-2}

#: small tiles so that the interpreter stays quick and shapes of a few dozen are several tiles: 3 tile rows in
#: groups of 2 (a ragged group), K = 70 in steps of 16 (a ragged last step; split 4 leaves the last slice empty)
SMALL = KernelConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, split_k=1)
SPLIT4 = SMALL.model_copy(update={"split_k": 4, "block_n": 16, "block_k": 32})
#: (m, n, k, layout): "nt" = A · Bᵀ (forward), "nn" = A · B (input gradient), "tn" = Aᵀ · B (weight gradient)
SHAPES = [(37, 45, 70, "nt"), (37, 45, 70, "nn"), (37, 45, 70, "tn"), (5, 33, 16, "nt")]


def _operands(m: int, n: int, k: int, layout: str, dtype: Any, seed: int) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(k, m, generator=g).to(dtype).t() if layout == "tn" else torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, k, generator=g).to(dtype).t() if layout == "nt" else torch.randn(k, n, generator=g).to(dtype)
    return a, b


def _check(errors: list[str], where: str, got: Any, want: Any, dtype_name: str) -> None:
    if got.dtype != want.dtype or got.shape != want.shape:
        errors.append(f"{where}: {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}")
        return
    try:
        torch.testing.assert_close(got.float(), want.float(), rtol=RTOL[dtype_name], atol=ATOL[dtype_name])
    except AssertionError as err:
        errors.append(f"{where}: {err}")


def _matmul_cases() -> Iterator[dict[str, Any]]:
    from shardwise.runtime.kernels import matmul as triton_matmul

    assert triton_matmul.interpreting(), "run with TRITON_INTERPRET=1 set before Triton is imported"
    for dtype_name, dtype in DTYPES.items():
        for m, n, k, layout in SHAPES:
            for cfg in (SMALL, SPLIT4):
                a, b = _operands(m, n, k, layout, dtype, seed=m + n + k)
                assert (layout == "tn") == (a.stride(0) == 1 and m > 1)
                assert (layout == "nt") == (b.stride(0) == 1)
                errors: list[str] = []
                got = triton_matmul.matmul(a, b, cfg)
                _check(errors, "matmul", got, torch.matmul(a, b), dtype_name)
                if cfg.split_k > 1 and not torch.equal(got, triton_matmul.matmul(a, b, cfg)):
                    errors.append("split-K: a second run gave other bits")
                yield {"case": "matmul", "dtype": dtype_name, "shape": [m, n, k, layout], "split": cfg.split_k,
                       "errors": errors}  # fmt: skip


def _linear_cases() -> Iterator[dict[str, Any]]:
    configs = (SMALL, SPLIT4, SMALL.model_copy(update={"block_m": 32, "block_n": 16}))
    for dtype_name, dtype in DTYPES.items():
        for bias in (True, False):
            g = torch.Generator().manual_seed(7)
            x = torch.randn(3, 13, 40, generator=g).to(dtype)  # 39 rows
            w = (torch.randn(24, 40, generator=g) / 6).to(dtype)
            b = torch.randn(24, generator=g).to(dtype) if bias else None
            dy = torch.randn(3, 13, 24, generator=g).to(dtype)
            leaves = [t.clone().requires_grad_() for t in (x, w, *([b] if b is not None else []))]
            ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
            args = (leaves[0], leaves[1], leaves[2] if bias else None, *configs)
            y = KernelLinearFunction.apply(*args)  # type: ignore[no-untyped-call]
            y.backward(dy)
            ref = F.linear(ref_leaves[0], ref_leaves[1], ref_leaves[2] if bias else None)
            ref.backward(dy)  # type: ignore[no-untyped-call]
            errors: list[str] = []
            _check(errors, "output", y, ref, dtype_name)
            for name, got, want in zip(("dx", "dw", "db"), leaves, ref_leaves, strict=False):
                _check(errors, name, got.grad, want.grad, dtype_name)
            yield {"case": "linear", "dtype": dtype_name, "bias": bias, "errors": errors}


def run_interpreter_cases() -> None:
    """Entry point of the interpreter subprocess: one JSON line per case on stdout."""
    torch.set_num_threads(1)
    for result in (*_matmul_cases(), *_linear_cases()):
        print(json.dumps(result), flush=True)  # noqa: T201


interpreter_child, interpreter_results = interpreter_support.module_fixtures(
    "test_interpreter", "run_interpreter_cases", "the Triton matmul's tests need Triton (the dev extra installs it)"
)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_interpreter_matmul_matches_torch(interpreter_results: list[dict[str, Any]], dtype: str) -> None:
    mine = [r for r in interpreter_results if r["case"] == "matmul" and r["dtype"] == dtype]
    assert len(mine) == 2 * len(SHAPES)
    failures = [f"{r['shape']} split {r['split']}: {e}" for r in mine for e in r["errors"]]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_interpreter_linear_function_matches_f_linear(interpreter_results: list[dict[str, Any]], dtype: str) -> None:
    mine = [r for r in interpreter_results if r["case"] == "linear" and r["dtype"] == dtype]
    assert len(mine) == 2
    failures = [f"bias={r['bias']}: {e}" for r in mine for e in r["errors"]]
    assert not failures, "\n".join(failures)


def test_the_interpreter_stays_in_its_subprocess() -> None:
    assert "TRITON_INTERPRET" not in os.environ


# --- on the CPU, no interpreter ---------------------------------------------------------------------------------


CONFIGS = {
    GemmPhase.forward: SMALL,
    GemmPhase.input_grad: SPLIT4,
    GemmPhase.weight_grad: SMALL.model_copy(update={"num_warps": 8}),
}


def _choices(gpu: str, dtype: Dtype, configs: dict[GemmPhase, KernelConfig]) -> list[KernelChoice]:
    return [
        KernelChoice(gpu=gpu, phase=p, m=64, n=32, k=16, dtype=dtype, config=c, predicted_us=1.0)
        for p, c in configs.items()
    ]


def test_matmul_refuses_cpu_tensors_without_the_interpreter() -> None:
    if not triton_matmul_available():
        pytest.skip("Triton does not import here")
    from shardwise.runtime.kernels import matmul as triton_matmul

    assert not triton_matmul.interpreting()
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        triton_matmul.matmul(torch.ones(4, 4), torch.ones(4, 4), SMALL)
    with pytest.raises(ValueError, match="M × K and K × N"):
        triton_matmul.matmul(torch.ones(4, 4), torch.ones(5, 4), SMALL)


def test_kernel_linear_keeps_parameters_and_runs_linear_on_the_cpu() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(8, 5)
    before = copy.deepcopy(lin.state_dict())
    k = KernelLinear.from_linear(lin, CONFIGS)
    assert k.weight is lin.weight
    assert k.bias is lin.bias
    assert list(k.state_dict()) == ["weight", "bias"]
    assert all(torch.equal(v, before[n]) for n, v in k.state_dict().items())
    x = torch.randn(3, 8)
    assert not k.uses_triton(x)
    assert torch.equal(k(x), lin(x))
    assert "forward=16x32x16" in repr(k)
    no_bias = KernelLinear.from_linear(nn.Linear(8, 5, bias=False), CONFIGS)
    assert no_bias.bias is None
    assert list(no_bias.state_dict()) == ["weight"]


def test_layer_configs_picks_the_gpu_type_and_prefers_the_layer_dtype() -> None:
    bf16 = _choices("nvidia-h200", Dtype.bf16, CONFIGS)
    fp16 = _choices("nvidia-h200", Dtype.fp16, {GemmPhase.forward: SPLIT4})
    other = _choices("amd-mi350x", Dtype.bf16, {GemmPhase.forward: SPLIT4})
    choices = [*other, *bf16, *fp16]
    assert layer_configs(choices, "nvidia-h200", Dtype.bf16) == CONFIGS
    assert layer_configs(choices, "nvidia-h200", Dtype.fp16) == {GemmPhase.forward: SPLIT4}
    assert layer_configs(choices, "nvidia-h200", Dtype.fp32) == CONFIGS  # none for fp32: the first dtype listed
    assert layer_configs(choices, "amd-mi350x", None) == {GemmPhase.forward: SPLIT4}
    assert layer_configs(choices, "nvidia-b200", Dtype.bf16) == {}


def test_a_phase_the_plan_gives_the_vendor_gemm_has_no_triton_configuration() -> None:
    vendor = {GemmPhase.forward: SMALL, GemmPhase.weight_grad: SPLIT4}
    choices = [
        c.model_copy(update={"kernel": KernelLibrary.vendor}) if c.phase in vendor else c
        for c in _choices("nvidia-h200", Dtype.bf16, CONFIGS)
    ]
    assert layer_configs(choices, "nvidia-h200", Dtype.bf16) == {GemmPhase.input_grad: CONFIGS[GemmPhase.input_grad]}
    every = [c.model_copy(update={"kernel": KernelLibrary.vendor}) for c in choices]
    assert layer_configs(every, "nvidia-h200", Dtype.bf16) == {}  # the layer stays an nn.Linear
    # a vendor choice listed first for a phase is that phase's choice: a later Triton one of the same dtype is not used
    assert layer_configs([*every, *_choices("nvidia-h200", Dtype.bf16, CONFIGS)], "nvidia-h200", Dtype.bf16) == {}


def test_the_vendor_forward_adds_the_bias_as_f_linear_does() -> None:
    torch.manual_seed(3)
    lin = nn.Linear(12, 7)
    x = torch.randn(5, 3, 12, requires_grad=True)
    # no configuration for any phase: torch.matmul throughout (the CPU path of KernelLinearFunction)
    y = KernelLinearFunction.apply(x, lin.weight, lin.bias, None, None, None)  # type: ignore[no-untyped-call]
    ref_x = x.detach().clone().requires_grad_(True)
    ref = F.linear(ref_x, lin.weight, lin.bias)
    torch.testing.assert_close(y, ref)
    y.square().sum().backward()
    grads = [x.grad, lin.weight.grad, lin.bias.grad]
    x.grad = lin.weight.grad = lin.bias.grad = None
    ref.square().sum().backward()
    for got, want in zip(grads, [ref_x.grad, lin.weight.grad, lin.bias.grad], strict=True):
        torch.testing.assert_close(got, want)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x: Any) -> Any:
        return self.head(self.body(x))


def _mlp_plan(gpu: str = "nvidia-h200") -> Plan:
    kernels = _choices(gpu, Dtype.fp32, CONFIGS) + _choices(gpu, Dtype.bf16, CONFIGS)
    return Plan(
        status=PlanStatus.feasible,
        predicted_step_ms=1.0,
        ranks=[RankPlan(rank=0, host=0, gpu=gpu, hbm_capacity_bytes=1 << 30, hbm_used_bytes=0)],
        dense=[
            DensePlan(name="body.0", style=DenseStyle.replicate, ranks=[0], kernels=kernels),
            DensePlan(name="body.2", style=DenseStyle.replicate, ranks=[0], kernels=kernels),
            DensePlan(name="head", style=DenseStyle.replicate, ranks=[0]),  # no choice: stays nn.Linear
        ],
    )


@pytest.fixture
def world_of_one() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_apply_plan_leaves_linear_layers_on_the_cpu(world_of_one: None) -> None:
    torch.manual_seed(1)
    model = MLP()
    keys = list(model.state_dict())
    params = dict(model.named_parameters())
    apply_plan(model, _mlp_plan(), device="cpu")
    assert all(type(m) is nn.Linear for m in (model.body[0], model.body[2], model.head))
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())


# --- on a CUDA machine ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_apply_plan_runs_the_kernels_on_cuda(world_of_one: None, dtype: str) -> None:
    if not triton_matmul_available():
        pytest.skip("Triton does not import here")
    torch.manual_seed(2)
    model = MLP().to(DTYPES[dtype])
    ref = copy.deepcopy(model).cuda()
    keys = list(model.state_dict())
    params = dict(model.named_parameters())
    apply_plan(model, _mlp_plan(), device="cuda")
    assert isinstance(model.body[0], KernelLinear)
    assert isinstance(model.body[2], KernelLinear)
    assert type(model.head) is nn.Linear
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    x = torch.randn(300, 16, device="cuda", dtype=DTYPES[dtype])
    assert model.body[0].uses_triton(x)
    y, y_ref = model(x), ref(x)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    tol = {"fp32": 2e-3, "bf16": 3e-2}[dtype]  # TF32 in both (torch's default off: IEEE in both)
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None
        assert q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, rtol=tol, atol=tol * max(1.0, q.grad.abs().max().item()), msg=name)
