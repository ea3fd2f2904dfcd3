"""describe() on real models: every parameter accounted for, FLOPs as the real forward counts them, statistics from a
real batch. TorchRec's own DLRM and DLRM_DCN with the 26 MLPerf tables (examples/dlrm_dcnv2.json) on meta, a model
with a raw nn.Parameter layer, and nn.TransformerEncoderLayer."""

from __future__ import annotations

import json
import warnings
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


# --------------------------------------------------------------------------------------------------- sequence models

ROWS, DIM, SEQ = 2_000_000, 32, 16  # the described (meta) item table; a real one for counting FLOPs has 1,000 rows


class SeqRec(nn.Module):
    """An item table feeding two transformer encoder layers, held by ``nn.TransformerEncoder`` (parameterless: its
    layers sit in an ``nn.ModuleList`` it never calls) or by a ``Sequential``."""

    def __init__(self, container: str, rows: int = ROWS) -> None:
        super().__init__()
        self.items = nn.Embedding(rows, DIM)
        if container == "encoder":
            layer = nn.TransformerEncoderLayer(DIM, 2, 2 * DIM, batch_first=True)
            self.encoder: nn.Module = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        else:
            self.encoder = nn.Sequential(*(nn.TransformerEncoderLayer(DIM, 2, 2 * DIM, batch_first=True) for _ in "ab"))

    def forward(self, ids: Any) -> Any:
        return self.encoder(self.items(ids))


HEADS, QK, V = 2, 16, 16


class HSTUBlock(nn.Module):
    """HSTU's layer over padded histories: one projection to U, V, Q, K; pointwise attention SiLU(QKᵀ)/L under a
    causal mask of the valid positions (no softmax); the output (norm(AV) ⊙ SiLU(U)) projected back, residual."""

    def __init__(self) -> None:
        super().__init__()
        self.uvqk = nn.Linear(DIM, HEADS * (2 * V + 2 * QK))
        self.norm = nn.LayerNorm(HEADS * V)
        self.out = nn.Linear(HEADS * V, DIM)

    def forward(self, x: Any, lengths: Any) -> Any:
        B, L, _ = x.shape
        u, v, q, k = self.uvqk(x).split([HEADS * V, HEADS * V, HEADS * QK, HEADS * QK], dim=-1)
        q, k = (t.view(B, L, HEADS, QK).transpose(1, 2) for t in (q, k))
        v = v.view(B, L, HEADS, V).transpose(1, 2)
        valid = torch.arange(L, device=x.device)[None, :] < lengths[:, None]
        mask = (valid[:, None, :, None] & valid[:, None, None, :]).tril()
        attn = torch.nn.functional.silu(q @ k.transpose(-1, -2)) / L * mask
        o = (attn @ v).transpose(1, 2).reshape(B, L, HEADS * V)
        return x + self.out(self.norm(o) * torch.nn.functional.silu(u))


class HSTU(nn.Module):
    """An item table (id 0 pads a history) and two HSTU blocks."""

    def __init__(self, rows: int = ROWS) -> None:
        super().__init__()
        self.items = nn.Embedding(rows, DIM, padding_idx=0)
        self.blocks = nn.ModuleList([HSTUBlock(), HSTUBlock()])

    def forward(self, ids: Any, lengths: Any) -> Any:
        x = self.items(ids)
        for block in self.blocks:
            x = block(x, lengths)
        return x


def padded_histories(lengths: list[int], width: int) -> tuple[Any, Any]:
    """Histories of ``lengths`` ids (1..999), padded with 0 to ``width``."""
    n = torch.tensor(lengths)
    ids = torch.randint(1, 1000, (len(lengths), width), generator=torch.Generator().manual_seed(2))
    return ids * (torch.arange(width)[None, :] < n[:, None]), n


def sequence_model(kind: str, rows: int) -> tuple[nn.Module, tuple[Any, ...]]:
    if kind == "hstu":
        return HSTU(rows), padded_histories([SEQ, 11, 5, 1], SEQ)
    ids = torch.randint(0, 1000, (4, SEQ), generator=torch.Generator().manual_seed(2))
    return SeqRec(kind, rows), (ids,)


