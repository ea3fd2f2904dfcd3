"""FLOPs and activation bytes of the described layers, counted by ``torch.utils.flop_counter`` on the meta device:
each layer alone on its input shape, or the module's own forward run once on meta copies of ``example_inputs``
(the package docstring, "FLOPs")."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardwise.runtime.describe.walk import Layer, join, wire_dtype

if TYPE_CHECKING:
    import torch
    from torch import nn


def _meta_state(module: nn.Module) -> dict[str, torch.Tensor]:
    import torch

    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return {n: torch.empty_like(t, device="meta") for n, t in named}


def measure_alone(layers: Sequence[Layer], batch: int, shapes: dict[str, Sequence[int]]) -> None:
    """FLOPs and activations of each layer on its own (no example forward)."""
    from torch import nn

    unknown: list[str] = []
    for layer in layers:
        if layer.loose:
            continue
        mod = layer.module
        shape = shapes.pop(layer.name, None)
        if layer.kind == "linear":
            assert isinstance(mod, nn.Linear)
            sample = tuple(shape) if shape is not None else (mod.in_features,)
            if not sample or sample[-1] != mod.in_features or any(d <= 0 for d in sample):
                raise ValueError(
                    f"{layer.name}: input shape {sample} must be positive and end with in_features={mod.in_features}"
                )
            flops, act = _forward_alone(mod, (batch, *sample), layer.name)
            layer.flops = flops // batch or None
            if shape is not None:  # applied to several rows per sample: its activations too
                layer.activation_bytes = math.ceil(act / batch)
            continue
        sample_shape = tuple(shape) if shape is not None else _known_input_shape(mod)
        if sample_shape is None:
            n = sum(p.numel() for p in layer.params)
            unknown.append(f"{layer.name} ({type(mod).__name__}, {n:,} parameters)")
            continue
        if any(d <= 0 for d in sample_shape):
            raise ValueError(f"{layer.name}: input shape {sample_shape} must be positive")
        flops, act = _forward_alone(mod, (batch, *sample_shape), layer.name)
        layer.flops, layer.activation_bytes = flops // batch, math.ceil(act / batch)
    if shapes:
        raise ValueError(f"input_shapes names no dense layer of the module: {', '.join(sorted(shapes))}")
    if unknown:
        raise ValueError(
            f"describe() cannot count the FLOPs of {', '.join(unknown)}: their input is unknown; pass "
            "example_inputs (the forward's arguments; its FLOPs are then counted on meta) or input_shapes for them"
        )


def _known_input_shape(mod: nn.Module) -> tuple[int, ...] | None:
    """One sample's input shape where the module says it: norms over a known shape."""
    from torch import nn

    if isinstance(mod, nn.LayerNorm | nn.RMSNorm):
        return tuple(mod.normalized_shape)
    if isinstance(mod, nn.BatchNorm1d):
        return (mod.num_features,)
    return None


