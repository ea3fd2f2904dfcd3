"""describe() on real models: every parameter accounted for, FLOPs as the real forward counts them, statistics from a
real batch. TorchRec's own DLRM and DLRM_DCN with the 26 MLPerf tables (examples/dlrm_dcnv2.json) on meta, a model
with a raw nn.Parameter layer, and nn.TransformerEncoderLayer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402  (after the importorskip)
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from shardwise.runtime.describe import describe, zipf_exponent  # noqa: E402
from shardwise.runtime.plan_check import check_plan  # noqa: E402
from shardwise.wire.spec import DenseStyle, FleetSpec, ModelSpec, SolveParams  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def params_and_bytes(module: nn.Module) -> tuple[int, int]:
    ps = list(module.parameters())
    return sum(p.numel() for p in ps), sum(p.numel() * p.element_size() for p in ps)


def described(spec: ModelSpec) -> tuple[int, int]:
    count = sum(t.num_embeddings * t.embedding_dim for t in spec.embedding_tables)
    count += sum(d.num_params for d in spec.dense_layers)
    nbytes = sum(t.weight_bytes for t in spec.embedding_tables)
    nbytes += sum(d.num_params * d.dtype.nbytes for d in spec.dense_layers)
    return count, nbytes


def described_flops(spec: ModelSpec) -> int:
    return sum(d.forward_flops_per_sample for d in spec.dense_layers)


def real_flops_per_sample(module: nn.Module, args: tuple[Any, ...], batch: int) -> float:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(*args)
    return counter.get_total_flops() / batch


# --------------------------------------------------------------------------------------------------- TorchRec


def mlperf_rows() -> list[int]:
    spec = json.loads((EXAMPLES / "dlrm_dcnv2.json").read_text())
    return [t["num_embeddings"] for t in spec["embedding_tables"]]


def torchrec_dlrm(kind: str, rows: list[int], device: str) -> nn.Module:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM, DLRM_DCN

    tables = [
        EmbeddingBagConfig(name=f"t_cat_{i}", embedding_dim=128, num_embeddings=r, feature_names=[f"cat_{i}"])
        for i, r in enumerate(rows)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device(device))
    common: dict[str, Any] = {
        "embedding_bag_collection": ebc,
        "dense_in_features": 13,
        "dense_arch_layer_sizes": [512, 256, 128],
        "over_arch_layer_sizes": [1024, 1024, 512, 256, 1],
        "dense_device": torch.device(device),
    }
    if kind == "dcn":
        return DLRM_DCN(dcn_num_layers=3, dcn_low_rank_dim=512, **common)
    return DLRM(**common)


def criteo_batch(batch: int, rows: list[int], seed: int = 0) -> Any:
    from torchrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(rows), batch), generator=g)
    values = torch.cat(
        [torch.randint(0, min(r, 100), (int(n),), generator=g) for r, n in zip(rows, lengths.sum(1), strict=True)]
    )
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"cat_{i}" for i in range(len(rows))], values=values, lengths=lengths.reshape(-1)
    )


@pytest.mark.torchrec
@pytest.mark.parametrize("kind", ["plain", "dcn"])
def test_torchrec_dlrm_is_described_whole(kind: str) -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    rows = mlperf_rows()
    model = torchrec_dlrm(kind, rows, "meta")
    B = 8
    dense, kjt = torch.randn(B, 13), criteo_batch(B, rows)
    spec = describe(model, batch_size_per_gpu=8192, example_inputs=(dense, kjt), sample_batch=kjt)

    # every parameter, count and bytes: 26 tables of 128 columns plus the dense arch, over arch (and cross network)
    assert described(spec) == params_and_bytes(model)
    assert len(spec.embedding_tables) == 26
    # FLOPs: the real forward of the same architecture (small tables: a lookup spends no FLOPs) on real tensors
    small = torchrec_dlrm(kind, [100] * 26, "cpu")
    real = real_flops_per_sample(small, (dense, kjt), B)
    assert described_flops(spec) == pytest.approx(real, rel=0.05)
    layers = {d.name: d for d in spec.dense_layers}
    if kind == "dcn":
        cross = layers["inter_arch.crossnet"]  # three low-rank layers of nn.ParameterList: 3·(2·3456·512 + 3456)
        assert (cross.kind, cross.num_params) == ("unclassified", 3 * (2 * 3456 * 512 + 3456))
        assert cross.forward_flops_per_sample == 3 * 2 * (2 * 3456 * 512)
        assert cross.styles == (DenseStyle.replicate, DenseStyle.fsdp)
        dense_params = sum(d.num_params for d in spec.dense_layers)
        assert cross.num_params / dense_params > 0.6  # the share describe() used to drop
    else:  # the pairwise interaction: a bmm in a parameterless module, a layer of its own
        inter = layers["inter_arch"]
        assert (inter.kind, inter.num_params) == ("unclassified", 0)
        assert inter.forward_flops_per_sample == 2 * 27 * 27 * 128
    # pooling factors from the batch: ids per sample of each feature
    lengths = kjt.lengths().reshape(26, B).sum(1)
    assert [t.pooling_factor for t in spec.embedding_tables] == [int(n) / B for n in lengths]


@pytest.mark.torchrec
def test_dlrm_dcn_without_an_example_names_the_cross_network() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    model = torchrec_dlrm("dcn", mlperf_rows(), "meta")
    with pytest.raises(ValueError, match=r"cannot count the FLOPs of inter_arch\.crossnet \(LowRankCrossNet, "):
        describe(model, batch_size_per_gpu=8192)
    # its input shape is enough
    spec = describe(model, batch_size_per_gpu=8192, input_shapes={"inter_arch.crossnet": (27 * 128,)})
    assert described(spec) == params_and_bytes(model)
    assert spec.dense_layers[3].name == "inter_arch.crossnet"
    assert spec.dense_layers[3].forward_flops_per_sample == 3 * 2 * (2 * 3456 * 512)


@pytest.mark.torchrec
def test_the_planner_prices_and_places_the_cross_network() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    pytest.importorskip("ortools")
    from shardwise.solver.planner import make_plan
    from shardwise.solver.topology import Topology
    from shardwise.solver.validate import check_plan as solver_check

    rows = mlperf_rows()
    model = torchrec_dlrm("dcn", rows, "meta")
    spec = describe(model, batch_size_per_gpu=8192, example_inputs=(torch.randn(4, 13), criteo_batch(4, rows)))
    without = spec.model_copy(update={"dense_layers": [d for d in spec.dense_layers if d.kind == "linear"]})
    fleet = FleetSpec(name="h100x8", hosts=[{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 8}])
    params = SolveParams(solver="greedy")
    plan, plan_without = make_plan(spec, fleet, params), make_plan(without, fleet, params)
    assert solver_check(Topology(fleet), spec, plan) == []
    styles = {d.name: d.style for d in plan.dense}
    assert styles["inter_arch.crossnet"] in (DenseStyle.replicate, DenseStyle.fsdp)
    assert plan.predicted_step_ms is not None
    assert plan_without.predicted_step_ms is not None
    assert plan.predicted_step_ms > plan_without.predicted_step_ms  # its compute and memory are charged
    dense_bytes = sum(r.hbm_breakdown.dense for r in plan.ranks)
    assert dense_bytes > sum(r.hbm_breakdown.dense for r in plan_without.ranks)


@pytest.mark.torchrec
def test_weighted_collections_and_shared_features() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    configs = [
        EmbeddingBagConfig(name="t_a", num_embeddings=1000, embedding_dim=16, feature_names=["f", "g"]),
        EmbeddingBagConfig(name="t_b", num_embeddings=500, embedding_dim=8, feature_names=["f"]),  # f is shared
    ]
    model = nn.ModuleDict({"ebc": EmbeddingBagCollection(tables=configs, is_weighted=True, device="meta")})
    # batch of 2: f has bags [3, 1] ids, g has [0, 2]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f", "g"],
        values=torch.tensor([1, 2, 3, 4, 5, 6]),
        lengths=torch.tensor([3, 1, 0, 2]),
        weights=torch.ones(6),
    )
    spec = describe(model, batch_size_per_gpu=64, sample_batch=kjt)
    a, b = spec.embedding_tables
    assert (a.num_features, a.weighted, a.pooling_factor) == (2, True, 6 / 4)  # f and g: 6 ids over 2·2 bags
    assert (b.num_features, b.weighted, b.pooling_factor) == (1, True, 4 / 2)  # f alone: 4 ids over 2 bags
    assert described(spec) == params_and_bytes(model)
    unweighted = nn.ModuleDict({"ebc": EmbeddingBagCollection(tables=configs, device="meta")})
    assert {t.weighted for t in describe(unweighted, batch_size_per_gpu=64).embedding_tables} == {False}


# --------------------------------------------------------------------------------------------------- plain torch


class Gate(nn.Module):
    """A layer made of raw parameters: x · W ⊙ g + b."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim)
        self.g = nn.Parameter(torch.ones(dim))
        self.b = nn.ParameterDict({"bias": nn.Parameter(torch.zeros(dim))})

    def forward(self, x: Any) -> Any:
        return (x @ self.w) * self.g + self.b["bias"]


