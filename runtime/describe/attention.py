"""Attention over jagged lengths, by a stated formula: a dense layer that counts what attention computes on each
sample's own length, not on the padded length a forward runs it at.

:func:`hstu_attention` returns the parameterless ``unclassified`` :class:`~shardwise.wire.spec.DenseLayerSpec` of
one attention layer; pass it to ``describe(..., extra_layers=[...])`` under the name of the layer the example forward
counted the attention in (it replaces that layer), or under a new name (it is added).
"""

from __future__ import annotations

from collections.abc import Iterable

from shardwise.wire.spec import DenseLayerSpec, Dtype

__all__ = ["attention_pairs", "hstu_attention"]


def attention_pairs(length: int, *, causal: bool) -> int:
    """Query-key pairs one head scores on a sample of ``length`` tokens: ``L²``, or ``L·(L+1)/2`` when causal (each
    token attends to itself and those before it)."""
    return length * (length + 1) // 2 if causal else length * length


def hstu_attention(
    name: str,
    lengths: Iterable[int],
    dim: int,
    *,
    heads: int = 1,
    causal: bool = True,
    value_dim: int | None = None,
    dtype: Dtype | str = Dtype.bf16,
) -> DenseLayerSpec:
    """The dense layer of attention (HSTU's pointwise attention, or softmax attention) over samples of jagged
    ``lengths`` (tokens a sample: history and candidates), ``heads`` heads of ``dim`` query/key columns and
    ``value_dim`` value columns each (default ``dim``), in ``dtype``.

    Counted per sample of length ``L``, with ``P`` the pairs it scores (:func:`attention_pairs`: ``L²``, causal
    ``L·(L+1)/2``), each head:

    * the scores ``Q·Kᵀ``: ``2·P·dim`` FLOPs;
    * the product with the values ``A·V``: ``2·P·value_dim`` FLOPs;

    ``flops_per_sample`` is their sum over the heads, averaged over the samples (so the mean of ``L²``, not the square
    of the mean length), rounded to a whole FLOP. Left out: the pointwise work on the scores (HSTU's SiLU and scaling,
    a softmax, the mask, a relative bias: ``O(L²)`` against the products' ``O(L²·dim)``), the projections that make
    ``Q``, ``K``, ``V`` and use the output (``nn.Linear`` layers of their own), and padding — the point of counting
    this way. A causal count assumes a kernel that skips the masked pairs; a forward that multiplies the full
    square and masks it afterwards computes ``L²`` pairs (pass ``causal=False`` to price that).

    ``activation_bytes_per_sample`` is the layer's inputs and output: ``Q``, ``K``, ``V`` and ``A·V``, ``heads·(2·dim +
    2·value_dim)·L`` values of ``dtype`` averaged over the samples. The ``L × L`` scores are not counted: a fused
    attention kernel does not keep them.

    ``param_count`` is 0. The cost model prices the layer as any unclassified one (``solver/cost_model/dense.py``: a
    roofline over three times its forward FLOPs, forward and backward, and its activations), on the samples' average
    length: the slowest rank's longer sequences are not priced here.
    """
    samples = [int(n) for n in lengths]
    if not samples:
        raise ValueError(f"{name}: no lengths: the attention's FLOPs are averaged over at least one sample")
    if any(n < 0 for n in samples):
        raise ValueError(f"{name}: a length is negative ({min(samples)})")
    if dim <= 0 or heads <= 0 or (value_dim is not None and value_dim <= 0):
        raise ValueError(f"{name}: dim, heads and value_dim must be positive")
    dv = dim if value_dim is None else value_dim
    dt = Dtype(dtype)
    pairs = sum(attention_pairs(n, causal=causal) for n in samples)
    flops = 2 * heads * (dim + dv) * pairs
    activations = heads * 2 * (dim + dv) * sum(samples) * dt.nbytes
    return DenseLayerSpec(
        name=name,
        kind="unclassified",
        param_count=0,
        flops_per_sample=round(flops / len(samples)),
        activation_bytes_per_sample=round(activations / len(samples)),
        dtype=dt,
    )