def _forward_alone(layer: nn.Module, input_shape: tuple[int, ...], where: str) -> tuple[int, int]:
    """Forward FLOPs of ``layer`` on a meta input of ``input_shape``, and the bytes of that input and its output;
    real parameters are swapped for meta ones."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    state = _meta_state(layer)
    floats = [t for t in state.values() if t.is_floating_point()]
    dtype = floats[0].dtype if floats else torch.get_default_dtype()
    x = torch.empty(input_shape, device="meta", dtype=dtype)
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            out = torch.func.functional_call(layer, state, (x,))
    except Exception as e:
        raise ValueError(
            f"{where}: its forward ({type(layer).__name__}) failed on one input of shape {input_shape} on the meta "
            f"device ({e}); pass example_inputs (the model's forward arguments) instead"
        ) from e
    return int(counter.get_total_flops()), _nbytes(x) + _nbytes(out)


def measure_forward(module: nn.Module, layers: list[Layer], example_inputs: Any, batch: int | None) -> None:
    """Run ``module``'s forward once on meta, giving each layer its subtree's FLOPs and activations, and adding a
    parameterless layer for each module that spends FLOPs outside every layer (the package docstring)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if batch is None:
        batch = _leading_batch(args)
    if batch <= 0:
        raise ValueError(f"example_batch_size must be positive, got {batch}")
    meta_args = _to_meta(args)
    names = {m: n for n, m in module.named_modules()}
    io_bytes: dict[str, int] = {}

    def pre(mod: nn.Module, inputs: Any) -> None:
        io_bytes[names[mod]] = io_bytes.get(names[mod], 0) + _nbytes(inputs)

    def post(mod: nn.Module, inputs: Any, output: Any) -> None:
        io_bytes[names[mod]] = io_bytes.get(names[mod], 0) + _nbytes(output)

    handles = [m.register_forward_pre_hook(pre) for m in names] + [m.register_forward_hook(post) for m in names]
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            torch.func.functional_call(module, _meta_state(module), meta_args)
    except Exception as e:
        raise ValueError(
            f"example_inputs: the forward of {type(module).__name__} failed on the meta device ({e}); pass inputs "
            "its forward takes, or input_shapes instead"
        ) from e
    finally:
        for h in handles:
            h.remove()
    root = type(module).__name__
    subtree = {
        (key[len(root) + 1 :] if key.startswith(f"{root}.") else ""): int(sum(ops.values()))
        for key, ops in counter.get_flop_counts().items()
        if key == root or key.startswith(f"{root}.")
    }
    by_name = {layer.name: layer for layer in layers}
    layers_whole = [layer for layer in layers if not layer.loose]
    for layer in layers_whole:
        fqn = names[layer.module]
        layer.flops = subtree.get(fqn, 0) // batch
        layer.activation_bytes = math.ceil(io_bytes.get(fqn, 0) / batch)
    # FLOPs outside every layer: each module's own (its subtree less its children's), where no layer covers it
    covered = {names[layer.module] for layer in layers_whole}
    if "" in covered:  # the whole module is one layer
        return
    extra: list[Layer] = []
    dtype = wire_dtype(_compute_dtype(module), root)
    for fqn, mod in module.named_modules():
        if any(fqn == c or fqn.startswith(f"{c}.") for c in covered):
            continue
        own = subtree.get(fqn, 0) - sum(subtree.get(join(fqn, c), 0) for c, _ in mod.named_children())
        if own <= 0:
            continue
        name = fqn or root
        if name in by_name:
            raise ValueError(f"{name}: a table or layer already has this name; rename the module")
        extra.append(
            Layer(
                name,
                mod,
                "unclassified",
                flops=own // batch,
                activation_bytes=math.ceil(io_bytes.get(fqn, 0) / batch),
                dtype=dtype,
            )
        )
    layers.extend(extra)


def _compute_dtype(root: nn.Module) -> torch.dtype:
    """The dtype parameterless compute is priced in: the model's first 2- or 4-byte float parameter's (default:
    torch's)."""
    import torch

    for p in root.parameters():
        if p.is_floating_point() and p.dtype.itemsize > 1:
            return p.dtype
    return torch.get_default_dtype()


def _leading_batch(args: Any) -> int:
    import torch

    for leaf in _leaves(args):
        if is_kjt(leaf):
            return int(leaf.stride())
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    raise ValueError("example_inputs holds no tensor to take the batch size from: pass example_batch_size")


def _leaves(obj: Any) -> Iterable[Any]:
    if isinstance(obj, list | tuple):
        for x in obj:
            yield from _leaves(x)
    elif isinstance(obj, Mapping):
        for x in obj.values():
            yield from _leaves(x)
    else:
        yield obj


def _to_meta(obj: Any) -> Any:
    """``obj`` with every tensor copied to meta (shape and dtype kept) and every KeyedJaggedTensor rebuilt there with
    its per-key lengths (which a meta tensor cannot compute)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return torch.empty_like(obj, device="meta")
    if is_kjt(obj):
        return _meta_kjt(obj)
    if isinstance(obj, tuple):
        return tuple(_to_meta(x) for x in obj)
    if isinstance(obj, list):
        return [_to_meta(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_meta(v) for k, v in obj.items()}
    return obj


def is_kjt(obj: Any) -> bool:
    mod = sys.modules.get("torchrec.sparse.jagged_tensor")
    return mod is not None and isinstance(obj, mod.KeyedJaggedTensor)


def _meta_kjt(kjt: Any) -> Any:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if kjt.values().is_meta:
        raise ValueError("example_inputs: pass a real KeyedJaggedTensor (its lengths are data), not one on meta")
    weights = kjt.weights_or_none()

    def meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device="meta")

    return KeyedJaggedTensor(
        keys=kjt.keys(),
        values=meta(kjt.values()),
        weights=meta(weights) if weights is not None else None,
        lengths=meta(kjt.lengths()),
        offsets=meta(kjt.offsets()),
        stride=kjt.stride(),
        length_per_key=kjt.length_per_key(),
        offset_per_key=kjt.offset_per_key(),
    )


def _nbytes(obj: Any) -> int:
    """Bytes of the tensors in ``obj`` (nested sequences and mappings; TorchRec's keyed tensors by their values)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_nbytes(x) for x in obj)
    if isinstance(obj, Mapping):
        return sum(_nbytes(x) for x in obj.values())
    values = getattr(obj, "values", None)
    if callable(values) and not isinstance(obj, type):
        try:
            inner = values()
        except TypeError:
            return 0
        return _nbytes(inner) if isinstance(inner, torch.Tensor) else 0
    return 0
