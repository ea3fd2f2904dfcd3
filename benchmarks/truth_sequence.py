"""Predicted against measured for sequence models: unpooled tables over jagged histories, on one GPU, in
``benchmarks/truth.py``'s protocol.

Each configuration is a small sequence recommender: every sample is a user's history of item ids (jagged, lengths
uniform in ``1 … 2L−1``, mean ``L``); an unpooled item table (``nn.Embedding``, pooling ``none``) looks up every id
of it and an unpooled user table the user; a token layer (``Linear(dim, dim)`` and ReLU on every history row), the
mean over each history (described as an unclassified layer: an add per value), the user's row beside it, and a top
MLP score the sample. The tables train with the optimizer in backward (``apply_plan(...,
embedding_optimizer=...)``), the dense layers with a fused Adam; world size one, every table table_wise with the
configuration's placement (``hbm``, ``host`` — read zero-copy from pinned host memory — or ``uvm_cache``).

Ten configurations, 0.5–2 M ids a step, span histories of 50–2,000 ids, item tables of 5 M–100 M rows (the 100 M-row
ones in HBM, in host memory and cached), fp32, fp16 and bf16 weights, dims 64 and 128, row-wise Adagrad and Adam.
Their ``split`` (``fit`` / ``test``, alternating) was fixed before anything was measured; no figure of the cost
model has been fitted on them, so both halves are held out from everything the catalogue holds, and the ``test``
half stays held out from any refit a later change makes on the ``fit`` half.

    # on the GPU (torch, Triton, pydantic, PyYAML): every configuration, eager steps, then graphed steps (the
    # uvm_cache configuration is not captured: a cached lookup keeps host state)
    python benchmarks/truth_sequence.py measure -o measured.json
    python benchmarks/truth_sequence.py measure --graphed -o measured_graphed.json
    # anywhere with the planner: the catalogue's predictions, then the table and the statistics
    python benchmarks/truth_sequence.py predict -o predicted.json
    python benchmarks/truth_sequence.py predict --graphed -o predicted_graphed.json
    python benchmarks/truth_sequence.py report predicted.json measured.json
    # another GPU type than the H200: name its catalogue profile to both measure and predict (the plan's kernels,
    # the fleet priced, the HBM the reserve is read against), e.g. an H100
    python benchmarks/truth_sequence.py measure --gpu nvidia-h100-sxm -o measured_h100.json
    python benchmarks/truth_sequence.py predict --gpu nvidia-h100-sxm -o predicted_h100.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import truth  # the protocol: measure_rig, predict, report

from shardwise.wire.spec import (
    DenseLayerSpec,
    Dtype,
    EmbeddingTableSpec,
    ModelSpec,
    Optimizer,
    Placement,
    Plan,
    Pooling,
)

ITEM, USER = "sparse.item", "sparse.user"


@dataclass(frozen=True)
class SeqConfig:
    name: str
    split: str  # fit | test, fixed before measuring
    batch: int
    history: int  # mean history length L: lengths uniform in 1 … 2L−1
    items: int
    dim: int
    dtype: str = "fp32"
    placement: str = "hbm"  # the item table's; the user table stays in HBM
    cache_fraction: float | None = None
    optimizer: str = "rowwise_adagrad"
    users: int = 1_000_000
    top: tuple[int, ...] = (256,)

    @property
    def p99(self) -> float:
        """The 99th percentile of the history lengths (uniform in 1 … 2L−1)."""
        return 1 + 0.99 * (2 * self.history - 2)


def _configs() -> list[SeqConfig]:
    m = 1_000_000
    c = [
        SeqConfig("seq-50", "", 32768, 50, 10 * m, 64),
        SeqConfig("seq-200-fp16", "", 8192, 200, 10 * m, 64, dtype="fp16"),
        SeqConfig("seq-500-d128", "", 4096, 500, 20 * m, 128),
        SeqConfig("seq-2000-fp16", "", 1024, 2000, 10 * m, 64, dtype="fp16"),
        SeqConfig("seq-100m-hbm-fp16", "", 16384, 100, 100 * m, 64, dtype="fp16"),
        SeqConfig("seq-100m-host-fp16", "", 4096, 200, 100 * m, 64, dtype="fp16", placement="host"),
        SeqConfig("seq-100m-host-fp32", "", 1024, 500, 100 * m, 64, placement="host"),
        SeqConfig("seq-adam-100", "", 16384, 100, 5 * m, 128, optimizer="adam"),
        SeqConfig("seq-1000-bf16", "", 2048, 1000, 20 * m, 128, dtype="bf16"),
        SeqConfig(
            "seq-100m-cache-fp16", "", 4096, 200, 100 * m, 64, dtype="fp16", placement="uvm_cache", cache_fraction=0.1
        ),
    ]
    return [SeqConfig(**{**asdict(x), "split": "fit" if i % 2 == 0 else "test"}) for i, x in enumerate(c)]


CONFIGS = _configs()


def _micro() -> list[SeqConfig]:
    """Parts measured beside the set, none of them a configuration of it (split ``micro``, never in its
    statistics): the embedding part of host tables of 1–100 M rows at 128- and 256-byte rows (zero-copy reads
    as the table outgrows what the device maps at once), and cached tables at 128-, 256- and 512-byte rows (the
    host's fetch per row)."""
    m = 1_000_000
    host = [(rows, dim) for rows in (1 * m, 10 * m, 30 * m, 100 * m) for dim in (32,)] + [(1 * m, 64), (100 * m, 64)]
    cached = [("fp16", 64), ("fp32", 64), ("fp32", 128)]
    return [
        SeqConfig(f"micro-host-{rows // m}m-d{dim}", "micro", 4096, 200, rows, dim, placement="host")
        for rows, dim in host
    ] + [
        SeqConfig(
            f"micro-cache-{dt}-d{dim}",
            "micro",
            4096,
            200,
            20 * m,
            dim,
            dtype=dt,
            placement="uvm_cache",
            cache_fraction=0.1,
        )
        for dt, dim in cached
    ]


MICRO = _micro()


# ------------------------------------------------------------------------------------------------ specs


def _layers(cfg: SeqConfig) -> list[tuple[str, int, int, int]]:
    """(name, in, out, rows per sample) of every Linear: the token layer runs on every history row."""
    top = (2 * cfg.dim, *cfg.top, 1)
    return [("tok", cfg.dim, cfg.dim, cfg.history)] + [
        (f"top.{2 * i}", a, b, 1) for i, (a, b) in enumerate(itertools.pairwise(top))
    ]


def model_spec(cfg: SeqConfig) -> ModelSpec:
    def table(name: str, rows: int, ids: float, p99: float | None) -> EmbeddingTableSpec:
        return EmbeddingTableSpec(
            name=name,
            num_embeddings=rows,
            embedding_dim=cfg.dim,
            dtype=Dtype(cfg.dtype),
            pooling=Pooling.none,
            pooling_factor=ids,
            pooling_factor_p99=p99,
            optimizer=Optimizer(cfg.optimizer),
        )

    return ModelSpec(
        name=cfg.name,
        batch_size_per_gpu=cfg.batch,
        embedding_tables=[table(ITEM, cfg.items, float(cfg.history), cfg.p99), table(USER, cfg.users, 1.0, None)],
        dense_layers=[
            DenseLayerSpec(
                name=n,
                in_features=a,
                out_features=b,
                optimizer=Optimizer.adam,
                flops_per_sample=2 * a * b * rows,
                activation_bytes_per_sample=(a + b) * 4 * rows,
            )
            for n, a, b, rows in _layers(cfg)
        ]
        + [
            # the mean over each history: an add per history value, each row read once and the mean written
            DenseLayerSpec(
                name="pool",
                kind="unclassified",
                param_count=0,
                flops_per_sample=cfg.history * cfg.dim,
                activation_bytes_per_sample=(cfg.history + 1) * cfg.dim * 4,
            )
        ],
    )


def plan(cfg: SeqConfig) -> Plan:
    """Both tables table_wise on the one GPU, the item table with the configuration's placement, every dense layer
    replicated (:func:`truth.one_gpu_plan`)."""
    return truth.one_gpu_plan(model_spec(cfg), {ITEM: (Placement(cfg.placement), cfg.cache_fraction)})


# ------------------------------------------------------------------------------------------------ measure


def make_batches(cfg: SeqConfig, device: Any, count: int, *, graphed: bool = False) -> list[Any]:
    """``count`` batches, each ``((sample of every history row, history lengths), {table: ids}, labels)`` on
    ``device``: the item table's ids jagged ``(ids, offsets)``, the user table's one per sample. Seeded (1; and 2
    for the lengths of ``graphed`` batches, drawn once so that every batch has one shape)."""
    import torch

    fixed = torch.randint(1, 2 * cfg.history, (cfg.batch,), generator=torch.Generator().manual_seed(2))

    def batch_of(gen: torch.Generator) -> Any:
        lengths = fixed if graphed else torch.randint(1, 2 * cfg.history, (cfg.batch,), generator=gen)
        n = int(lengths.sum())
        ids = torch.randint(0, cfg.items, (n,), generator=gen)
        offsets = torch.cumsum(lengths, 0) - lengths
        users = torch.randint(0, cfg.users, (cfg.batch,), generator=gen)
        labels = torch.randint(0, 2, (cfg.batch,), generator=gen).float()
        sample_of = torch.repeat_interleave(torch.arange(cfg.batch), lengths)
        aux = (sample_of.to(device), lengths.float().unsqueeze(1).to(device))
        feats = {ITEM: (ids.to(device), offsets.to(device)), USER: users.to(device)}
        return aux, feats, labels.to(device)

    gen = torch.Generator().manual_seed(1)
    return [batch_of(gen) for _ in range(count)]


class SeqRig(truth.Rig):
    """:class:`truth.Rig` for a sequence model: its embedding part back-propagates a gradient of each output's
    shape (the item rows vary in number from batch to batch); its head takes the rows by table."""

    def lookup(self, features: Any) -> Any:
        return self.ebc(features)

    def embedding_part(self, features: Any) -> None:
        import torch

        rows = self.ebc(features)
        names_ = sorted(rows)
        grads = [self.grads[n][: rows[n].shape[0]].to(rows[n].dtype) for n in names_]
        torch.autograd.backward([rows[n] for n in names_], grads)


#: batches a cached configuration streams (:attr:`truth.Rig.fresh`): four repeated batches would all stay cached
#: and every lookup hit. ``measure --steps 10`` uses 55 of them (warm-up, waited, three back-to-back runs, the
#: embedding part) before any repeats
FRESH_BATCHES = 60


def build(cfg: SeqConfig, device: Any, *, batches: int = 4, graphed: bool = False) -> SeqRig:
    """The configuration's model applied to ``device`` with :func:`plan` (a process group of one must exist), on
    ``batches`` batches (a ``uvm_cache`` configuration: a stream of :data:`FRESH_BATCHES`, none repeated while they
    last); ``graphed``: the step and the embedding part captured as CUDA graphs."""
    import torch
    from torch import nn

    from shardwise.runtime.apply import apply_plan, split_parameters
    from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection
    from shardwise.runtime.embedding.update import RowOptimizer, UpdateConfig

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

    class SeqRec(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            dt = dtypes[cfg.dtype]
            self.sparse = nn.ModuleDict(
                {
                    "item": nn.Embedding(cfg.items, cfg.dim, device="meta", dtype=dt),
                    "user": nn.Embedding(cfg.users, cfg.dim, device="meta", dtype=dt),
                }
            )
            self.tok = nn.Linear(cfg.dim, cfg.dim)
            self.top = truth.mlp((2 * cfg.dim, *cfg.top, 1))

        def head(self, aux: tuple[torch.Tensor, torch.Tensor], rows: dict[str, torch.Tensor]) -> torch.Tensor:
            sample_of, lengths = aux
            h = torch.relu(self.tok(rows[ITEM].float()))
            mean = h.new_zeros(cfg.batch, cfg.dim).index_add_(0, sample_of, h) / lengths
            out: torch.Tensor = self.top(torch.cat([mean, rows[USER].float()], dim=1)).squeeze(1)
            return out

    torch.manual_seed(0)
    model = apply_plan(
        SeqRec(),
        plan(cfg),
        model_spec=model_spec(cfg),
        device=device,
        embedding_optimizer=UpdateConfig(RowOptimizer(cfg.optimizer), lr=0.01),
        init_fns=lambda w: nn.init.uniform_(w, -0.01, 0.01),
    )
    _, dense = split_parameters(model)
    fresh = cfg.placement == "uvm_cache"  # repeated batches would stay cached: a stream of new ones instead
    batches = max(batches, FRESH_BATCHES) if fresh else batches
    rig = SeqRig(
        model=model,
        ebc=ShardedEmbeddingBagCollection.from_module(model),
        opt=torch.optim.Adam(dense, lr=1e-3, fused=device.type == "cuda", capturable=graphed),
        batches=make_batches(cfg, device, batches, graphed=graphed),
        grads=output_grads(cfg, device),
        fresh=fresh,
    )
    if graphed:
        rig.capture()
    return rig


def output_grads(cfg: SeqConfig, device: Any) -> dict[str, Any]:
    """The output gradients the embedding part's timing back-propagates (:meth:`SeqRig.embedding_part`): the item
    table's for the most history rows a batch may have (``2·L·B``), cut to each batch's; the user table's."""
    import torch

    most = 2 * cfg.history * cfg.batch
    return {ITEM: torch.randn(most, cfg.dim, device=device), USER: torch.randn(cfg.batch, cfg.dim, device=device)}


def rebuilt_harness(cfg: SeqConfig, batches: int, graphed: bool) -> int:
    """:func:`truth.rebuilt_harness` for this set's rig."""
    import torch

    data = make_batches(cfg, torch.device("cpu"), batches, graphed=graphed)
    return truth.harness_bytes(data, output_grads(cfg, torch.device("meta")))


def graphable(cfg: SeqConfig) -> bool:
    """A cached lookup keeps host state a CUDA graph cannot replay."""
    return cfg.placement != "uvm_cache"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = truth.measure_parser(sub)
    m.add_argument("--micro", action="store_true", help="the parts measured beside the set (MICRO), not the set")
    p = sub.add_parser("predict")
    p.add_argument("--graphed", action="store_true", help="price graphed steps (the executor profile's)")
    p.add_argument("--micro", action="store_true", help="the parts measured beside the set (MICRO), not the set")
    p.add_argument("-o", "--output", type=Path, required=True)
    truth.gpu_option(p)
    truth.report_parser(sub)
    args = ap.parse_args(argv)
    if args.cmd in ("measure", "predict"):
        truth.use_gpu(args.gpu)
    if args.cmd == "measure":
        names = [n for n in args.only.split(",") if n]
        chosen = MICRO if args.micro else CONFIGS
        configs = [c for c in chosen if graphable(c)] if args.graphed else chosen
        doc = truth.measure(names, args.steps, args.warmup, args.graphed, configs=configs, build_of=build)
        args.output.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    elif args.cmd == "predict":
        chosen = MICRO if args.micro else CONFIGS
        doc = truth.predict(None, args.graphed, configs=chosen, spec_of=model_spec, plan_of=plan)
        args.output.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    else:
        truth.print_report(
            args.predicted,
            args.measured,
            args.measure,
            args.json,
            args.harness_batches,
            configs=CONFIGS + MICRO,
            harness_of=rebuilt_harness,
        )


if __name__ == "__main__":
    main()