@pytest.mark.parametrize("kind", ["encoder", "sequential", "hstu"])
def test_a_sequence_models_flops_are_its_forwards(kind: str) -> None:
    """Each FLOP is counted once: nn.TransformerEncoder's layers are not counted again in the container."""
    with torch.device("meta"):
        model, _ = sequence_model(kind, ROWS)
    real, args = sequence_model(kind, 1000)
    spec = describe(model, batch_size_per_gpu=64, example_inputs=args)
    assert described(spec) == params_and_bytes(model)
    forward = real_flops_per_sample(real, args, 4)
    assert described_flops(spec) == pytest.approx(forward, rel=0.05)
    layers = {d.name: d for d in spec.dense_layers}
    assert "encoder" not in layers  # the container spends no FLOP of its own
    if kind == "hstu":  # the attention products, outside every layer: one parameterless layer per block
        block = layers["blocks.0"]
        assert (block.num_params, block.forward_flops_per_sample) == (0, 2 * HEADS * SEQ * SEQ * (QK + V))


def test_sequence_tables_ids_per_sample_from_the_example() -> None:
    with torch.device("meta"):
        seqrec, hstu = SeqRec("sequential"), HSTU()
    ids = torch.randint(0, 1000, (4, SEQ))
    (items,) = describe(seqrec, batch_size_per_gpu=64, example_inputs=(ids,)).embedding_tables
    assert (items.pooling.value, items.num_features) == ("none", 1)
    assert (items.pooling_factor, items.pooling_factor_p99) == (SEQ, SEQ)  # every sample looks up SEQ ids
    # padded histories: the padding (padding_idx 0) is not looked up; the tail is the longest
    histories = padded_histories([SEQ, 11, 5, 1], SEQ)
    (items,) = describe(hstu, batch_size_per_gpu=64, example_inputs=histories).embedding_tables
    assert (items.pooling_factor, items.pooling_factor_p99) == ((SEQ + 11 + 5 + 1) / 4, SEQ)
    # given values win
    (items,) = describe(
        hstu, batch_size_per_gpu=64, example_inputs=histories, pooling_factors=8.0, pooling_factors_p99=12.0
    ).embedding_tables
    assert (items.pooling_factor, items.pooling_factor_p99) == (8.0, 12.0)


def test_ids_computed_in_the_forward_are_counted_whole_and_said_so() -> None:
    class Shifted(HSTU):
        def forward(self, ids: Any, lengths: Any) -> Any:
            return super().forward(ids * 1, lengths)  # not the example's tensor: its values are not known on meta

    with torch.device("meta"):
        model = Shifted()
    histories = padded_histories([SEQ, 11, 5, 1], SEQ)
    with pytest.warns(UserWarning, match=r"table items: .* every position was counted, padding \(padding_idx 0\)"):
        (items,) = describe(model, batch_size_per_gpu=64, example_inputs=histories).embedding_tables
    assert (items.pooling_factor, items.pooling_factor_p99) == (SEQ, SEQ)
    # a sample batch counts the real ids, and no warning
    ids, lengths = histories
    sample = {"items": (ids[ids != 0], torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)]))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (items,) = describe(
            model, batch_size_per_gpu=64, example_inputs=histories, sample_batch=sample
        ).embedding_tables
    assert (items.pooling_factor, items.pooling_factor_p99) == ((SEQ + 11 + 5 + 1) / 4, SEQ)


def test_jagged_ids_give_the_mean_and_a_sample_batch_the_tail() -> None:
    class Jagged(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.items = nn.Embedding(ROWS, DIM)
            self.head = nn.Linear(DIM, 1)

        def forward(self, values: Any, offsets: Any) -> Any:
            return self.head(self.items(values))

    with torch.device("meta"):
        model = Jagged()
    lengths = torch.tensor([40, 3, 3, 2])
    values = torch.randint(0, 1000, (int(lengths.sum()),))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])
    example = describe(model, batch_size_per_gpu=64, example_inputs=(values, offsets), example_batch_size=4)
    (items,) = example.embedding_tables
    assert (items.pooling_factor, items.pooling_factor_p99) == (48 / 4, None)  # 1-D ids: no sample's length
    (items,) = describe(model, batch_size_per_gpu=64, sample_batch={"items": (values, offsets)}).embedding_tables
    assert (items.pooling_factor, items.pooling_factor_p99) == (48 / 4, 40)


