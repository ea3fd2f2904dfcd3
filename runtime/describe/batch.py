"""Statistics from a real batch of sparse features: each table's pooling factor, the Zipf exponent of its row
accesses and a sequence table's tail (the package docstring, "Statistics from a real batch"); and the sequence
tables' ids per sample in an example forward."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardwise.runtime.describe.flops import Forward, is_kjt
from shardwise.runtime.describe.walk import Table
from shardwise.wire.spec import Pooling

if TYPE_CHECKING:
    import torch

#: below this measured Zipf exponent a table's accesses are reported uniform (``access_skew`` None)
UNIFORM_BELOW = 0.05


def features(sample_batch: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Feature → (ids, offsets with the end) of a KeyedJaggedTensor or a mapping; checked.

    A mapping's offsets may hold the bags' starts alone (``nn.EmbeddingBag``'s convention: one per bag, the first 0)
    or the starts and the end (TorchRec's, ``include_last_offset``: one more, the last the number of ids): offsets
    that end before the last id are starts, and the end is added."""
    import torch

    if is_kjt(sample_batch):
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
        n = ids.numel()
        rising = offsets.numel() > 0 and int(offsets[0]) == 0 and not bool((offsets[1:] < offsets[:-1]).any())
        if not rising or int(offsets[-1]) > n:
            raise ValueError(
                f"sample_batch[{k!r}]: offsets must rise from 0 and stay within the number of ids ({n}): the bags' "
                "starts (nn.EmbeddingBag's offsets), or the starts and the end"
            )
        if int(offsets[-1]) < n or offsets.numel() == 1:  # the starts alone: add the end
            out[k] = (ids, torch.cat([offsets, offsets.new_full((1,), n)]))
    return out


def batch_statistics(
    tables: Sequence[Table], features: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
) -> tuple[dict[str, float], dict[str, float | None], dict[str, float]]:
    """Per table: pooling factor (ids per sample per feature) and Zipf exponent, from the features feeding it; and
    per sequence table (pooling ``none``), the 99th percentile of its sequences' lengths (:func:`tail`)."""
    import torch

    wanted = {f for t in tables for f in t.features}
    unknown = sorted(set(features) - wanted)
    if unknown:
        raise ValueError(f"sample_batch has features no table reads: {', '.join(unknown)}")
    factors: dict[str, float] = {}
    skews: dict[str, float | None] = {}
    tails: dict[str, float] = {}
    for t in tables:
        name = t.fields["name"]
        missing = [f for f in t.features if f not in features]
        if missing:
            raise ValueError(f"table {name}: sample_batch lacks its feature(s) {', '.join(missing)}")
        ids = torch.cat([features[f][0].reshape(-1).long() for f in t.features])
        lengths = torch.cat([features[f][1].long().diff() for f in t.features])
        if ids.numel() == 0:
            raise ValueError(
                f"table {name}: no ids in the sample batch; pass its pooling factor, or a batch where it is used"
            )
        rows = t.fields["num_embeddings"]
        if bool((ids < 0).any()) or bool((ids >= rows).any()):
            raise ValueError(f"table {name}: sample_batch has ids outside 0..{rows - 1}")
        factors[name] = ids.numel() / lengths.numel()
        if t.fields["pooling"] is Pooling.none:
            tails[name] = tail(lengths)
        s = zipf_exponent(ids)
        skews[name] = None if s is None or s < UNIFORM_BELOW else min(s, 5.0)
    return factors, skews, tails


@dataclass
class Sequences:
    """What an example forward says of the sequence tables (pooling ``none``): per table, the mean ids per sample
    per feature, their 99th percentile where the lengths of single samples are known, the features (calls of an
    ``nn.Embedding``), and a note where the count could not leave out padding."""

    factors: dict[str, float] = field(default_factory=dict)
    tails: dict[str, float] = field(default_factory=dict)
    uses: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def example_sequences(tables: Sequence[Table], forward: Forward) -> Sequences:
    """The sequence tables' ids per sample in an example forward.

    An ``nn.Embedding`` is fed ids of any shape; each call is one feature (one table serving a user's history and
    the candidates is called twice: two features). The ids a call looks up are its ids less those equal to its
    ``padding_idx`` — counted on the real ids where the call received an example input unchanged, else every
    position (a note says so when a ``padding_idx`` is set). A sample's ids are those along the first dimension of
    the batch's size; 1-D ids are the batch's ids end to end (jagged values), whose lengths per sample are unknown,
    so the table gets its mean and no tail. A TorchRec ``EmbeddingCollection``'s table is measured on the example's
    ``KeyedJaggedTensor`` holding its features, as a ``sample_batch`` is."""
    import torch

    out = Sequences()
    batch = forward.batch
    for t in tables:
        name = t.fields["name"]
        if t.fields["pooling"] is not Pooling.none:
            continue
        if t.embedding is None:
            kjt = next((k for k in forward.kjts if set(t.features) <= set(k.keys())), None)
            if kjt is None:
                continue
            feats = features(kjt)
            ids = sum(feats[f][0].numel() for f in t.features)
            lengths = torch.cat([feats[f][1].long().diff() for f in t.features])
            if ids:
                out.factors[name], out.tails[name] = ids / lengths.numel(), tail(lengths)
            continue
        calls = forward.lookups.get(name, [])
        pad = t.embedding.padding_idx
        total, guessed = 0, False
        per_sample: list[torch.Tensor] | None = []
        for shape, real in calls:
            counted = (real != pad) if real is not None and pad is not None else None
            guessed |= real is None and pad is not None
            total += int(counted.sum()) if counted is not None else math.prod(shape)
            at = shape.index(batch) if len(shape) >= 2 and batch in shape else None
            if at is None:
                per_sample = None
            elif per_sample is not None:
                if counted is None:
                    per_sample.append(torch.full((batch,), math.prod(shape) // batch))
                else:
                    per_sample.append(counted.movedim(at, 0).reshape(batch, -1).sum(1))
        if not calls or total == 0:
            continue
        out.uses[name] = len(calls)
        out.factors[name] = total / (batch * len(calls))
        if per_sample is not None:
            out.tails[name] = tail(torch.cat(per_sample))
        if guessed:
            out.notes[name] = (
                f"table {name}: the example's ids reached it computed in the forward, so every position was counted, "
                f"padding (padding_idx {pad}) too; pass sample_batch or pooling_factors for the ids it looks up"
            )
    return out


def tail(lengths: torch.Tensor) -> float:
    """The 99th percentile of ``lengths`` (a sequence's ids), nearest rank: the least length that 99 % of them do
    not exceed. A step waits for its longest sequences; the mean alone hides them."""
    ordered = lengths.reshape(-1).sort().values
    return float(ordered[max(math.ceil(0.99 * ordered.numel()) - 1, 0)])


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
