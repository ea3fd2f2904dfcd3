""":func:`describe`: a module on the meta device → its :class:`~shardwise.wire.spec.ModelSpec` (the package docstring
says what becomes what), and the per-table and per-layer options it takes."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shardwise.runtime.describe.batch import Sequences, batch_statistics, example_sequences, features
from shardwise.runtime.describe.flops import measure_alone, measure_forward
from shardwise.runtime.describe.walk import Layer, Table, account, tie, tied_warning, walk
from shardwise.wire.spec import DenseLayerSpec, DenseStyle, EmbeddingTableSpec, ModelSpec, Optimizer

if TYPE_CHECKING:
    from torch import nn

__all__ = ["describe"]

T = TypeVar("T")


def describe(
    module: nn.Module,
    *,
    batch_size_per_gpu: int,
    name: str | None = None,
    pooling_factors: float | Mapping[str, float] | None = None,
    pooling_factors_p99: float | Mapping[str, float] | None = None,
    access_skew: float | Mapping[str, float] | None = None,
    optimizer: str | Mapping[str, str] = "rowwise_adagrad",
    dense_optimizer: str = "adam",
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    example_inputs: Any = None,
    example_batch_size: int | None = None,
    sample_batch: Any = None,
    dense_styles: Mapping[str, str] | None = None,
    extra_layers: Sequence[DenseLayerSpec] = (),
) -> ModelSpec:
    """The :class:`ModelSpec` of ``module`` (:mod:`shardwise.runtime.describe` says what becomes a table or a layer).

    - ``name``: the model's name; the module's class name by default.
    - ``pooling_factors``: mean ids per sample per feature, for every table or per table name (default: measured
      from ``sample_batch``, else, for a sequence table, from ``example_inputs``, else 1).
    - ``pooling_factors_p99``: the 99th percentile of ids per sample per feature, for every table or per table name
      (default: a sequence table's, measured as its pooling factor is; else unset).
    - ``access_skew``: Zipf exponent of row accesses, for every table or per table name (default: measured from
      ``sample_batch``, else uniform).
    - ``optimizer``: the tables' optimizer (sgd, adagrad, rowwise_adagrad, adam), or per table name.
    - ``dense_optimizer``: the dense layers' optimizer.
    - ``input_shapes``: per layer FQN, the shape of one sample's input without the batch dimension (an
      ``nn.Linear``'s default is ``(in_features,)``), e.g. ``(seq_len, in_features)`` for a layer applied to every
      token; its FLOPs per sample are counted on that shape (an ``nn.MultiheadAttention``'s is ``(seq_len,
      embed_dim)``, attended to itself). Not with ``example_inputs``.
    - ``example_inputs``: the arguments of ``module.forward`` (a tuple, or one argument) for one batch, on any device;
      they are copied to meta and the forward is run there once to count every layer's FLOPs and activations, and
      the ids each sequence table looks up (the package docstring, "Sequence tables").
    - ``example_batch_size``: the samples in ``example_inputs`` (default: the first tensor's leading dimension, or a
      ``KeyedJaggedTensor``'s stride).
    - ``sample_batch``: a real batch of sparse features (``KeyedJaggedTensor`` or feature → ``(ids, offsets)``) to
      measure pooling factors, access skews and sequence tables' tails from (the package docstring).
    - ``dense_styles``: per dense-layer name, a style to pin (replicate, fsdp; colwise or rowwise for a linear one).
    - ``extra_layers``: dense layers described by hand (attention over jagged lengths:
      :func:`~shardwise.runtime.describe.attention.hstu_attention`). One named as a parameterless layer of the
      description (FLOPs the example forward spent outside every layer, under the name of the module that spent them)
      replaces it; one of a new name is added, after the described layers. Naming a layer that holds parameters is an
      error (its parameters would go uncounted).

    Raises ``ValueError`` for a module shardwise cannot describe (an EmbeddingBag in mode ``max``, a weight dtype
    with no wire equivalent, parameters left out or shared other than a table's weight with an ``nn.Linear``, a
    layer whose FLOPs cannot be counted), a mapping key that names no table or layer, a sample batch that does not
    fit the tables, or a model with nothing to plan; the message names the module. Warns (``UserWarning``) of a table
    whose weight a layer also multiplies by (the package docstring, "Tied weights"), and of a sequence table whose
    padding it could not leave out of the count.
    """
    import torch  # noqa: F401  (the torch extra: fail here, not halfway through)

    if example_inputs is not None and input_shapes:
        raise ValueError("pass example_inputs or input_shapes, not both: the example's forward gives every shape")
    tables: list[Table] = []
    layers: list[Layer] = []
    walk(module, "", tables, layers, inside_collection=False)
    notes = tie(tables, layers)
    account(module, tables, layers)

    dense_opt = Optimizer(dense_optimizer)
    seen = Sequences()
    if example_inputs is not None:
        forward = measure_forward(module, layers, tables, example_inputs, example_batch_size)
        seen = example_sequences(tables, forward)
        tied = {layer.tied for layer in layers}
        notes += [
            tied_warning(table, f"the forward reads its weight outside a lookup ({', '.join(sorted(ops))})")
            for table, ops in sorted(forward.weight_reads.items())
            if table not in tied
        ]
    else:
        measure_alone(layers, batch_size_per_gpu, dict(input_shapes or {}))

    names = [t.fields["name"] for t in tables]
    measured_pf: dict[str, float] = {}
    measured_skew: dict[str, float | None] = {}
    measured_tail: dict[str, float] = {}
    if sample_batch is not None:
        measured_pf, measured_skew, measured_tail = batch_statistics(tables, features(sample_batch))
    if isinstance(pooling_factors, Mapping):
        given = set(pooling_factors)
    else:
        given = set(names) if pooling_factors is not None else set()
    notes += [note for table, note in seen.notes.items() if table not in given | set(measured_pf)]
    factors = _per_table(pooling_factors, names, "pooling_factors", seen.factors | measured_pf, 1.0)
    tails = _per_table(pooling_factors_p99, names, "pooling_factors_p99", seen.tails | measured_tail, None)
    skews = _per_table(access_skew, names, "access_skew", measured_skew, None)
    optimizers = _per_table(optimizer, names, "optimizer", {}, Optimizer.rowwise_adagrad.value)
    styles = dict(dense_styles or {})
    unknown = sorted(set(styles) - {layer.name for layer in layers})
    if unknown:
        raise ValueError(f"dense_styles names no dense layer of the module: {', '.join(unknown)}")
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    specs = []
    for t in tables:
        n = t.fields["name"]
        fields = t.fields | ({"num_features": seen.uses[n]} if n in seen.uses else {})  # an nn.Embedding's calls
        specs.append(
            EmbeddingTableSpec(
                **fields,
                pooling_factor=factors[n],
                pooling_factor_p99=tails[n],
                access_skew=skews[n],
                optimizer=Optimizer(optimizers[n]),
            )
        )
    return ModelSpec(
        name=name or type(module).__name__,
        batch_size_per_gpu=batch_size_per_gpu,
        embedding_tables=specs,
        dense_layers=_with_extra(
            [_layer_spec(layer, dense_opt, styles.get(layer.name)) for layer in layers], extra_layers
        ),
    )


def _with_extra(described: list[DenseLayerSpec], extra: Sequence[DenseLayerSpec]) -> list[DenseLayerSpec]:
    """``described`` with each of ``extra`` in place of the parameterless layer of its name, or added after them."""
    names = [layer.name for layer in extra]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"extra_layers names a layer twice: {', '.join(twice)}")
    out = list(described)
    at = {layer.name: i for i, layer in enumerate(described)}
    for layer in extra:
        i = at.get(layer.name)
        if i is None:
            at[layer.name] = len(out)
            out.append(layer)
        elif out[i].num_params:
            raise ValueError(
                f"extra_layers: {layer.name} is a described layer holding {out[i].num_params:,} parameters, which "
                "the replacement would leave uncounted: name a parameterless layer (FLOPs spent outside every layer) "
                "or a new one"
            )
        else:
            out[i] = layer
    return out


def _layer_spec(layer: Layer, optimizer: Optimizer, style: str | None) -> DenseLayerSpec:
    assert layer.dtype is not None  # account
    pinned = DenseStyle(style) if style is not None else None
    if layer.loose:
        if pinned not in (None, DenseStyle.replicate):
            raise ValueError(
                f"{layer.name}: a parameter its module holds beside embedding tables runs replicate (apply_plan "
                "all-reduces its gradient); to shard it, move it into a submodule"
            )
        pinned = DenseStyle.replicate
    if layer.tied is not None:  # a head on a table's weight: its bias alone, and the GEMM it runs
        from torch import nn

        head = layer.module
        assert isinstance(head, nn.Linear)  # tie() ties linear layers alone
        return DenseLayerSpec(
            name=layer.name,
            kind="unclassified",
            param_count=sum(p.numel() for p in layer.params),
            activation_bytes_per_sample=layer.activation_bytes
            or (head.in_features + head.out_features) * layer.dtype.nbytes,
            dtype=layer.dtype,
            optimizer=optimizer,
            flops_per_sample=layer.flops if layer.flops is not None else 2 * head.in_features * head.out_features,
            style=pinned,
        )
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
