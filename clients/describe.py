"""Describe a real ``nn.Module`` as a shardwise :class:`~shardwise.wire.spec.ModelSpec`, without allocating its weights.

Build the model on the meta device (``with torch.device("meta"): model = MyModel()``) and call
:func:`describe`; nothing is materialised, so a model with a 1 TB table is described in milliseconds. What becomes
what, walking ``module.named_modules()`` in order:

* ``nn.EmbeddingBag`` → a table named by its FQN: rows, dim, dtype of the weight, pooling ``sum`` / ``mean`` from
  its mode (mode ``max`` is refused: shardwise's cost model and executors know sum and mean pooling only);
* ``nn.Embedding`` → a table with pooling ``none`` (one output row per id);
* TorchRec's ``EmbeddingBagCollection`` / ``EmbeddingCollection`` (and any module implementing their interfaces),
  when TorchRec is in use → one table per config, named by the config (TorchRec plans key tables by that name),
  ``num_features`` = the config's feature count, pooling from the config (``none`` for an EmbeddingCollection);
  the collection's own submodules are not described again;
* ``nn.Linear`` → a dense layer with its forward FLOPs per sample counted by ``torch.utils.flop_counter`` on meta
  tensors (a meta copy of the parameters when the layer has real ones, so no real compute runs).

Pooling factors, access skews, optimizers and input shapes are not in the module: pass them (one value for every
table, or a mapping table name → value). A name in a mapping that matches no table is an error, so a typo does
not silently fall back to the default.

torch is imported lazily; this module otherwise imports the wire models only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shardwise.wire.spec import DenseLayerSpec, Dtype, EmbeddingTableSpec, ModelSpec, Optimizer, Pooling

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["describe"]

T = TypeVar("T")

#: TorchRec ``DataType`` name → wire dtype. INT4 / INT2 / INT32 / INT64 tables have no wire dtype and are refused.
_TORCHREC_DTYPES = {"FP32": Dtype.fp32, "FP16": Dtype.fp16, "BF16": Dtype.bf16, "INT8": Dtype.int8}
_TORCHREC_DTYPES |= {"UINT8": Dtype.int8, "NFP8": Dtype.fp8}


def describe(
    module: nn.Module,
    *,
    batch_size_per_gpu: int,
    name: str | None = None,
    pooling_factors: float | Mapping[str, float] = 1.0,
    access_skew: float | Mapping[str, float] | None = None,
    optimizer: str | Mapping[str, str] = "rowwise_adagrad",
    dense_optimizer: str = "adam",
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> ModelSpec:
    """The :class:`ModelSpec` of ``module`` (see the module docstring for what becomes a table or a layer).

    - ``name``: the model's name; the module's class name by default.
    - ``pooling_factors``: mean ids per sample per feature, for every table or per table name (default 1).
    - ``access_skew``: Zipf exponent of row accesses, for every table or per table name (default: uniform).
    - ``optimizer``: the tables' optimizer (sgd, adagrad, rowwise_adagrad, adam), or per table name.
    - ``dense_optimizer``: the dense layers' optimizer.
    - ``input_shapes``: per dense-layer FQN, the shape of one sample's input without the batch dimension
      (default ``(in_features,)``), e.g. ``(seq_len, in_features)`` for a layer applied to every token; its
      FLOPs per sample are counted on that shape.

    Raises ``ValueError`` for a module shardwise cannot describe (an EmbeddingBag in mode ``max``, a weight dtype
    with no wire equivalent), a mapping key that names no table or layer, or a model with nothing to plan; the
    message names the module.
    """
    from torch import nn  # the torch extra: fail here, not halfway through

    tables: list[dict[str, Any]] = []  # EmbeddingTableSpec fields, less the per-table options
    layers: list[DenseLayerSpec] = []
    shapes = dict(input_shapes or {})
    dense_opt = Optimizer(dense_optimizer)
    collections = _torchrec_collection_types()
    skip: list[str] = []  # FQN prefixes of TorchRec collections, whose submodules are already described
    for fqn, sub in module.named_modules():
        if any(fqn.startswith(prefix) for prefix in skip):
            continue
        if collections and isinstance(sub, collections):
            tables.extend(_torchrec_tables(fqn, sub))
            skip.append(f"{fqn}." if fqn else "")
        elif isinstance(sub, nn.EmbeddingBag):
            tables.append(_embedding_bag(fqn or type(sub).__name__, sub))
        elif isinstance(sub, nn.Embedding):
            tables.append(_embedding(fqn or type(sub).__name__, sub))
        elif isinstance(sub, nn.Linear):
            layer_name = fqn or type(sub).__name__
            layers.append(_linear(layer_name, sub, batch_size_per_gpu, shapes.pop(layer_name, None), dense_opt))
    if shapes:
        raise ValueError(f"input_shapes names no nn.Linear of the module: {', '.join(sorted(shapes))}")

    names = [t["name"] for t in tables]
    factors = _per_table(pooling_factors, names, "pooling_factors", 1.0)
    skews = _per_table(access_skew, names, "access_skew", None)
    optimizers = _per_table(optimizer, names, "optimizer", Optimizer.rowwise_adagrad.value)
    return ModelSpec(
        name=name or type(module).__name__,
        batch_size_per_gpu=batch_size_per_gpu,
        embedding_tables=[
            EmbeddingTableSpec(
                **t,
                pooling_factor=factors[t["name"]],
                access_skew=skews[t["name"]],
                optimizer=Optimizer(optimizers[t["name"]]),
            )
            for t in tables
        ],
        dense_layers=layers,
    )


# --------------------------------------------------------------------------------------------------- helpers


def _per_table(value: T | Mapping[str, T], names: Sequence[str], what: str, default: T) -> dict[str, T]:
    """``value`` for every table, or the mapping's entry (``default`` where it has none); unknown keys are errors."""
    if not isinstance(value, Mapping):
        return dict.fromkeys(names, value)
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ValueError(f"{what} names no embedding table of the module: {', '.join(unknown)}")
    return {n: value.get(n, default) for n in names}


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


