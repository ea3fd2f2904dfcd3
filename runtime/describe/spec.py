"""Describe a real ``nn.Module`` as a shardwise :class:`~shardwise.wire.spec.ModelSpec`, without allocating its weights.

Build the model on the meta device (``with torch.device("meta"): model = MyModel()``) and call
:func:`describe`; nothing is materialised, so a model with a 1 TB table is described in milliseconds. What becomes
what, walking the module tree from the root:

* ``nn.EmbeddingBag`` → a table named by its FQN: rows, dim, dtype of the weight, pooling ``sum`` / ``mean`` from
  its mode (mode ``max`` is refused: shardwise's cost model and executors know sum and mean pooling only);
* ``nn.Embedding`` → a table with pooling ``none`` (one output row per id);
* TorchRec's ``EmbeddingBagCollection`` / ``EmbeddingCollection`` (and any module implementing their interfaces),
  when TorchRec is in use → one table per config, named by the config (TorchRec plans key tables by that name),
  ``num_features`` = the config's feature count (a feature several tables share counts in each), pooling from the
  config (``none`` for an EmbeddingCollection), ``weighted`` when the collection is (per-id weights travel with the
  ids); the collection's own ``nn.EmbeddingBag`` / ``nn.Embedding`` are those tables, and anything else in it that
  holds parameters (a feature processor) is described by the next two rules;
* ``nn.Linear`` → a ``linear`` dense layer with its forward FLOPs per sample counted by
  ``torch.utils.flop_counter`` on meta tensors (a meta copy of the parameters when the layer has real ones, so no
  real compute runs);
* any other module that holds parameters of its own (``nn.Parameter`` attributes, or an ``nn.ParameterList`` /
  ``nn.ParameterDict`` child — DLRM_DCN's cross network, a norm, ``nn.MultiheadAttention``) → one ``unclassified``
  dense layer named by its FQN, covering the whole subtree (so the layers of a plan never nest): its parameter
  count, its activation bytes (input and output per sample) and its forward FLOPs (FlopCounterMode on meta). It
  runs ``replicate`` or ``fsdp`` (``dense_styles`` pins one). A module that holds parameters of its own *and*
  embedding tables below it cannot be one layer (a layer holds no table): each of its own parameters becomes an
  unclassified layer named by the parameter's FQN, pinned to ``replicate`` (``apply_plan`` all-reduces the gradient
  of such a parameter), and its children are described by these rules.

**Every parameter is accounted for.** After the walk, the described parameters must equal the module's — count and
bytes, each parameter covered once — or :func:`describe` raises ``ValueError`` naming the modules left out (or the
layers that share a parameter). Nothing is dropped silently.

**FLOPs.** Without ``example_inputs``, each layer is counted alone: an ``nn.Linear`` on ``(in_features,)`` (or its
``input_shapes`` entry), an unclassified layer on its ``input_shapes`` entry (a norm's input shape is known from the
norm); one whose input cannot be known is an error that names it. With ``example_inputs`` (the arguments of
``module.forward``: tensors and TorchRec ``KeyedJaggedTensor`` s, copied to the meta device), :func:`describe` runs
the real forward once on meta under ``FlopCounterMode`` and gives each layer the FLOPs of its subtree; FLOPs spent
outside every layer (DLRM's feature interaction, attention in a parameterless block) become a parameterless
unclassified layer named by the module that spends them, so the spec's FLOPs are the forward's.

**Statistics from a real batch.** ``sample_batch`` — a ``KeyedJaggedTensor``, or a mapping feature → ``(ids,
offsets)`` with ``offsets`` of ``batch + 1`` entries (the bag starts and the end) — measures each table's pooling
factor (ids per sample per feature, over the features that feed it) and its access skew (the Zipf exponent of its
row accesses, for the cache; :func:`zipf_exponent`). For TorchRec collections the features are the configs'
``feature_names``; for ``nn.EmbeddingBag`` / ``nn.Embedding`` the feature is the table's FQN. Values passed
explicitly (``pooling_factors``, ``access_skew``) win over the measured ones.

torch is imported lazily; this module otherwise imports the wire models only.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from shardwise.wire.spec import (
    DenseLayerSpec,
    DenseStyle,
    Dtype,
    EmbeddingTableSpec,
    ModelSpec,
    Optimizer,
    Pooling,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["describe", "zipf_exponent"]

T = TypeVar("T")

#: TorchRec ``DataType`` name → wire dtype. INT4 / INT2 / INT32 / INT64 tables have no wire dtype and are refused.
_TORCHREC_DTYPES = {"FP32": Dtype.fp32, "FP16": Dtype.fp16, "BF16": Dtype.bf16, "INT8": Dtype.int8}
_TORCHREC_DTYPES |= {"UINT8": Dtype.int8, "NFP8": Dtype.fp8}

#: below this measured Zipf exponent a table's accesses are reported uniform (``access_skew`` None)
UNIFORM_BELOW = 0.05


@dataclass
class _Table:
    fields: dict[str, Any]  # EmbeddingTableSpec fields, less the per-table options
    features: list[str]  # the sample-batch keys that feed it
    params: list[torch.Tensor]  # the tensors holding it


@dataclass
class _Layer:
    name: str
    module: nn.Module
    kind: str  # "linear" | "unclassified"
    params: list[torch.Tensor] = field(default_factory=list)
    flops: int | None = None  # per sample
    activation_bytes: int | None = None  # per sample
    dtype: Dtype | None = None
    loose: bool = False  # one parameter of a module that also holds tables: named by the parameter, replicated


def describe(
    module: nn.Module,
    *,
    batch_size_per_gpu: int,
    name: str | None = None,
    pooling_factors: float | Mapping[str, float] | None = None,
    access_skew: float | Mapping[str, float] | None = None,
    optimizer: str | Mapping[str, str] = "rowwise_adagrad",
    dense_optimizer: str = "adam",
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    example_inputs: Any = None,
    example_batch_size: int | None = None,
    sample_batch: Any = None,
    dense_styles: Mapping[str, str] | None = None,
) -> ModelSpec:
    """The :class:`ModelSpec` of ``module`` (see the module docstring for what becomes a table or a layer).

    - ``name``: the model's name; the module's class name by default.
    - ``pooling_factors``: mean ids per sample per feature, for every table or per table name (default: measured
      from ``sample_batch``, else 1).
    - ``access_skew``: Zipf exponent of row accesses, for every table or per table name (default: measured from
      ``sample_batch``, else uniform).
    - ``optimizer``: the tables' optimizer (sgd, adagrad, rowwise_adagrad, adam), or per table name.
    - ``dense_optimizer``: the dense layers' optimizer.
    - ``input_shapes``: per layer FQN, the shape of one sample's input without the batch dimension (an
      ``nn.Linear``'s default is ``(in_features,)``), e.g. ``(seq_len, in_features)`` for a layer applied to every
      token; its FLOPs per sample are counted on that shape. Not with ``example_inputs``.
    - ``example_inputs``: the arguments of ``module.forward`` (a tuple, or one argument) for one batch, on any device;
      they are copied to meta and the forward is run there once to count every layer's FLOPs and activations.
    - ``example_batch_size``: the samples in ``example_inputs`` (default: the first tensor's leading dimension, or a
      ``KeyedJaggedTensor``'s stride).
    - ``sample_batch``: a real batch of sparse features (``KeyedJaggedTensor`` or feature → ``(ids, offsets)``) to
      measure pooling factors and access skews from (module docstring).
    - ``dense_styles``: per dense-layer name, a style to pin (replicate, fsdp; colwise or rowwise for a linear one).

    Raises ``ValueError`` for a module shardwise cannot describe (an EmbeddingBag in mode ``max``, a weight dtype
    with no wire equivalent, parameters left out or shared, a layer whose FLOPs cannot be counted), a mapping key
    that names no table or layer, a sample batch that does not fit the tables, or a model with nothing to plan; the
    message names the module.
    """
    import torch  # noqa: F401  (the torch extra: fail here, not halfway through)

    if example_inputs is not None and input_shapes:
        raise ValueError("pass example_inputs or input_shapes, not both: the example's forward gives every shape")
    tables: list[_Table] = []
    layers: list[_Layer] = []
    _walk(module, "", tables, layers, inside_collection=False)
    _account(module, tables, layers)

    dense_opt = Optimizer(dense_optimizer)
    if example_inputs is not None:
        _measure_forward(module, layers, example_inputs, example_batch_size)
    else:
        _measure_alone(layers, batch_size_per_gpu, dict(input_shapes or {}))

    names = [t.fields["name"] for t in tables]
    measured_pf: dict[str, float] = {}
    measured_skew: dict[str, float | None] = {}
    if sample_batch is not None:
        measured_pf, measured_skew = _batch_statistics(tables, _features(sample_batch))
    factors = _per_table(pooling_factors, names, "pooling_factors", measured_pf, 1.0)
    skews = _per_table(access_skew, names, "access_skew", measured_skew, None)
    optimizers = _per_table(optimizer, names, "optimizer", {}, Optimizer.rowwise_adagrad.value)
    styles = dict(dense_styles or {})
    unknown = sorted(set(styles) - {layer.name for layer in layers})
    if unknown:
        raise ValueError(f"dense_styles names no dense layer of the module: {', '.join(unknown)}")
    return ModelSpec(
        name=name or type(module).__name__,
        batch_size_per_gpu=batch_size_per_gpu,
        embedding_tables=[
            EmbeddingTableSpec(
                **t.fields,
                pooling_factor=factors[t.fields["name"]],
                access_skew=skews[t.fields["name"]],
                optimizer=Optimizer(optimizers[t.fields["name"]]),
            )
            for t in tables
        ],
        dense_layers=[_layer_spec(layer, dense_opt, styles.get(layer.name)) for layer in layers],
    )


# --------------------------------------------------------------------------------------------------- the walk


def _walk(mod: nn.Module, fqn: str, tables: list[_Table], layers: list[_Layer], *, inside_collection: bool) -> None:
    """Describe ``mod`` (at ``fqn``) and, unless it is described whole, its children (module docstring)."""
    from torch import nn

    where = fqn or type(mod).__name__
    collections = _torchrec_collection_types()
    if collections and isinstance(mod, collections):
        tables.extend(_torchrec_tables(where, mod))
        for child_name, child in mod.named_children():
            _walk(child, _join(fqn, child_name), tables, layers, inside_collection=True)
        return
    if isinstance(mod, nn.EmbeddingBag | nn.Embedding):
        if not inside_collection:  # inside a collection it is one of the collection's tables
            fields = _embedding_bag(where, mod) if isinstance(mod, nn.EmbeddingBag) else _embedding(where, mod)
            tables.append(_Table(fields, [where], [mod.weight]))
        return
    if isinstance(mod, nn.Linear) and {n for n, _ in mod.named_parameters()} <= {"weight", "bias"}:
        layers.append(_Layer(where, mod, "linear", list(mod.parameters())))
        return
    own = _own_parameters(mod)
    if own:
        if not any(_holds_tables(m) for m in mod.modules()):
            layers.append(_Layer(where, mod, "unclassified", list(mod.parameters())))
            return
        # beside tables it cannot be one layer (a layer holds no table): each parameter is one, replicated
        named = dict(mod.named_parameters())
        layers.extend(
            _Layer(_join(fqn, n), mod, "unclassified", [named[n]], flops=0, activation_bytes=0, loose=True) for n in own
        )
    for child_name, child in mod.named_children():
        if not isinstance(child, nn.ParameterList | nn.ParameterDict):
            _walk(child, _join(fqn, child_name), tables, layers, inside_collection=inside_collection)


def _join(fqn: str, name: str) -> str:
    return f"{fqn}.{name}" if fqn else name


def _own_parameters(mod: nn.Module) -> list[str]:
    """The parameters ``mod`` holds itself: its direct ones and those of its ``ParameterList`` / ``ParameterDict``
    children (containers, not layers)."""
    from torch import nn

    out = [n for n, _ in mod.named_parameters(recurse=False)]
    for child_name, child in mod.named_children():
        if isinstance(child, nn.ParameterList | nn.ParameterDict):
            out.extend(f"{child_name}.{n}" for n, _ in child.named_parameters())
    return out


def _holds_tables(mod: nn.Module) -> bool:
    from torch import nn

    collections = _torchrec_collection_types()
    return isinstance(mod, nn.EmbeddingBag | nn.Embedding) or bool(collections and isinstance(mod, collections))


def _account(module: nn.Module, tables: Sequence[_Table], layers: Sequence[_Layer]) -> None:
    """Every parameter of ``module`` is described exactly once, and the spec's counts and bytes are the module's."""
    owner: dict[int, list[str]] = {}
    for t in tables:
        for p in t.params:
            owner.setdefault(id(p), []).append(f"table {t.fields['name']}")
    for layer in layers:
        for p in layer.params:
            owner.setdefault(id(p), []).append(f"dense layer {layer.name}")
    shared = sorted({" and ".join(o) for o in owner.values() if len(o) > 1})
    if shared:
        raise ValueError(
            f"{'; '.join(shared)} share parameters (tied weights); describe() would count them twice: describe "
            "this model by hand, or untie them"
        )
    left: dict[str, int] = {}
    for pname, p in module.named_parameters():
        if id(p) not in owner:
            mod_name = pname.rpartition(".")[0] or type(module).__name__
            left[mod_name] = left.get(mod_name, 0) + p.numel()
    if left:
        listed = ", ".join(f"{m} ({n:,} parameters)" for m, n in sorted(left.items()))
        raise ValueError(f"describe() left out parameters of {listed}")
    count = sum(p.numel() for p in module.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in module.parameters())
    described = sum(t.fields["num_embeddings"] * t.fields["embedding_dim"] for t in tables)
    described_bytes = sum(
        t.fields["num_embeddings"] * t.fields["embedding_dim"] * t.fields["dtype"].nbytes for t in tables
    )
    for layer in layers:
        layer.dtype = _layer_dtype(layer)
        n = sum(p.numel() for p in layer.params)
        described += n
        described_bytes += n * layer.dtype.nbytes
    if (described, described_bytes) != (count, nbytes):
        raise ValueError(
            f"the description holds {described:,} parameters ({described_bytes:,} bytes), the module "
            f"{count:,} ({nbytes:,} bytes): a table's config disagrees with its weights"
        )


def _layer_dtype(layer: _Layer) -> Dtype:
    import torch

    dtypes = {p.dtype for p in layer.params}
    if len(dtypes) > 1:
        raise ValueError(
            f"{layer.name}: parameters of several dtypes ({', '.join(sorted(map(str, dtypes)))}); a dense layer "
            "has one: describe its parts as separate submodules"
        )
    return _wire_dtype(dtypes.pop() if dtypes else torch.get_default_dtype(), layer.name)


def _layer_spec(layer: _Layer, optimizer: Optimizer, style: str | None) -> DenseLayerSpec:
    assert layer.dtype is not None  # _account
    pinned = DenseStyle(style) if style is not None else None
    if layer.loose:
        if pinned not in (None, DenseStyle.replicate):
            raise ValueError(
                f"{layer.name}: a parameter its module holds beside embedding tables runs replicate (apply_plan "
                "all-reduces its gradient); to shard it, move it into a submodule"
            )
        pinned = DenseStyle.replicate
    if layer.kind == "linear":
        mod = layer.module
        return DenseLayerSpec(
            name=layer.name,
            in_features=mod.in_features,
            out_features=mod.out_features,
            dtype=layer.dtype,
            bias=mod.bias is not None,
            optimizer=optimizer,
            flops_per_sample=layer.flops,
            activation_bytes_per_sample=layer.activation_bytes,
            style=pinned,
        )
    return DenseLayerSpec(
        name=layer.name,
        kind="unclassified",
        param_count=sum(p.numel() for p in layer.params),
        activation_bytes_per_sample=layer.activation_bytes or 0,
        dtype=layer.dtype,
        optimizer=optimizer,
        flops_per_sample=layer.flops or 0,
        style=pinned,
    )


# --------------------------------------------------------------------------------------------------- FLOPs


def _meta_state(module: nn.Module) -> dict[str, torch.Tensor]:
    import torch

    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return {n: torch.empty_like(t, device="meta") for n, t in named}


def _measure_alone(layers: Sequence[_Layer], batch: int, shapes: dict[str, Sequence[int]]) -> None:
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


def _measure_forward(module: nn.Module, layers: list[_Layer], example_inputs: Any, batch: int | None) -> None:
    """Run ``module``'s forward once on meta, giving each layer its subtree's FLOPs and activations, and adding a
    parameterless layer for each module that spends FLOPs outside every layer (module docstring)."""
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
    extra: list[_Layer] = []
    dtype = _wire_dtype(_compute_dtype(module), root)
    for fqn, mod in module.named_modules():
        if any(fqn == c or fqn.startswith(f"{c}.") for c in covered):
            continue
        own = subtree.get(fqn, 0) - sum(subtree.get(_join(fqn, c), 0) for c, _ in mod.named_children())
        if own <= 0:
            continue
        name = fqn or root
        if name in by_name:
            raise ValueError(f"{name}: a table or layer already has this name; rename the module")
        extra.append(
            _Layer(
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
        if _is_kjt(leaf):
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
    if _is_kjt(obj):
        return _meta_kjt(obj)
    if isinstance(obj, tuple):
        return tuple(_to_meta(x) for x in obj)
    if isinstance(obj, list):
        return [_to_meta(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_meta(v) for k, v in obj.items()}
    return obj


def _is_kjt(obj: Any) -> bool:
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


# --------------------------------------------------------------------------------------------------- a real batch


def _features(sample_batch: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Feature → (ids, offsets with the end) of a KeyedJaggedTensor or a mapping; checked."""
    import torch

    if _is_kjt(sample_batch):
        out = {k: (jt.values(), jt.offsets()) for k, jt in sample_batch.to_dict().items()}
    elif isinstance(sample_batch, Mapping):
        out = {}
        for k, v in sample_batch.items():
            if not (isinstance(v, tuple | list) and len(v) == 2):
                raise ValueError(f"sample_batch[{k!r}]: expected (ids, offsets), got {type(v).__name__}")
            out[str(k)] = (torch.as_tensor(v[0]), torch.as_tensor(v[1]))
    else:
        raise ValueError(
            f"sample_batch: expected a KeyedJaggedTensor or a mapping feature -> (ids, offsets), got "
            f"{type(sample_batch).__name__}"
        )
    for k, (ids, offsets) in out.items():
        if ids.is_meta or offsets.is_meta:
            raise ValueError(f"sample_batch[{k!r}]: a real batch is needed, not meta tensors")
        if ids.dim() != 1 or offsets.dim() != 1 or ids.is_floating_point() or offsets.is_floating_point():
            raise ValueError(f"sample_batch[{k!r}]: ids and offsets must be 1-D integer tensors")
        if offsets.numel() < 2:
            raise ValueError(f"sample_batch[{k!r}]: offsets need batch + 1 entries (the bag starts and the end)")
        if int(offsets[0]) != 0 or int(offsets[-1]) != ids.numel() or bool((offsets[1:] < offsets[:-1]).any()):
            raise ValueError(
                f"sample_batch[{k!r}]: offsets must rise from 0 to the number of ids ({ids.numel()}), with the end "
                "as the last entry"
            )
    return out


def _batch_statistics(
    tables: Sequence[_Table], features: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
) -> tuple[dict[str, float], dict[str, float | None]]:
    """Per table: pooling factor (ids per sample per feature) and Zipf exponent, from the features feeding it."""
    import torch

    wanted = {f for t in tables for f in t.features}
    unknown = sorted(set(features) - wanted)
    if unknown:
        raise ValueError(f"sample_batch has features no table reads: {', '.join(unknown)}")
    factors: dict[str, float] = {}
    skews: dict[str, float | None] = {}
    for t in tables:
        name = t.fields["name"]
        missing = [f for f in t.features if f not in features]
        if missing:
            raise ValueError(f"table {name}: sample_batch lacks its feature(s) {', '.join(missing)}")
        ids = torch.cat([features[f][0].reshape(-1).long() for f in t.features])
        bags = sum(features[f][1].numel() - 1 for f in t.features)
        if ids.numel() == 0:
            raise ValueError(
                f"table {name}: no ids in the sample batch; pass its pooling factor, or a batch where it is used"
            )
        rows = t.fields["num_embeddings"]
        if bool((ids < 0).any()) or bool((ids >= rows).any()):
            raise ValueError(f"table {name}: sample_batch has ids outside 0..{rows - 1}")
        factors[name] = ids.numel() / bags
        s = zipf_exponent(ids)
        skews[name] = None if s is None or s < UNIFORM_BELOW else min(s, 5.0)
    return factors, skews


def zipf_exponent(ids: torch.Tensor, *, min_count: int = 2) -> float | None:
    """The Zipf exponent ``s`` of the row accesses in ``ids`` (``P(rank k) ∝ k^-s``), or None when the batch repeats
    too few ids to tell (every id seen about once: nothing says the accesses are skewed).

    Split-half maximum likelihood: the ids of one half of the batch are ranked by how often they occur there (ties
    share their mean rank; ids seen fewer than ``min_count`` times are left out), and ``s`` maximises the likelihood
    of the *other* half's accesses to those ids under a Zipf law over those ranks; the two halves swap and the two
    estimates are averaged. Ranking and counting on the same ids would read sampling noise as skew (a uniform batch
    sorted by count looks Zipf-like); counting on independent samples does not. It measures the head of the
    distribution, the rows a cache keeps: uniform batches give ≈ 0, Zipf(0.9–1.3) batches within a few hundredths;
    over a table far larger than the batch, a flat law (s ≈ 0.6) reads somewhat high.
    """

    flat = ids.reshape(-1).long()
    half = flat.numel() // 2
    if half < 2:
        return None
    a, b = flat[:half], flat[half : 2 * half]
    found = [_half_estimate(x, y, min_count) for x, y in ((a, b), (b, a))]
    estimates = [e for e in found if e is not None]
    if len(estimates) < 2:
        return None
    return sum(estimates) / len(estimates)


def _half_estimate(ranked: torch.Tensor, counted: torch.Tensor, min_count: int) -> float | None:
    import torch

    uniq, counts = torch.unique(ranked, return_counts=True)
    keep = counts >= min_count
    uniq, counts = uniq[keep], counts[keep]
    if uniq.numel() < 3:
        return None
    order = torch.argsort(counts, descending=True, stable=True)
    uniq, counts = uniq[order], counts[order]
    _, group, size = torch.unique_consecutive(counts, return_inverse=True, return_counts=True)
    ends = torch.cumsum(size, 0).double()
    log_rank = torch.log(((ends - size.double() + 1 + ends) / 2)[group])
    other, other_counts = torch.unique(counted, return_counts=True)
    at = torch.searchsorted(other, uniq).clamp(max=other.numel() - 1)
    hits = torch.where(other[at] == uniq, other_counts[at], torch.zeros_like(at)).double()
    total = float(hits.sum())
    if total == 0:
        return None
    weighted = float((hits * log_rank).sum())

    def log_likelihood(s: float) -> float:
        return -s * weighted - total * math.log(float(torch.exp(-s * log_rank).sum()))

    return _argmax(log_likelihood, 0.0, 5.0)


def _argmax(f: Callable[[float], float], lo: float, hi: float, steps: int = 60) -> float:
    """Golden-section search for the maximum of a unimodal ``f`` on ``[lo, hi]``."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


# --------------------------------------------------------------------------------------------------- helpers


def _per_table(
    value: T | Mapping[str, T] | None, names: Sequence[str], what: str, measured: Mapping[str, T], default: T
) -> dict[str, T]:
    """Per table: the value given (one for all, or the mapping's entry), else the measured one, else ``default``;
    unknown mapping keys are errors."""
    if value is not None and not isinstance(value, Mapping):
        return dict.fromkeys(names, value)
    given: Mapping[str, T] = value if isinstance(value, Mapping) else {}
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"{what} names no embedding table of the module: {', '.join(unknown)}")
    return {n: given[n] if n in given else measured.get(n, default) for n in names}


def _wire_dtype(dtype: torch.dtype, where: str) -> Dtype:
    import torch

    if dtype.is_floating_point and dtype.itemsize == 1:  # every float8 flavour
        return Dtype.fp8
    known = {torch.float32: Dtype.fp32, torch.float16: Dtype.fp16, torch.bfloat16: Dtype.bf16}
    known |= {torch.int8: Dtype.int8, torch.uint8: Dtype.int8}
    if dtype not in known:
        raise ValueError(f"{where}: weight dtype {dtype} has no shardwise dtype (fp32, fp16, bf16, fp8, int8)")
    return known[dtype]


def _embedding_bag(fqn: str, bag: nn.EmbeddingBag) -> dict[str, Any]:
    if bag.mode not in ("sum", "mean"):
        raise ValueError(
            f"{fqn}: nn.EmbeddingBag mode {bag.mode!r} is not supported; shardwise plans sum and mean pooling "
            "(use mode='sum' or 'mean', or describe this table by hand)"
        )
    rows, dim = bag.weight.shape
    return {
        "name": fqn,
        "num_embeddings": rows,
        "embedding_dim": dim,
        "dtype": _wire_dtype(bag.weight.dtype, fqn),
        "pooling": Pooling(bag.mode),
    }


def _embedding(fqn: str, emb: nn.Embedding) -> dict[str, Any]:
    rows, dim = emb.weight.shape
    return {
        "name": fqn,
        "num_embeddings": rows,
        "embedding_dim": dim,
        "dtype": _wire_dtype(emb.weight.dtype, fqn),
        "pooling": Pooling.none,
    }


def _torchrec_collection_types() -> tuple[type, ...]:
    """TorchRec's collection interfaces, if TorchRec is already imported (a module using them has imported it)."""
    mod = sys.modules.get("torchrec.modules.embedding_modules")
    if mod is None:
        return ()
    return (mod.EmbeddingBagCollectionInterface, mod.EmbeddingCollectionInterface)


def _torchrec_tables(where: str, collection: Any) -> list[_Table]:
    from torch import nn

    if hasattr(collection, "embedding_bag_configs"):
        configs, pooled = collection.embedding_bag_configs(), True
        weighted = bool(collection.is_weighted())
    else:
        configs, pooled, weighted = collection.embedding_configs(), False, False
    params = [m.weight for m in collection.modules() if isinstance(m, nn.EmbeddingBag | nn.Embedding)]
    out: list[_Table] = []
    for i, config in enumerate(configs):
        table = f"{where}: table {config.name}"
        data_type = getattr(config.data_type, "name", str(config.data_type))
        if data_type not in _TORCHREC_DTYPES:
            raise ValueError(f"{table}: TorchRec data type {data_type} has no shardwise dtype")
        pooling = Pooling.none
        if pooled:
            mode = getattr(config.pooling, "name", str(config.pooling)).lower()
            if mode not in ("sum", "mean"):
                raise ValueError(f"{table}: pooling {mode!r} is not supported (sum or mean)")
            pooling = Pooling(mode)
        features = list(config.feature_names) or [config.name]
        fields = {
            "name": config.name,
            "num_embeddings": config.num_embeddings,
            "embedding_dim": config.embedding_dim,
            "dtype": _TORCHREC_DTYPES[data_type],
            "pooling": pooling,
            "num_features": len(features),
            "weighted": weighted,
        }
        # the collection's weights go with its first table; _account checks the configs add up to them
        out.append(_Table(fields, features, params if i == 0 else []))
    return out
