"""A linear layer whose three GEMMs run through shardwise's Triton matmul with the configurations a plan chose.

``Y = X·Wᵀ + b`` takes three GEMMs a training step (:class:`~shardwise.wire.spec.GemmPhase`): ``forward``
(``X·Wᵀ``: M = rows, N = out, K = in), ``input_grad`` (``dX = dY·W``: M = rows, N = in, K = out) and
``weight_grad`` (``dW = dYᵀ·X``: M = out, N = in, K = rows); ``db = Σ_rows dY`` is a sum (fp32, cast to the bias's
dtype). :class:`KernelLinearFunction` runs each GEMM through :func:`shardwise.runtime.kernels.matmul.matmul` with its
phase's :class:`~shardwise.wire.spec.KernelConfig` — transposed operands are strided views, never copies — and a
phase without a configuration (the plan chose the vendor GEMM for it) through ``torch.matmul``, the forward's bias
in the GEMM's epilogue (``torch.addmm``). Rows are every leading dimension of ``X`` flattened.

:class:`KernelLinear` is an ``nn.Linear`` that holds the configurations: built by :meth:`KernelLinear.from_linear`
around the **same** ``weight`` and ``bias`` Parameters (no copy), so state_dict keys, optimizers and checkpoints see
no difference. Its forward takes the Triton path when its weight is a CUDA tensor and the kernel module imports,
and ``nn.Linear``'s own forward otherwise (the CPU, no Triton, a DTensor weight, a GEMM past the kernel's 32-bit
offsets). Under ``torch.autocast`` on CUDA the operands are cast to the autocast dtype first, as ``F.linear`` would.

:func:`layer_configs` reads a plan's choices for one layer: those of one GPU type, preferring the layer's dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from shardwise.wire.spec import Dtype, GemmPhase, KernelChoice, KernelConfig, KernelLibrary

__all__ = ["KernelLinear", "KernelLinearFunction", "kernel_linear", "layer_configs", "triton_matmul_available"]

#: torch dtype → the wire's name for it (the dtypes the kernel takes)
WIRE_DTYPES: dict[torch.dtype, Dtype] = {
    torch.float32: Dtype.fp32,
    torch.float16: Dtype.fp16,
    torch.bfloat16: Dtype.bf16,
}


@functools.cache
def _kernel_module() -> ModuleType | None:
    """The Triton matmul module, or None when Triton does not import."""
    try:
        from shardwise.runtime.kernels import matmul as triton_matmul
    except ImportError:
        return None
    return triton_matmul


def triton_matmul_available() -> bool:
    """Whether the Triton matmul can be loaded in this process."""
    return _kernel_module() is not None


def _mm(a: Tensor, b: Tensor, config: KernelConfig | None) -> Tensor:
    """``a @ b`` through the Triton kernel with ``config``, or ``torch.matmul`` without one."""
    mod = _kernel_module()
    if config is None or mod is None:
        return torch.matmul(a, b)
    return mod.matmul(a, b, config)  # type: ignore[no-any-return]


class KernelLinearFunction(torch.autograd.Function):
    """``F.linear`` with its forward, input-gradient and weight-gradient GEMMs through the Triton matmul.

    ``apply(x, weight, bias, forward, input_grad, weight_grad)``: ``x`` (…, in), ``weight`` (out, in), ``bias``
    (out,) or None, one :class:`KernelConfig` or None per phase. All tensors of one dtype and device.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        forward: KernelConfig | None,
        input_grad: KernelConfig | None,
        weight_grad: KernelConfig | None,
    ) -> Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if forward is None and bias is not None:  # the vendor GEMM adds the bias in its epilogue, as F.linear does
            y = torch.addmm(bias, x2, weight.t())
        else:
            y = _mm(x2, weight.t(), forward)  # M = rows, N = out, K = in
            if bias is not None:
                y += bias
        ctx.save_for_backward(x2, weight)
        ctx.configs = (input_grad, weight_grad)
        ctx.has_bias = bias is not None
        ctx.lead = lead
        return y.reshape(*lead, weight.shape[0])

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        (dy,) = grads
        x2, weight = ctx.saved_tensors
        input_cfg, weight_cfg = ctx.configs
        dy2 = dy.reshape(-1, weight.shape[0])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _mm(dy2, weight, input_cfg).reshape(*ctx.lead, weight.shape[1])  # M = rows, N = in, K = out
        if ctx.needs_input_grad[1]:
            dw = _mm(dy2.t(), x2, weight_cfg)  # M = out, N = in, K = rows
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0, dtype=torch.float32).to(dy2.dtype)
        return dx, dw, db, None, None, None


