"""The walk of :func:`~shardwise.runtime.describe.describe`: what in a module becomes a table or a dense layer, and the
check that every parameter is described exactly once (the package docstring says the rules)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardwise.wire.spec import Dtype, Pooling

if TYPE_CHECKING:
    import torch
    from torch import nn

#: TorchRec ``DataType`` name → wire dtype. INT4 / INT2 / INT32 / INT64 tables have no wire dtype and are refused.
_TORCHREC_DTYPES = {"FP32": Dtype.fp32, "FP16": Dtype.fp16, "BF16": Dtype.bf16, "INT8": Dtype.int8}
_TORCHREC_DTYPES |= {"UINT8": Dtype.int8, "NFP8": Dtype.fp8}


@dataclass
class Table:
    fields: dict[str, Any]  # EmbeddingTableSpec fields, less the per-table options
    features: list[str]  # the sample-batch keys that feed it
    params: list[torch.Tensor]  # the tensors holding it
    embedding: nn.Embedding | None = None  # the nn.Embedding it is: its calls in an example forward give its ids


@dataclass
class Layer:
    name: str
    module: nn.Module
    kind: str  # "linear" | "unclassified"
    params: list[torch.Tensor] = field(default_factory=list)
    flops: int | None = None  # per sample
    activation_bytes: int | None = None  # per sample
    dtype: Dtype | None = None
    loose: bool = False  # one parameter of a module that also holds tables: named by the parameter, replicated
    tied: str | None = None  # an nn.Linear whose weight is this table's: the layer holds its bias alone


def walk(mod: nn.Module, fqn: str, tables: list[Table], layers: list[Layer], *, inside_collection: bool) -> None:
    """Describe ``mod`` (at ``fqn``) and, unless it is described whole, its children (the package docstring)."""
    from torch import nn

    where = fqn or type(mod).__name__
    collections = _torchrec_collection_types()
    if collections and isinstance(mod, collections):
        tables.extend(_torchrec_tables(where, mod))
        for child_name, child in mod.named_children():
            walk(child, join(fqn, child_name), tables, layers, inside_collection=True)
        return
    if isinstance(mod, nn.EmbeddingBag | nn.Embedding):
        if not inside_collection:  # inside a collection it is one of the collection's tables
            if isinstance(mod, nn.EmbeddingBag):
                tables.append(Table(_embedding_bag(where, mod), [where], [mod.weight]))
            else:
                tables.append(Table(_embedding(where, mod), [where], [mod.weight], embedding=mod))
        return
    if isinstance(mod, nn.Linear) and {n for n, _ in mod.named_parameters()} <= {"weight", "bias"}:
        layers.append(Layer(where, mod, "linear", list(mod.parameters())))
        return
    own = _own_parameters(mod)
    if own:
        if not any(_holds_tables(m) for m in mod.modules()):
            layers.append(Layer(where, mod, "unclassified", list(mod.parameters())))
            return
        # beside tables it cannot be one layer (a layer holds no table): each parameter is one, replicated
        named = dict(mod.named_parameters())
        layers.extend(
            Layer(join(fqn, n), mod, "unclassified", [named[n]], flops=0, activation_bytes=0, loose=True) for n in own
        )
    for child_name, child in mod.named_children():
        if not isinstance(child, nn.ParameterList | nn.ParameterDict):
            walk(child, join(fqn, child_name), tables, layers, inside_collection=inside_collection)


def join(fqn: str, name: str) -> str:
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


def tie(tables: Sequence[Table], layers: Sequence[Layer]) -> list[str]:
    """Describe each ``nn.Linear`` whose weight is a table's (an output head tied to the item embedding, SASRec and
    BERT4Rec style) as a head over that table: the layer keeps its bias alone, so the weight is described once, in
    the table, and the layer becomes an unclassified one priced as the GEMM it runs. Returns a warning per tie."""
    from torch import nn

    tables_of = {id(p): t.fields["name"] for t in tables for p in t.params}
    out = []
    for layer in layers:
        head = layer.module
        if layer.kind != "linear" or not isinstance(head, nn.Linear) or id(head.weight) not in tables_of:
            continue
        layer.tied = tables_of[id(head.weight)]
        layer.params = [p for p in layer.params if p is not head.weight]
        out.append(tied_warning(layer.tied, f"its weight is also the weight of {layer.name}, an nn.Linear"))
    return out


def tied_warning(table: str, how: str) -> str:
    """What describe() warns of a table whose weight a layer multiplies by (``how`` says who)."""
    return (
        f"table {table}: {how}; the weight is described once, in the table, and the product as a dense layer's "
        "GEMM. The planner prices the table's update from its lookups alone, though the product's gradient reaches "
        "every row it reads each step, and apply_plan cannot run such a table sharded (the product reads the whole "
        "weight)"
    )


def account(module: nn.Module, tables: Sequence[Table], layers: Sequence[Layer]) -> None:
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


def _layer_dtype(layer: Layer) -> Dtype:
    import torch
    from torch import nn

    dtypes = {p.dtype for p in layer.params}
    if layer.tied is not None and isinstance(layer.module, nn.Linear):  # it multiplies by the table's weight
        dtypes.add(layer.module.weight.dtype)
    if len(dtypes) > 1:
        raise ValueError(
            f"{layer.name}: parameters of several dtypes ({', '.join(sorted(map(str, dtypes)))}); a dense layer "
            "has one: describe its parts as separate submodules"
        )
    return wire_dtype(dtypes.pop() if dtypes else torch.get_default_dtype(), layer.name)


def wire_dtype(dtype: torch.dtype, where: str) -> Dtype:
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
        "dtype": wire_dtype(bag.weight.dtype, fqn),
        "pooling": Pooling(bag.mode),
    }


def _embedding(fqn: str, emb: nn.Embedding) -> dict[str, Any]:
    rows, dim = emb.weight.shape
    return {
        "name": fqn,
        "num_embeddings": rows,
        "embedding_dim": dim,
        "dtype": wire_dtype(emb.weight.dtype, fqn),
        "pooling": Pooling.none,
    }


def _torchrec_collection_types() -> tuple[type, ...]:
    """TorchRec's collection interfaces, if TorchRec is already imported (a module using them has imported it)."""
    mod = sys.modules.get("torchrec.modules.embedding_modules")
    if mod is None:
        return ()
    return (mod.EmbeddingBagCollectionInterface, mod.EmbeddingCollectionInterface)


def _torchrec_tables(where: str, collection: Any) -> list[Table]:
    from torch import nn

    if hasattr(collection, "embedding_bag_configs"):
        configs, pooled = collection.embedding_bag_configs(), True
        weighted = bool(collection.is_weighted())
    else:
        configs, pooled, weighted = collection.embedding_configs(), False, False
    params = [m.weight for m in collection.modules() if isinstance(m, nn.EmbeddingBag | nn.Embedding)]
    out: list[Table] = []
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
        # the collection's weights go with its first table; account checks the configs add up to them
        out.append(Table(fields, features, params if i == 0 else []))
    return out
