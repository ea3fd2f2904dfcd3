r"""Dense layers: per-rank memory, compute and collectives of one layer under a style (:func:`dense_cost`).

Compute, per rank and step:

* a ``linear`` layer on a profile with a ``microarch`` (every catalogue profile): the kernel model
  (:mod:`shardwise.solver.kernels`) prices the layer's three GEMMs as the rank runs them (``gemms_of``: forward,
  input gradient, weight gradient; ``rows = B·tokens``, ``g·B·tokens`` over a ``1/g`` slice of the weight under
  colwise / rowwise), each at the predicted time ``t_p`` of the kernel chosen for it (``pick``: the vendor GEMM
  through ``torch.matmul``, or a Triton configuration where that is predicted clearly faster; the plan's
  ``DensePlan.kernels`` carry the same choices and times), plus the bias: ``compute = Σ_p t_p + bias``. A layer
  with a bias whose forward runs on the vendor GEMM gets it in the GEMM's epilogue (``addmm``) and pays
  ``bias = m·n·c / (hbm_bw·achieved.memory_bound) + launch`` for its gradient, a sum over the output gradient's
  rows; a Triton forward adds it in place after the GEMM, a read and a write more: ``3·m·n·c / … + 2·launch``
  (``m × n`` the forward GEMM's output, ``c`` its element bytes, ``launch`` = ``kernels.KERNEL_LAUNCH_S``); 0
  without a bias (:func:`dense_kernel_s`, cached per GEMM shapes
  and profile figures). The flat roofline below charged ``3·(w + B·a)`` bytes: exactly the three GEMMs' operands
  and outputs (forward reads ``X`` and ``W`` and writes ``Y``; input gradient reads ``dY`` and ``W``, writes
  ``dX``; weight gradient reads ``dY`` and ``X``, writes ``dW``), which the kernel model's HBM term charges itself
  (with L2 reuse, and re-reads where the operands do not fit in L2), so nothing it covered is lost; the bias was
  not charged before. Not charged, here as before: the dense optimizer's step (weights, gradients and state
  streamed once, ``docs/truth.md``'s per-layer host overhead covers it on the calibrated H200), the activation
  functions between layers (a module of their own: an unclassified layer when ``describe()`` finds it).
* an ``unclassified`` layer, a profile without ``microarch``, a GEMM no configuration of the space can run on
  that GPU (a custom profile's tiny shared memory), and every layer of a plan for TorchRec (``engine`` torchrec: the
  model's own ``nn.Linear`` runs, cuBLAS, not the plan's kernels; ``shardwise calibrate --executor torchrec`` fits
  ``achieved.gemm`` to cuBLAS through this formula): roofline ``max(3·f·B / (peak(dtype)·achieved.gemm),
  3·(w + B·a) / (hbm_bw·achieved.memory_bound))``.

``f`` forward FLOPs per sample and ``a`` activation bytes per sample — ``(in+out)·b`` for a linear layer, the
measured ``activation_bytes_per_sample`` of an unclassified one (``describe()``: its input and output; such a layer
runs replicate or fsdp only); activations kept ``B·a`` per layer
(in a chain a layer's output is the next one's input, but backward's gradients of the same sizes live beside them:
charging only the inputs fell short of the measured peak, ``docs/truth.md``, "Result of runs 1–7");
memory and collectives per style — replicate (all-reduce of the gradient), fsdp (two all-gathers and a reduce-scatter
of the parameters, 1/W of the state per rank plus one unsharded copy), colwise / rowwise (tensor parallel inside the
host: 1/g of the state, activations exchanged inside the host, the gradient of the 1/g slice all-reduced across
hosts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardwise.hwprofiles import HardwareProfile
from shardwise.solver.cost_model.links import NO_LINK, CommContext, Link, hierarchical
from shardwise.solver.cost_model.traffic import MS
from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    Dtype,
    Executor,
    KernelLibrary,
    Optimizer,
)


@dataclass(frozen=True, slots=True)
class DenseCost:
    """One dense layer on one rank per step (module docstring): its HBM, its compute (ms) and its collectives (ms,
    by link; ``comm_ms`` their seconds summed, then in ms: the arithmetic every solver has priced a layer with)."""

    hbm_bytes: int
    compute_ms: float
    comm_ms: float
    comm: Link = NO_LINK


def dense_state_bytes(layer: DenseLayerSpec) -> int:
    """Weights + gradient + optimizer state (+ an fp32 master copy for low-precision weights); rowwise_adagrad keeps
    one fp32 per output row of a linear layer and, not knowing the rows of an unclassified one, one per parameter."""
    p = layer.num_params
    b = layer.dtype.nbytes
    rows = layer.out_features if layer.out_features is not None else p  # an unclassified layer: no rows known
    state = {
        Optimizer.sgd: 0,
        Optimizer.adagrad: p * 4,
        Optimizer.rowwise_adagrad: rows * 4,
        Optimizer.adam: 2 * p * 4,
    }[layer.optimizer]
    master = p * 4 if layer.dtype is not Dtype.fp32 else 0
    return p * b * 2 + state + master


#: profile figures the kernel model reads (and the bias term's HBM rate), keyed by the profile object: the object is
#: held beside its key, so its id cannot be reused while the entry lives
_PROFILE_KEYS: dict[int, tuple[HardwareProfile, str]] = {}
#: (profile figures, the rank's GEMMs, bias) → seconds, or None where a GEMM has no configuration that runs
_DENSE_KERNEL_S: dict[tuple[str, tuple[object, ...], bool], float | None] = {}
_CACHE_LIMIT = 1 << 16


def _profile_key(profile: HardwareProfile) -> str:
    hit = _PROFILE_KEYS.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    key = profile.model_dump_json(include={"microarch", "peak_flops_per_s", "hbm_bandwidth_bytes_per_s", "achieved"})
    key += str(profile.overheads.graphed_steps)  # the kernel pick charges Triton's launch host time on eager steps
    if len(_PROFILE_KEYS) > 1024:  # custom profiles come and go: keep the memo small
        _PROFILE_KEYS.clear()
    _PROFILE_KEYS[id(profile)] = (profile, key)
    return key


def dense_kernel_s(
    layer: DenseLayerSpec, style: DenseStyle, profile: HardwareProfile, batch: int, tp_size: int
) -> float | None:
    """Seconds of a linear layer's GEMMs and bias on one rank under the kernel model (module docstring, "Dense
    layers"): ``Σ_p t_p + bias``, ``t_p`` the chosen configuration's predicted time of each GEMM of
    :func:`~shardwise.solver.kernels.gemms_of` (``tp_size``: the tensor-parallel group, the host's ``g`` GPUs).
    None where the kernel model does not price the layer: an unclassified layer, a profile without
    ``microarch``, a GEMM that no configuration of the space runs on that GPU. Cached per (profile figures, GEMM
    shapes, bias), so that the solvers' repeated calls cost a dictionary look-up."""
    if layer.kind != "linear" or profile.microarch is None:
        return None
    from shardwise.solver import kernels  # numpy: not at the service's start-up

    gemms = tuple(g for _, g in kernels.gemms_of(layer, style, batch, tp_size))
    key = (_profile_key(profile), gemms, layer.bias)
    if key in _DENSE_KERNEL_S:
        return _DENSE_KERNEL_S[key]
    picks = [kernels.pick_cached(g, profile) for g in gemms]
    if any(p is None for p in picks):  # no configuration of the space runs one of them on this GPU
        seconds = None
    else:
        seconds = sum(p.us for p in picks if p is not None) / kernels.US
        if layer.bias:
            fwd = gemms[0]
            # the vendor's forward adds the bias in its epilogue (addmm); the Triton forward in place after it. Its
            # gradient is a sum over the output gradient's rows either way
            fused = picks[0] is not None and picks[0].kernel is KernelLibrary.vendor
            passes, launches = (1.0, 1) if fused else (3.0, 2)
            traffic = passes * fwd.m * fwd.n * kernels.output_bytes(fwd.dtype)
            seconds += traffic / (profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound)
            seconds += launches * kernels.KERNEL_LAUNCH_S
    if len(_DENSE_KERNEL_S) > _CACHE_LIMIT:
        _DENSE_KERNEL_S.clear()
    _DENSE_KERNEL_S[key] = seconds
    return seconds


def dense_cost(
    layer: DenseLayerSpec,
    style: DenseStyle,
    profile: HardwareProfile,
    ctx: CommContext,
    engine: Executor = Executor.shardwise,
) -> DenseCost:
    """Per-rank memory, compute and communication of one dense layer under ``style`` (module docstring)."""
    B, g = ctx.batch_size, ctx.gpus_per_host
    W, H = ctx.world_size * ctx.replicas, ctx.num_hosts * ctx.replicas  # the whole fleet, also in a 2D plan
    b = layer.dtype.nbytes
    w = layer.num_params * b
    act = B * layer.activation_bytes
    # TorchRec runs the dense layers as the model's own torch modules (cuBLAS), not the plan's kernels: the roofline
    compute_s = dense_kernel_s(layer, style, profile, B, g) if engine is Executor.shardwise else None
    if compute_s is None:  # the flat roofline (module docstring)
        flops = 3.0 * layer.forward_flops_per_sample * B
        compute_s = max(
            flops / (profile.peak_flops(layer.dtype.value) * profile.achieved.gemm),
            3.0 * (w + act) / (profile.hbm_bandwidth_bytes_per_s * profile.achieved.memory_bound),
        )
    state = dense_state_bytes(layer)
    if style in (DenseStyle.replicate, DenseStyle.fsdp):  # all-reduce; fsdp: two all-gathers, a reduce-scatter
        hbm = state + act if style is DenseStyle.replicate else math.ceil(state / W) + w + act
        times = 2 if style is DenseStyle.replicate else 3
        stages = hierarchical(w, g, H, ctx.intra_bw, ctx.inter_bw) if W > 1 else NO_LINK
        comm_s, comm = times * stages.total, stages.scaled(times * MS)
    else:  # colwise / rowwise: tensor parallel over the host, data parallel across hosts
        if style not in layer.kind_styles:
            raise ValueError(f"dense layer {layer.name}: style {style.value} needs a linear layer")
        hbm = math.ceil(state / g) + act
        intra = 2 * (g - 1) * act / ctx.intra_bw if g > 1 else 0.0
        inter = 2 * (H - 1) / H * (w / g) / ctx.inter_bw if H > 1 else 0.0
        comm_s, comm = intra + inter, Link(intra, inter).scaled(MS)
    return DenseCost(hbm_bytes=hbm, compute_ms=compute_s * MS, comm_ms=comm_s * MS, comm=comm)