def kernel_linear(x: Tensor, weight: Tensor, bias: Tensor | None, configs: Mapping[GemmPhase, KernelConfig]) -> Tensor:
    """``F.linear(x, weight, bias)`` with each phase of ``configs`` through the Triton matmul (see the module)."""
    out: Tensor = KernelLinearFunction.apply(  # type: ignore[no-untyped-call]
        x,
        weight,
        bias,
        configs.get(GemmPhase.forward),
        configs.get(GemmPhase.input_grad),
        configs.get(GemmPhase.weight_grad),
    )
    return out


class KernelLinear(nn.Linear):
    """An ``nn.Linear`` whose GEMMs run through the Triton matmul with ``configs`` (one per phase) on CUDA; built
    around an existing layer's Parameters by :meth:`from_linear`."""

    configs: dict[GemmPhase, KernelConfig]

    def __init__(self, linear: nn.Linear, configs: Mapping[GemmPhase, KernelConfig]) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate new parameters
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.configs = dict(configs)

    @classmethod
    def from_linear(cls, linear: nn.Linear, configs: Mapping[GemmPhase, KernelConfig]) -> KernelLinear:
        """``linear``'s Parameters (the same objects) behind the Triton path; its training flag carried over."""
        new = cls(linear, configs)
        new.train(linear.training)
        return new

    def uses_triton(self, x: Tensor) -> bool:
        """Whether a forward on ``x`` takes the Triton path (see the module docstring)."""
        w = self.weight
        if not (w.is_cuda and x.is_cuda and type(w) in (Tensor, nn.Parameter) and triton_matmul_available()):
            return False
        if w.dtype not in WIRE_DTYPES and not torch.is_autocast_enabled("cuda"):
            return False
        mod = _kernel_module()
        assert mod is not None
        rows = x.numel() // max(x.shape[-1], 1)
        fits: bool = mod.fits(rows, self.out_features, self.in_features)
        return fits

    def forward(self, x: Tensor) -> Tensor:
        if not self.configs or not self.uses_triton(x):
            return super().forward(x)
        weight, bias = self.weight, self.bias
        if torch.is_autocast_enabled("cuda"):
            dtype = torch.get_autocast_dtype("cuda")
            with torch.autocast("cuda", enabled=False):
                return kernel_linear(
                    x.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None, self.configs
                )
        if x.dtype != weight.dtype:
            return super().forward(x)  # F.linear raises its own error
        return kernel_linear(x, weight, bias, self.configs)

    def extra_repr(self) -> str:
        phases = ", ".join(
            f"{p.value}={c.block_m}x{c.block_n}x{c.block_k}/w{c.num_warps}s{c.num_stages}k{c.split_k}"
            for p, c in self.configs.items()
        )
        return f"{super().extra_repr()}, kernels: {phases or 'none'}"


def layer_configs(choices: Sequence[KernelChoice], gpu: str, dtype: Dtype | None) -> dict[GemmPhase, KernelConfig]:
    """The Triton configuration per phase among ``choices`` for GPU type ``gpu``: those for ``dtype`` when the plan
    has any, else those of the first dtype listed for that GPU (empty when none is for ``gpu``). A phase whose
    choice is the vendor GEMM has none: it runs ``torch.matmul``, and a layer with no Triton phase stays the
    ``nn.Linear`` it is."""
    mine = [c for c in choices if c.gpu == gpu]
    if not mine:
        return {}
    want = dtype if dtype is not None and any(c.dtype == dtype for c in mine) else mine[0].dtype
    out: dict[GemmPhase, KernelConfig] = {}
    seen: set[GemmPhase] = set()
    for c in mine:
        if c.dtype == want and c.phase not in seen:
            seen.add(c.phase)
            if c.kernel is KernelLibrary.triton:
                out[c.phase] = c.config
    return out