def _linear(
    fqn: str, layer: nn.Linear, batch: int, sample_shape: Sequence[int] | None, optimizer: Optimizer
) -> DenseLayerSpec:
    shape = tuple(sample_shape) if sample_shape is not None else (layer.in_features,)
    if not shape or shape[-1] != layer.in_features or any(d <= 0 for d in shape):
        raise ValueError(f"{fqn}: input shape {shape} must be positive and end with in_features={layer.in_features}")
    return DenseLayerSpec(
        name=fqn,
        in_features=layer.in_features,
        out_features=layer.out_features,
        dtype=_wire_dtype(layer.weight.dtype, fqn),
        bias=layer.bias is not None,
        optimizer=optimizer,
        flops_per_sample=_forward_flops(layer, (batch, *shape)) // batch or None,
    )


def _forward_flops(layer: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Forward FLOPs of ``layer`` on a meta input of ``input_shape``; real parameters are swapped for meta ones."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    state = {n: torch.empty_like(t, device="meta") for n, t in _own_tensors(layer)}
    weight = state.get("weight")
    dtype = weight.dtype if weight is not None else torch.get_default_dtype()
    x = torch.empty(input_shape, device="meta", dtype=dtype)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        torch.func.functional_call(layer, state, (x,))
    return int(counter.get_total_flops())


def _own_tensors(layer: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    yield from layer.named_parameters()
    yield from layer.named_buffers()


def _torchrec_collection_types() -> tuple[type, ...]:
    """TorchRec's collection interfaces, if TorchRec is already imported (a module using them has imported it)."""
    mod = sys.modules.get("torchrec.modules.embedding_modules")
    if mod is None:
        return ()
    return (mod.EmbeddingBagCollectionInterface, mod.EmbeddingCollectionInterface)


def _torchrec_tables(fqn: str, collection: Any) -> list[dict[str, Any]]:
    where = fqn or type(collection).__name__
    if hasattr(collection, "embedding_bag_configs"):
        configs, pooled = collection.embedding_bag_configs(), True
    else:
        configs, pooled = collection.embedding_configs(), False
    out: list[dict[str, Any]] = []
    for config in configs:
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
        out.append(
            {
                "name": config.name,
                "num_embeddings": config.num_embeddings,
                "embedding_dim": config.embedding_dim,
                "dtype": _TORCHREC_DTYPES[data_type],
                "pooling": pooling,
                "num_features": max(1, len(config.feature_names)),
            }
        )
    return out
