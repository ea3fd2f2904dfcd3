"""shardwise.runtime.describe: a real nn.Module (on the meta device) → ModelSpec, without allocating its weights."""

from __future__ import annotations

import resource
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402  (after the importorskip)

from shardwise.runtime.describe import describe  # noqa: E402
from shardwise.wire.spec import DenseLayerSpec, EmbeddingTableSpec, ModelSpec  # noqa: E402


class SparseArch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user = nn.EmbeddingBag(40_000, 64, mode="sum")
        self.item = nn.EmbeddingBag(10_000, 32, mode="mean", dtype=torch.bfloat16)
        self.history = nn.Embedding(5_000, 16, dtype=torch.float16)  # sequence: one output row per id


class TinyDLRM(nn.Module):
    """Embedding tables, a bottom MLP for dense features and an over-arch."""

    def __init__(self) -> None:
        super().__init__()
        self.sparse = SparseArch()
        self.bottom = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 64))
        self.over = nn.ModuleList([nn.Linear(176, 128), nn.Linear(128, 1, bias=False)])

    def forward(self, dense: Any, users: Any, items: Any, history: Any) -> Any:
        pooled = [self.bottom(dense), self.sparse.user(users), self.sparse.item(items).float()]
        x = torch.cat([*pooled, self.sparse.history(history).float().sum(1)], dim=1)
        return self.over[1](torch.relu(self.over[0](x)))