def test_a_table_serving_history_and_candidates_is_one_table_of_two_features() -> None:
    """The cost model prices a sequence table's lookups and output rows as batch · num_features · pooling_factor and
    its lengths as batch · num_features: two features of 50 and 1 ids are 2 × 25.5."""

    class TwoTower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.items = nn.Embedding(ROWS, DIM)
            self.user = nn.Linear(DIM, DIM)

        def forward(self, history: Any, candidates: Any) -> Any:
            return (self.user(self.items(history).mean(1)) * self.items(candidates)[:, 0]).sum(-1)

    with torch.device("meta"):
        model = TwoTower()
    g = torch.Generator().manual_seed(3)
    history, candidates = torch.randint(0, 1000, (4, 50), generator=g), torch.randint(0, 1000, (4, 1), generator=g)
    spec = describe(model, batch_size_per_gpu=64, example_inputs=(history, candidates))
    (items,) = spec.embedding_tables
    assert (items.num_features, items.pooling_factor, items.pooling_factor_p99) == (2, 25.5, 50)
    assert described(spec) == params_and_bytes(model)
    # a sample batch for it: one bag per sample per use
    ids = torch.cat([history.reshape(-1), candidates.reshape(-1)])
    offsets = torch.cat([torch.arange(5) * 50, 200 + torch.arange(1, 5)])
    spec = describe(
        model, batch_size_per_gpu=64, example_inputs=(history, candidates), sample_batch={"items": (ids, offsets)}
    )
    assert spec.embedding_tables[0].pooling_factor == 25.5


@pytest.mark.torchrec
def test_an_embedding_collections_sequences_from_the_example_or_a_batch() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    from torchrec import (
        EmbeddingBagCollection,
        EmbeddingBagConfig,
        EmbeddingCollection,
        EmbeddingConfig,
        KeyedJaggedTensor,
    )

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            meta = torch.device("meta")
            item = EmbeddingConfig(
                name="t_item", num_embeddings=ROWS, embedding_dim=DIM, feature_names=["history", "candidate"]
            )
            self.ec = EmbeddingCollection(tables=[item], device=meta)
            self.ebc = EmbeddingBagCollection(
                tables=[EmbeddingBagConfig(name="t_user", num_embeddings=100, embedding_dim=DIM, feature_names=["u"])],
                device=meta,
            )
            self.head = nn.Linear(DIM, 1, device=meta)

        def forward(self, seq: Any, user: Any) -> Any:
            out = self.ec(seq)
            pooled = self.ebc(user)["u"]
            return self.head(out["history"].values()).sum() + (out["candidate"].values() * pooled).sum()

    seq = KeyedJaggedTensor.from_lengths_sync(
        keys=["history", "candidate"],
        values=torch.arange(40 + 7 + 2 + 1 + 4) % 1000,
        lengths=torch.tensor([40, 7, 2, 1, 1, 1, 1, 1]),
    )
    user = KeyedJaggedTensor.from_lengths_sync(keys=["u"], values=torch.arange(8) % 100, lengths=torch.full((4,), 2))
    spec = describe(Model(), batch_size_per_gpu=64, example_inputs=(seq, user))
    item, pooled = spec.embedding_tables
    assert (item.num_features, item.pooling_factor, item.pooling_factor_p99) == (2, 54 / 8, 40)
    assert (pooled.pooling_factor, pooled.pooling_factor_p99) == (1.0, None)  # a pooled table: from a sample batch
    spec = describe(Model(), batch_size_per_gpu=64, sample_batch=KeyedJaggedTensor.concat([seq, user]))
    item, pooled = spec.embedding_tables
    assert (item.pooling_factor, item.pooling_factor_p99, pooled.pooling_factor) == (54 / 8, 40, 2.0)