class Scorer(nn.Module):
    """Tables, a raw-parameter layer, a pairwise product outside every layer, and an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.user = nn.EmbeddingBag(10_000, 32, mode="sum")
        self.item = nn.EmbeddingBag(5_000, 32, mode="mean")
        self.gate = Gate(32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Sequential(nn.Linear(32 * 3, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: Any, users: Any, user_offsets: Any, items: Any, item_offsets: Any) -> Any:
        u, i = self.user(users, user_offsets), self.item(items, item_offsets)
        d = self.norm(self.gate(dense))
        pair = torch.bmm(u.unsqueeze(2), i.unsqueeze(1)).sum(2)  # FLOPs that belong to no layer
        return self.head(torch.cat([d, pair, u], dim=1))


def scorer_inputs(batch: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(1)
    users, items = torch.randint(0, 10_000, (3 * batch,), generator=g), torch.randint(0, 5_000, (batch,), generator=g)
    return torch.randn(batch, 32), users, torch.arange(batch) * 3, items, torch.arange(batch)


def test_a_custom_parameter_layer_is_described_with_its_flops() -> None:
    with torch.device("meta"):
        model = Scorer()
    B = 16
    args = scorer_inputs(B)
    spec = describe(model, batch_size_per_gpu=256, example_inputs=args)
    assert described(spec) == params_and_bytes(model)
    real = Scorer()
    assert described_flops(spec) == pytest.approx(real_flops_per_sample(real, args, B), rel=0.05)
    layers = {d.name: d for d in spec.dense_layers}
    assert list(layers) == ["gate", "norm", "head.0", "head.2", "Scorer"]
    gate = layers["gate"]
    assert (gate.kind, gate.num_params, gate.forward_flops_per_sample) == ("unclassified", 32 * 32 + 64, 2 * 32 * 32)
    assert gate.activation_bytes_per_sample == 2 * 32 * 4  # one row in, one out
    root = layers["Scorer"]  # the bmm in Scorer.forward itself
    assert (root.num_params, root.forward_flops_per_sample) == (0, 2 * 32 * 32)


def test_without_an_example_a_raw_parameter_layer_needs_its_input_shape() -> None:
    with torch.device("meta"):
        model = Scorer()
    with pytest.raises(ValueError, match=r"cannot count the FLOPs of gate \(Gate, 1,088 parameters\)"):
        describe(model, batch_size_per_gpu=256)
    spec = describe(model, batch_size_per_gpu=256, input_shapes={"gate": (32,)})
    assert described(spec) == params_and_bytes(model)
    norm = next(d for d in spec.dense_layers if d.name == "norm")  # a norm's input shape is its own
    assert (norm.num_params, norm.activation_bytes_per_sample) == (64, 2 * 32 * 4)
    with pytest.raises(ValueError, match="example_inputs or input_shapes, not both"):
        describe(model, batch_size_per_gpu=8, input_shapes={"gate": (32,)}, example_inputs=scorer_inputs(2))


def test_transformer_encoder_block() -> None:
    with torch.device("meta"):
        block = nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
    x = torch.randn(4, 64, 256)  # 4 sequences of 64 tokens
    spec = describe(block, batch_size_per_gpu=32, example_inputs=(x,))
    assert described(spec) == params_and_bytes(block)
    real = nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
    assert described_flops(spec) == pytest.approx(real_flops_per_sample(real, (x,), 4), rel=0.05)
    layers = {d.name: d for d in spec.dense_layers}
    assert list(layers) == ["self_attn", "linear1", "linear2", "norm1", "norm2"]  # out_proj inside self_attn
    assert layers["self_attn"].kind == "unclassified"
    assert layers["linear1"].forward_flops_per_sample == 64 * 2 * 256 * 1024  # on every token
    assert layers["linear1"].activation_bytes_per_sample == 64 * (256 + 1024) * 4
    # seq-first input: the batch is the second dimension
    seq_first = describe(
        nn.TransformerEncoderLayer(d_model=256, nhead=8, device="meta"),
        batch_size_per_gpu=32,
        example_inputs=torch.randn(64, 4, 256),
        example_batch_size=4,
    )
    assert seq_first.dense_layers[1].forward_flops_per_sample == 64 * 2 * 256 * 2048
    with pytest.raises(ValueError, match=r"cannot count the FLOPs of self_attn \(MultiheadAttention"):
        describe(block, batch_size_per_gpu=32)


def test_parameters_beside_tables_are_replicated_one_by_one() -> None:
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8, device="meta"))
            self.bias = nn.ParameterList([nn.Parameter(torch.zeros(8, device="meta"))])
            self.bag = nn.EmbeddingBag(100, 8, device="meta")

    model = nn.ModuleDict({"sparse": nn.Sequential(Holder())})
    spec = describe(model, batch_size_per_gpu=8)
    assert described(spec) == params_and_bytes(model)
    assert [t.name for t in spec.embedding_tables] == ["sparse.0.bag"]
    # a dense layer cannot hold a table: each parameter its own layer, named by the parameter, replicated
    assert [(d.name, d.num_params, d.styles) for d in spec.dense_layers] == [
        ("sparse.0.scale", 8, (DenseStyle.replicate,)),
        ("sparse.0.bias.0", 8, (DenseStyle.replicate,)),
    ]
    with pytest.raises(ValueError, match=r"sparse\.0\.scale: a parameter its module holds beside embedding tables"):
        describe(model, batch_size_per_gpu=8, dense_styles={"sparse.0.scale": "fsdp"})


def test_tied_weights_are_refused() -> None:
    tied = nn.Sequential(nn.Linear(8, 8, device="meta"), nn.Linear(8, 8, device="meta"))
    tied[1].weight = tied[0].weight
    with pytest.raises(ValueError, match=r"dense layer 0 and dense layer 1 share parameters"):
        describe(tied, batch_size_per_gpu=8)


def test_dense_styles_pin_a_style() -> None:
    with torch.device("meta"):
        model = Scorer()
    spec = describe(
        model, batch_size_per_gpu=8, input_shapes={"gate": (32,)}, dense_styles={"gate": "fsdp", "head.0": "colwise"}
    )
    styles = {d.name: d.styles for d in spec.dense_layers}
    assert styles["gate"] == (DenseStyle.fsdp,)
    assert styles["head.0"] == (DenseStyle.colwise,)
    assert styles["norm"] == (DenseStyle.replicate, DenseStyle.fsdp)
    with pytest.raises(ValueError, match="style colwise needs a linear layer"):
        describe(model, batch_size_per_gpu=8, input_shapes={"gate": (32,)}, dense_styles={"gate": "colwise"})
    with pytest.raises(ValueError, match="dense_styles names no dense layer of the module: gat"):
        describe(model, batch_size_per_gpu=8, input_shapes={"gate": (32,)}, dense_styles={"gat": "fsdp"})


class TemperedScorer(Scorer):
    def __init__(self) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(1))  # held by the root, beside the tables

    def forward(self, *args: Any) -> Any:
        return super().forward(*args) / self.temperature


def test_a_plan_of_the_described_model_passes_the_apply_check() -> None:
    pytest.importorskip("ortools")
    from shardwise.solver.planner import make_plan

    spec = describe(TemperedScorer(), batch_size_per_gpu=64, example_inputs=scorer_inputs(8))
    fleet = FleetSpec(name="one", hosts=[{"gpu": "nvidia-h100-sxm", "count": 1, "gpus_per_host": 2}])
    plan = make_plan(spec, fleet, SolveParams(solver="greedy"))
    styles = {d.name: d.style for d in plan.dense}
    assert styles["temperature"] is DenseStyle.replicate
    assert {"gate", "norm", "TemperedScorer"} <= set(styles)
    # the parameterless "TemperedScorer" entry places nothing, "temperature" is replicated as a loose parameter;
    # every other entry names a module holding its parameters
    assert check_plan(TemperedScorer(), plan, world_size=2, model_spec=spec) == []
    sharded = [d.model_copy(update={"style": DenseStyle.fsdp}) if d.name == "temperature" else d for d in plan.dense]
    problems = check_plan(TemperedScorer(), plan.model_copy(update={"dense": sharded}), world_size=2, model_spec=spec)
    assert problems == ["dense layer temperature: a parameter, not a module, runs replicate; the plan says fsdp"]


# --------------------------------------------------------------------------------------------------- a real batch


def zipf_ids(rows: int, s: float, n: int, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    probs = torch.arange(1, rows + 1, dtype=torch.float64) ** -s
    ranks = torch.multinomial(probs / probs.sum(), n, replacement=True, generator=g)
    return (ranks * 7919) % rows  # hot rows scattered over the table


@pytest.mark.parametrize("s", [0.8, 1.05, 1.3])
def test_zipf_exponent_recovers_the_law(s: float) -> None:
    estimate = zipf_exponent(zipf_ids(10_000, s, 200_000, seed=3))
    assert estimate is not None
    assert estimate == pytest.approx(s, abs=0.05)


def test_uniform_accesses_are_not_read_as_skew() -> None:
    g = torch.Generator().manual_seed(4)
    many = zipf_exponent(torch.randint(0, 10_000, (200_000,), generator=g))  # each row seen ~20 times
    assert many is not None
    assert many < 0.05
    assert zipf_exponent(torch.randint(0, 10**9, (50_000,), generator=g)) is None  # no repeats: nothing to tell


def test_sample_batch_offsets_as_embedding_bag_takes_them_or_with_the_end() -> None:
    """``nn.EmbeddingBag``'s offsets (the bags' starts) and TorchRec's (the starts and the end) describe one batch
    alike: the very batch a model trains on is taken."""
    with torch.device("meta"):
        model = Scorer()
    batch, gen = 512, torch.Generator().manual_seed(8)
    lengths = torch.randint(1, 6, (batch,), generator=gen)
    users = torch.randint(0, 10_000, (int(lengths.sum()),), generator=gen)
    starts = torch.cumsum(lengths, 0) - lengths
    items = torch.randint(0, 5_000, (batch,), generator=gen)
    specs = [
        describe(
            model,
            batch_size_per_gpu=batch,
            input_shapes={"gate": (32,)},
            sample_batch={"user": (users, user_offsets), "item": (items, item_offsets)},
        )
        for user_offsets, item_offsets in (
            (starts, torch.arange(batch)),
            (torch.cat([starts, torch.tensor([users.numel()])]), torch.arange(batch + 1)),
        )
    ]
    assert specs[0] == specs[1]
    user, item = specs[0].embedding_tables
    assert user.pooling_factor == pytest.approx(users.numel() / batch)
    assert item.pooling_factor == 1.0


def test_sample_batch_as_a_mapping_of_ids_and_offsets() -> None:
    with torch.device("meta"):
        model = Scorer()
    batch = 4096
    users = zipf_ids(10_000, 1.05, 3 * batch, seed=5)
    items = torch.randint(0, 5_000, (batch,), generator=torch.Generator().manual_seed(6))
    sample = {
        "user": (users, torch.arange(batch + 1) * 3),  # 3 ids per sample
        "item": (items, torch.arange(batch + 1)),
    }
    spec = describe(
        model,
        batch_size_per_gpu=batch,
        input_shapes={"gate": (32,)},
        sample_batch=sample,
        pooling_factors={"item": 2.0},
    )
    user, item = spec.embedding_tables
    assert user.pooling_factor == 3.0
    assert user.access_skew is not None
    assert user.access_skew == pytest.approx(1.05, abs=0.1)
    assert item.pooling_factor == 2.0  # given explicitly: wins over the measured 1.0
    assert item.access_skew is None  # uniform

    def refused(bad: dict[str, Any], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            describe(model, batch_size_per_gpu=8, input_shapes={"gate": (32,)}, sample_batch=bad)

    refused({**sample, "usr": sample["user"]}, "sample_batch has features no table reads: usr")
    refused({"user": sample["user"]}, r"table item: sample_batch lacks its feature\(s\) item")
    refused({**sample, "item": (items + 5_000, sample["item"][1])}, r"table item: sample_batch has ids outside 0..4999")
    offsets = r"sample_batch\['item'\]: offsets must rise from 0 and stay within the number of ids \(4096\)"
    refused({**sample, "item": (items, torch.arange(batch) + 1)}, offsets)  # the first bag not at 0
    refused({**sample, "item": (items, torch.arange(batch + 1).flip(0))}, offsets)  # falling
    refused({**sample, "item": (items, torch.arange(batch + 2))}, offsets)  # past the last id
    refused({**sample, "item": items}, r"sample_batch\['item'\]: expected \(ids, offsets\)")
    refused({**sample, "item": (items[:0], torch.zeros(batch + 1, dtype=torch.long))}, "table item: no ids")
    with pytest.raises(ValueError, match="sample_batch: expected a KeyedJaggedTensor or a mapping"):
        describe(model, batch_size_per_gpu=8, input_shapes={"gate": (32,)}, sample_batch=[users])
