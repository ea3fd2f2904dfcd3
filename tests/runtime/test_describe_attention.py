"""Attention over jagged lengths by the stated formula (``hstu_attention``): the FLOPs a per-sample forward runs, as
PyTorch's ``FlopCounterMode`` counts them, and the layer in describe()'s spec, priced by the planner."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402  (after the importorskip)
from torch.nn import functional as F  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from shardwise.runtime.describe import describe, hstu_attention  # noqa: E402
from shardwise.solver.planner import make_plan, score_plan  # noqa: E402
from shardwise.wire.spec import DenseLayerSpec, Dtype, FleetSpec, ModelSpec, SolveParams  # noqa: E402

LENGTHS = [1, 7, 50, 128, 3, 200]


def sample_flops(length: int, dim: int, heads: int, value_dim: int, *, causal: bool) -> int:
    """FlopCounterMode's count of one sample's attention on real CPU tensors: scores, pointwise SiLU, the mask as a
    multiplication by the lower triangle (the full square is multiplied), the product with the values."""
    g = torch.Generator().manual_seed(length)
    q, k = (torch.randn(heads, length, dim, generator=g) for _ in range(2))
    v = torch.randn(heads, length, value_dim, generator=g)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        scores = F.silu(q @ k.transpose(1, 2)) / length
        if causal:
            scores = scores * torch.ones(length, length).tril()
        scores @ v
    return int(counter.get_total_flops())


@pytest.mark.parametrize(("dim", "heads", "value_dim"), [(16, 1, None), (8, 4, 24)])
def test_the_formula_is_flopcounters_count_of_a_jagged_forward(dim: int, heads: int, value_dim: int | None) -> None:
    dv = value_dim or dim
    counted = [sample_flops(n, dim, heads, dv, causal=False) for n in LENGTHS]
    layer = hstu_attention("attn", LENGTHS, dim, heads=heads, value_dim=value_dim, causal=False)
    assert layer.flops_per_sample == pytest.approx(sum(counted) / len(LENGTHS), rel=0.05)
    assert layer.flops_per_sample == pytest.approx(sum(counted) / len(LENGTHS), abs=1)  # in fact exactly
    # the mean of L², not the square of the mean length: a padded count at the mean length is far below it
    mean = sum(LENGTHS) / len(LENGTHS)
    assert layer.flops_per_sample > 1.5 * 2 * heads * (dim + dv) * mean * mean


def test_causal_counts_the_lower_triangle_of_what_a_masked_forward_multiplies() -> None:
    """A masked forward multiplies the full square (FlopCounterMode counts it so); the causal formula counts
    ``(L+1)/(2L)`` of it, sample by sample."""
    dim, heads = 16, 2
    masked = [sample_flops(n, dim, heads, dim, causal=True) for n in LENGTHS]
    assert masked == [sample_flops(n, dim, heads, dim, causal=False) for n in LENGTHS]
    triangle = sum(c * (n + 1) / (2 * n) for c, n in zip(masked, LENGTHS, strict=True)) / len(LENGTHS)
    layer = hstu_attention("attn", LENGTHS, dim, heads=heads)
    assert layer.flops_per_sample == pytest.approx(triangle, rel=0.05)
    assert layer.flops_per_sample == pytest.approx(triangle, abs=1)


def test_the_layer_is_parameterless_and_holds_its_inputs_and_output() -> None:
    layer = hstu_attention("attn", [10, 30], 16, heads=2, value_dim=8, dtype="fp16")
    assert (layer.kind, layer.param_count, layer.num_params, layer.dtype) == ("unclassified", 0, 0, Dtype.fp16)
    assert layer.activation_bytes_per_sample == 2 * (2 * 16 + 2 * 8) * 20 * 2  # Q, K, V, A·V at the mean length
    for bad in ([], [-1, 3]):
        with pytest.raises(ValueError, match="attn"):
            hstu_attention("attn", bad, 16)


# ------------------------------------------------------------------------------------------------ describe()

SEQ, DIM, ROWS, BATCH = 64, 32, 10_000, 4


class PaddedBlock(nn.Module):
    """Pointwise attention over padded sequences: no parameters, so its FLOPs are a layer named ``block``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        scores = F.silu(x @ x.transpose(1, 2)) / length * torch.ones(length, length, device=x.device).tril()
        out: torch.Tensor = scores @ x
        return out


class SequenceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.items = nn.Embedding(ROWS, DIM)
        self.block = PaddedBlock()
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.block(self.items(ids))[:, -1])
        return out


def spec_of(extra: list[DenseLayerSpec] | None = None, batch: int = 1024) -> ModelSpec:
    with torch.device("meta"):
        model = SequenceModel()
    ids = torch.randint(0, ROWS, (BATCH, SEQ))
    return describe(model, batch_size_per_gpu=batch, example_inputs=(ids,), extra_layers=extra or [])


def test_extra_layers_replace_the_padded_count_and_add_new_ones() -> None:
    padded = {d.name: d for d in spec_of().dense_layers}
    assert padded["block"].flops_per_sample == 2 * 2 * SEQ * SEQ * DIM  # the forward's, every padded pair
    jagged = hstu_attention("block", [5, 20, 64, 11], DIM)
    extra = hstu_attention("more", [8], DIM)
    spec = spec_of([jagged, extra])
    assert [d.name for d in spec.dense_layers] == [d.name for d in padded.values()] + ["more"]
    assert {d.name: d for d in spec.dense_layers}["block"] == jagged
    assert jagged.flops_per_sample is not None
    assert jagged.flops_per_sample < padded["block"].flops_per_sample


def test_extra_layers_keep_every_parameter_counted() -> None:
    with pytest.raises(ValueError, match="head is a described layer holding 33 parameters"):
        spec_of([hstu_attention("head", [4], DIM)])
    with pytest.raises(ValueError, match="twice: more"):
        spec_of([hstu_attention("more", [4], DIM), hstu_attention("more", [8], DIM)])


def test_the_planner_prices_the_attention_by_its_lengths() -> None:
    """One plan scored with the attention of short and of long histories: each rank's compute, and the step, grow
    with the longer sequences."""
    fleet = FleetSpec.model_validate(
        {"name": "h100-1x2", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}]}
    )
    short = spec_of([hstu_attention("block", [32, 64, 16], DIM, heads=4)], batch=8192)
    long = spec_of([hstu_attention("block", [1024, 2048, 512], DIM, heads=4)], batch=8192)
    plan = make_plan(short, fleet, SolveParams(solver="greedy", sparse_2d=False))
    problems, longer = score_plan(long, fleet, plan)
    assert problems == []
    for a, b in zip(plan.ranks, longer.ranks, strict=True):
        assert b.predicted_ms.compute > a.predicted_ms.compute + 1
        assert b.predicted_ms.total > b.predicted_ms.host  # the device paces the step
    assert longer.predicted_step_ms > plan.predicted_step_ms + 1