def meta(cls: type[nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return cls()


def test_dlrm_on_meta_gives_the_exact_spec() -> None:
    spec = describe(
        meta(TinyDLRM),
        batch_size_per_gpu=2048,
        name="tiny-dlrm",
        pooling_factors={"sparse.user": 3.0, "sparse.history": 20.0},
        access_skew={"sparse.user": 1.05},
        optimizer={"sparse.item": "adam"},
    )
    assert spec == ModelSpec(
        name="tiny-dlrm",
        batch_size_per_gpu=2048,
        embedding_tables=[
            EmbeddingTableSpec(
                name="sparse.user",
                num_embeddings=40_000,
                embedding_dim=64,
                dtype="fp32",
                pooling="sum",
                pooling_factor=3.0,
                access_skew=1.05,
                optimizer="rowwise_adagrad",
            ),
            EmbeddingTableSpec(
                name="sparse.item",
                num_embeddings=10_000,
                embedding_dim=32,
                dtype="bf16",
                pooling="mean",
                pooling_factor=1.0,
                optimizer="adam",
            ),
            EmbeddingTableSpec(
                name="sparse.history",
                num_embeddings=5_000,
                embedding_dim=16,
                dtype="fp16",
                pooling="none",
                pooling_factor=20.0,
            ),
        ],
        dense_layers=[
            DenseLayerSpec(name="bottom.0", in_features=13, out_features=64, flops_per_sample=2 * 13 * 64),
            DenseLayerSpec(name="bottom.2", in_features=64, out_features=64, flops_per_sample=2 * 64 * 64),
            DenseLayerSpec(name="over.0", in_features=176, out_features=128, flops_per_sample=2 * 176 * 128),
            DenseLayerSpec(name="over.1", in_features=128, out_features=1, bias=False, flops_per_sample=2 * 128),
        ],
    )
    # every figure is a plain number: the spec round-trips through JSON
    assert ModelSpec.model_validate_json(spec.model_dump_json()) == spec


def test_defaults_name_and_options() -> None:
    spec = describe(meta(TinyDLRM), batch_size_per_gpu=8, pooling_factors=2.5, optimizer="sgd", dense_optimizer="sgd")
    assert spec.name == "TinyDLRM"
    assert {t.pooling_factor for t in spec.embedding_tables} == {2.5}
    assert {t.optimizer.value for t in spec.embedding_tables} == {"sgd"}
    assert {t.access_skew for t in spec.embedding_tables} == {None}
    assert {d.optimizer.value for d in spec.dense_layers} == {"sgd"}


def test_linear_flops_per_sample() -> None:
    spec = describe(nn.Linear(1024, 512, device="meta"), batch_size_per_gpu=4096)
    (layer,) = spec.dense_layers
    assert layer.name == "Linear"  # a bare layer is named by its class
    assert layer.flops_per_sample == 2 * 1024 * 512
    assert layer.forward_flops_per_sample == 2 * 1024 * 512


def test_input_shapes_scale_flops_per_token() -> None:
    model = nn.Sequential(nn.Linear(256, 1024), nn.Linear(1024, 256)).to("meta")
    spec = describe(model, batch_size_per_gpu=32, input_shapes={"0": (128, 256), "1": [128, 1024]})
    assert [d.flops_per_sample for d in spec.dense_layers] == [128 * 2 * 256 * 1024, 128 * 2 * 1024 * 256]
    with pytest.raises(ValueError, match=r"0: input shape \(128, 512\) must .* end with in_features=256"):
        describe(model, batch_size_per_gpu=32, input_shapes={"0": (128, 512)})
    with pytest.raises(ValueError, match=r"input_shapes names no dense layer of the module: decoder"):
        describe(model, batch_size_per_gpu=32, input_shapes={"decoder": (256,)})


def test_real_weights_are_counted_on_meta_copies() -> None:
    layer = nn.Linear(64, 32)  # real CPU weights: the FLOP count must not run them
    spec = describe(layer, batch_size_per_gpu=100_000_000)  # a real input of this size would be 25 GB
    assert spec.dense_layers[0].flops_per_sample == 2 * 64 * 32
    assert not layer.weight.is_meta


def test_a_1tb_table_on_meta_allocates_nothing() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    model = nn.ModuleDict({"huge": nn.EmbeddingBag(2_000_000_000, 128, device="meta")})
    spec = describe(model, batch_size_per_gpu=65536)
    assert spec.table("huge").weight_bytes == 1_024_000_000_000
    assert model["huge"].weight.is_meta
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # < 200 MiB more, not 1 TB


def test_max_pooling_is_refused_by_name() -> None:
    model = nn.ModuleDict({"clicks": nn.EmbeddingBag(100, 8, mode="max", device="meta")})
    with pytest.raises(ValueError, match=r"clicks: nn.EmbeddingBag mode 'max' is not supported"):
        describe(model, batch_size_per_gpu=8)


def test_dtypes() -> None:
    model = nn.ModuleDict(
        {
            "fp8": nn.Embedding(10, 8, dtype=torch.float8_e4m3fn, device="meta"),
            "fp16": nn.EmbeddingBag(10, 8, dtype=torch.float16, device="meta"),
        }
    )
    quantized = nn.EmbeddingBag(10, 8, device="meta")
    quantized.weight = nn.Parameter(torch.empty(10, 8, dtype=torch.int8, device="meta"), requires_grad=False)
    model["int8"] = quantized
    spec = describe(model, batch_size_per_gpu=8)
    assert [t.dtype.value for t in spec.embedding_tables] == ["fp8", "fp16", "int8"]
    double = nn.ModuleDict({"f64": nn.EmbeddingBag(10, 8, dtype=torch.float64, device="meta")})
    with pytest.raises(ValueError, match=r"f64: weight dtype torch.float64 has no shardwise dtype"):
        describe(double, batch_size_per_gpu=8)


def test_unknown_table_names_in_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"pooling_factors names no embedding table of the module: sparse\.usr"):
        describe(meta(TinyDLRM), batch_size_per_gpu=8, pooling_factors={"sparse.usr": 2.0})
    with pytest.raises(ValueError, match="access_skew names no embedding table"):
        describe(meta(TinyDLRM), batch_size_per_gpu=8, access_skew={"user": 1.1})


def test_a_module_with_nothing_to_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one embedding table or dense layer"):
        describe(nn.ReLU(), batch_size_per_gpu=8)


@pytest.mark.torchrec
def test_torchrec_collections_become_one_table_per_config() -> None:
    pytest.importorskip("torchrec", exc_type=ImportError)
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, PoolingType
    from torchrec.types import DataType

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            meta_device = torch.device("meta")
            self.ebc = EmbeddingBagCollection(
                tables=[
                    EmbeddingBagConfig(
                        name="t_user", num_embeddings=1_000_000, embedding_dim=128, feature_names=["user", "friend"]
                    ),
                    EmbeddingBagConfig(
                        name="t_item",
                        num_embeddings=50_000,
                        embedding_dim=64,
                        feature_names=["item"],
                        pooling=PoolingType.MEAN,
                        data_type=DataType.FP16,
                    ),
                ],
                device=meta_device,
            )
            self.ec = EmbeddingCollection(
                tables=[EmbeddingConfig(name="t_seq", num_embeddings=20_000, embedding_dim=32, feature_names=["seq"])],
                device=meta_device,
            )
            self.over = nn.Linear(128 * 2 + 64, 1, device=meta_device)

    spec = describe(Model(), batch_size_per_gpu=512, pooling_factors={"t_user": 4.0})
    assert [(t.name, t.num_embeddings, t.embedding_dim) for t in spec.embedding_tables] == [
        ("t_user", 1_000_000, 128),
        ("t_item", 50_000, 64),
        ("t_seq", 20_000, 32),
    ]
    user, item, seq = spec.embedding_tables
    assert (user.num_features, user.pooling.value, user.dtype.value, user.pooling_factor) == (2, "sum", "fp32", 4.0)
    assert (item.num_features, item.pooling.value, item.dtype.value) == (1, "mean", "fp16")
    assert (seq.num_features, seq.pooling.value) == (1, "none")
    # the collections' own nn.EmbeddingBag / nn.Embedding children are not described a second time
    assert [d.name for d in spec.dense_layers] == ["over"]
