"""FLOPs and activation bytes of the described layers, counted by ``torch.utils.flop_counter`` on the meta device:
each layer alone on its input shape, or the module's own forward run once on meta copies of ``example_inputs``
(the package docstring, "FLOPs")."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardwise.runtime.describe.walk import Layer, Table, wire_dtype

if TYPE_CHECKING:
    import torch
    from torch import nn


def _meta_state(module: nn.Module, tables: Sequence[Table] = ()) -> tuple[dict[str, torch.Tensor], dict[int, str]]:
    """Meta copies of ``module``'s parameters and buffers by name (a tensor held under several names, a tied weight,
    is one copy under each), and the ids of the copies of ``tables``' weights → table name."""
    import torch

    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    copies: dict[int, torch.Tensor] = {}
    state = {n: copies.setdefault(id(t), torch.empty_like(t, device="meta")) for n, t in named}
    weights = {id(copies[id(p)]): t.fields["name"] for t in tables for p in t.params if id(p) in copies}
    return state, weights


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
            what = f"{layer.name} ({type(mod).__name__}, {n:,} parameters)"
            if isinstance(mod, nn.MultiheadAttention):
                what = f"{what[:-1]}; its input_shapes entry is (seq_len, {mod.embed_dim}))"
            unknown.append(what)
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
    """Forward FLOPs of ``layer`` on a meta input of ``input_shape`` (batch first), and the bytes of that input and
    its output; real parameters are swapped for meta ones. An ``nn.MultiheadAttention`` attends the input to itself
    (query, key and value one tensor, ``need_weights=False`` as ``nn.TransformerEncoderLayer`` calls it), batch
    second unless it is ``batch_first``."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    state, _ = _meta_state(layer)
    floats = [t for t in state.values() if t.is_floating_point()]
    dtype = floats[0].dtype if floats else torch.get_default_dtype()
    x = torch.empty(input_shape, device="meta", dtype=dtype)
    args: tuple[Any, ...] = (x,)
    kwargs: dict[str, Any] = {}
    if isinstance(layer, nn.MultiheadAttention):
        if len(input_shape) != 3 or input_shape[-1] != layer.embed_dim:
            raise ValueError(
                f"{where}: input shape {input_shape[1:]} must be (seq_len, embed_dim={layer.embed_dim}), one "
                "sample's sequence"
            )
        if not layer.batch_first:
            x = x.transpose(0, 1)
        args, kwargs = (x, x, x), {"need_weights": False}
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            out = torch.func.functional_call(layer, state, args, kwargs)
    except Exception as e:
        raise ValueError(
            f"{where}: its forward ({type(layer).__name__}) failed on one input of shape {input_shape} on the meta "
            f"device ({e}); pass example_inputs (the model's forward arguments) instead"
        ) from e
    return int(counter.get_total_flops()), _nbytes(x) + _nbytes(out)


@dataclass
class Forward:
    """What the example forward saw besides FLOPs: every call of a described ``nn.Embedding`` (the FQN of its
    table → one entry per call: the ids' shape, and the real ids where they were an example input passed through
    unchanged, else None), the real ``KeyedJaggedTensor`` s of the example, and each table whose weight an operation
    other than its lookup read (table name → the operations, e.g. ``aten.t`` of ``F.linear(x, emb.weight)``)."""

    batch: int
    lookups: dict[str, list[tuple[tuple[int, ...], torch.Tensor | None]]] = field(default_factory=dict)
    kjts: list[Any] = field(default_factory=list)
    weight_reads: dict[str, set[str]] = field(default_factory=dict)


#: the operations that read an embedding weight as its lookup (anything else reading it uses the weight as a matrix)
_LOOKUP_OPS = frozenset(
    {"aten.embedding", "aten.embedding_bag", "aten._embedding_bag", "aten._embedding_bag_forward_only"}
)


def measure_forward(
    module: nn.Module, layers: list[Layer], tables: Sequence[Table], example_inputs: Any, batch: int | None
) -> Forward:
    """Run ``module``'s forward once on meta, giving each layer the FLOPs spent while it runs and adding a
    parameterless layer for each module that spends FLOPs outside every layer (the package docstring); returns what
    else the forward saw (:class:`Forward`).

    Each FLOP goes to one place: the innermost described layer running when it is spent, else the innermost module
    running. ``FlopCounterMode``'s own per-module figures credit a FLOP to every module running, so a parameterless
    container (``nn.TransformerEncoder`` holding its layers in an ``nn.ModuleList`` that is never called) would
    hold its layers' FLOPs a second time."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if batch is None:
        batch = _leading_batch(args)
    if batch <= 0:
        raise ValueError(f"example_batch_size must be positive, got {batch}")
    real: dict[int, torch.Tensor] = {}
    meta_args = _to_meta(args, real)
    seen = Forward(batch, kjts=[leaf for leaf in _leaves(args) if is_kjt(leaf)])
    names = {m: n for n, m in module.named_modules()}
    whole = {id(layer.module): layer for layer in layers if not layer.loose}
    looked_up = {id(t.embedding): t.fields["name"] for t in tables if t.embedding is not None}
    io_bytes: dict[str, int] = {}
    spent: dict[str, int] = {}  # FLOPs per layer's module FQN, or per module FQN outside every layer
    running: list[nn.Module] = []
    counted = [0]
    counter = FlopCounterMode(display=False)

    def settle() -> None:
        """Give the FLOPs spent since the last hook to the innermost layer running, else the innermost module."""
        total = int(counter.get_total_flops())
        if total > counted[0] and running:
            owner = names[next((m for m in reversed(running) if id(m) in whole), running[-1])]
            spent[owner] = spent.get(owner, 0) + total - counted[0]
        counted[0] = total

    def pre(mod: nn.Module, inputs: Any) -> None:
        settle()
        running.append(mod)
        io_bytes[names[mod]] = io_bytes.get(names[mod], 0) + _nbytes(inputs)
        table = looked_up.get(id(mod))
        if table is not None and inputs and isinstance(inputs[0], torch.Tensor):
            ids = inputs[0]
            seen.lookups.setdefault(table, []).append((tuple(ids.shape), real.get(id(ids))))

    def post(mod: nn.Module, inputs: Any, output: Any) -> None:
        settle()
        if running and running[-1] is mod:
            running.pop()
        io_bytes[names[mod]] = io_bytes.get(names[mod], 0) + _nbytes(output)

    state, weights = _meta_state(module, tables)
    handles = [m.register_forward_pre_hook(pre) for m in names] + [m.register_forward_hook(post) for m in names]
    try:
        with counter, _weight_reads(weights, seen.weight_reads), torch.no_grad():
            torch.func.functional_call(module, state, meta_args)
            settle()
    except Exception as e:
        raise ValueError(
            f"example_inputs: the forward of {type(module).__name__} failed on the meta device ({e}); pass inputs "
            "its forward takes, or input_shapes instead"
        ) from e
    finally:
        for h in handles:
            h.remove()
    root = type(module).__name__
    for layer in whole.values():
        fqn = names[layer.module]
        layer.flops = spent.get(fqn, 0) // batch
        layer.activation_bytes = math.ceil(io_bytes.get(fqn, 0) / batch)
    covered = {names[layer.module]: layer for layer in whole.values()}
    by_name = {layer.name: layer for layer in layers}
    dtype = wire_dtype(_compute_dtype(module), root)
    modules = dict(module.named_modules())
    for owner, flops in spent.items():
        if owner in covered or flops <= 0:
            continue
        # a module inside a layer, called from outside it: its FLOPs are the layer's all the same (layers never nest)
        inside = next((layer for c, layer in covered.items() if owner.startswith(f"{c}.")), None)
        if inside is not None:
            inside.flops = (inside.flops or 0) + flops // batch
            continue
        name = owner or root
        if name in by_name:
            raise ValueError(f"{name}: a table or layer already has this name; rename the module")
        by_name[name] = Layer(
            name,
            modules[owner],
            "unclassified",
            flops=flops // batch,
            activation_bytes=math.ceil(io_bytes.get(owner, 0) / batch),
            dtype=dtype,
        )
        layers.append(by_name[name])
    return seen