def test_multihead_attention_through_input_shapes() -> None:
    """Without an example, an ``nn.MultiheadAttention`` attends one sample's sequence to itself."""
    with torch.device("meta"):
        model = SeqRec("sequential")
    with pytest.raises(ValueError, match=r"encoder\.0\.self_attn \(MultiheadAttention, 4,224 parameters; its input_"):
        describe(model, batch_size_per_gpu=64)
    shapes = {
        f"encoder.{i}.{name}": shape
        for i in (0, 1)
        for name, shape in (("self_attn", (SEQ, DIM)), ("linear1", (SEQ, DIM)), ("linear2", (SEQ, 2 * DIM)))
    }
    spec = describe(model, batch_size_per_gpu=64, input_shapes=shapes)
    real, args = sequence_model("sequential", 1000)
    assert described_flops(spec) == pytest.approx(real_flops_per_sample(real, args, 4), rel=0.05)
    # sequence first (batch_first=False) alike: projections in and out, QKᵀ and AV (FlopCounterMode counts nothing
    # for CPU's fused attention kernel, so the forward is counted on meta, where attention runs as matrix products)
    attn = nn.MultiheadAttention(DIM, 2, device="meta")
    x = torch.empty(SEQ, 4, DIM, device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        attn(x, x, x, need_weights=False)
    spec = describe(attn, batch_size_per_gpu=64, input_shapes={"MultiheadAttention": (SEQ, DIM)})
    assert described_flops(spec) == counter.get_total_flops() / 4
    assert described_flops(spec) == 2 * SEQ * DIM * 4 * DIM + 2 * 2 * SEQ * SEQ * DIM
    with pytest.raises(ValueError, match=r"input shape \(32,\) must be \(seq_len, embed_dim=32\)"):
        describe(attn, batch_size_per_gpu=64, input_shapes={"MultiheadAttention": (DIM,)})


class SASRec(nn.Module):
    """An item table, an encoder layer and an output head scoring every item with the table's own weight."""

    def __init__(self, rows: int, functional: bool = False) -> None:
        super().__init__()
        self.functional = functional
        self.items = nn.Embedding(rows, DIM)
        self.block = nn.TransformerEncoderLayer(DIM, 2, 2 * DIM, batch_first=True)
        if not functional:
            self.head = nn.Linear(DIM, rows, bias=False)
            self.head.weight = self.items.weight

    def forward(self, ids: Any) -> Any:
        x = self.block(self.items(ids))
        return torch.nn.functional.linear(x, self.items.weight) if self.functional else self.head(x)


def test_a_tied_output_head_is_one_table_and_a_gemm() -> None:
    rows = 5_000
    with torch.device("meta"):
        model = SASRec(rows)
    ids = torch.randint(0, rows, (4, SEQ))
    with pytest.warns(UserWarning, match=r"table items: its weight is also the weight of head, an nn.Linear"):
        spec = describe(model, batch_size_per_gpu=64, example_inputs=(ids,))
    assert described(spec) == params_and_bytes(model)  # the weight once, in the table
    assert [t.name for t in spec.embedding_tables] == ["items"]
    head = {d.name: d for d in spec.dense_layers}["head"]
    gemm = SEQ * 2 * DIM * rows  # a row of scores per position
    assert (head.kind, head.num_params, head.forward_flops_per_sample) == ("unclassified", 0, gemm)
    assert described_flops(spec) == pytest.approx(real_flops_per_sample(SASRec(rows), (ids,), 4), rel=0.05)
    # without an example: the head on its input shape
    shapes = {"block.self_attn": (SEQ, DIM), "block.linear1": (SEQ, DIM), "block.linear2": (SEQ, 2 * DIM)}
    with pytest.warns(UserWarning, match="apply_plan cannot run such a table sharded"):
        alone = describe(model, batch_size_per_gpu=64, input_shapes={**shapes, "head": (SEQ, DIM)})
    assert {d.name: d for d in alone.dense_layers}["head"].forward_flops_per_sample == gemm
    # F.linear on the table's weight: the product is spent in SASRec.forward, a parameterless layer of its own
    with torch.device("meta"):
        functional = SASRec(rows, functional=True)
    with pytest.warns(UserWarning, match=r"table items: the forward reads its weight outside a lookup \(aten\.t\)"):
        spec = describe(functional, batch_size_per_gpu=64, example_inputs=(ids,))
    assert described(spec) == params_and_bytes(functional)
    root = {d.name: d for d in spec.dense_layers}["SASRec"]
    assert (root.num_params, root.forward_flops_per_sample) == (0, gemm)