def _weight_reads(weights: Mapping[int, str], reads: dict[str, set[str]]) -> Any:
    """A dispatch mode noting every operation other than a lookup that reads a table's (meta) weight: table name →
    operation names."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class WeightReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            op = str(func.overloadpacket)
            if weights and op not in _LOOKUP_OPS:
                for leaf in _leaves((args, kwargs)):
                    table = weights.get(id(leaf))
                    if table is not None:
                        reads.setdefault(table, set()).add(op)
            return func(*args, **kwargs)

    return WeightReads()  # type: ignore[no-untyped-call]


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


def _to_meta(obj: Any, real: dict[int, torch.Tensor]) -> Any:
    """``obj`` with every tensor copied to meta (shape and dtype kept) and every KeyedJaggedTensor rebuilt there with
    its per-key lengths (which a meta tensor cannot compute); ``real`` gets each copy's id → the tensor copied."""
    import torch

    if isinstance(obj, torch.Tensor):
        copy = torch.empty_like(obj, device="meta")
        if not obj.is_meta:
            real[id(copy)] = obj
        return copy
    if is_kjt(obj):
        return _meta_kjt(obj)
    if isinstance(obj, tuple):
        return tuple(_to_meta(x, real) for x in obj)
    if isinstance(obj, list):
        return [_to_meta(x, real) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_meta(v, real) for k, v in obj.items()}
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
