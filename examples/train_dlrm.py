"""Plan, shard and train a DLRM-style model with shardwise, under torchrun.

::

    torchrun --standalone --nproc-per-node 2 examples/train_dlrm.py --device cpu --steps 3    # gloo, CPU
    torchrun --standalone --nproc-per-node 2 examples/train_dlrm.py --device cuda --steps 20  # nccl, 1 GPU a rank

What it does, on every rank:

1. builds the model on the meta device (no memory) and describes it: ``describe(model, batch_size_per_gpu=...)``
   gives the :class:`~shardwise.wire.spec.ModelSpec` (tables, dense layers, FLOPs), with the synthetic data's pooling
   factors;
2. builds the fleet from torchrun's environment — ``WORLD_SIZE`` ranks, ``LOCAL_WORLD_SIZE`` GPUs per host, so
   ``WORLD_SIZE / LOCAL_WORLD_SIZE`` hosts — of the GPU kind ``--gpu`` names (a catalogue profile, default
   ``nvidia-h200``);
3. with ``--url`` (or ``SHARDWISE_URL``) every rank asks a shardwise service for the plan:
   ``ShardwiseClient(url).plan(spec, fleet, solver=..., time_limit_s=...)``; the ranks send the same request, so
   the service solves it once and hands every rank the same plan (a later run gets it from the store). Without a
   service, rank 0 plans it with the library call ``make_plan(spec, fleet, SolveParams(...))`` and broadcasts the
   plan (CP-SAT stops on a time limit, so two ranks planning alone could disagree);
4. ``apply_plan`` shards the model (tables as the plan says, dense layers replicate / fsdp / colwise / rowwise),
   with tables still on the meta device, so each rank only materialises its own shards;
5. trains ``--steps`` steps on synthetic data (uniform ids, bag lengths averaging the pooling factor, random
   click labels): one all-to-all exchange for all tables through ``ShardedEmbeddingBagCollection``, row-wise
   Adagrad on the table shards (sparse gradients), Adam on the rest; rank 0 prints the loss and the step time.

On ``--device cpu`` the plan is still made for ``--gpu`` (the catalogue has no CPU profile, and an invented one
would only make the predicted milliseconds look meaningful when they are not): the layout is valid for any
executor of that world size, and the printed ``predicted_step_ms`` is what the cost model expects on those GPUs,
not on the CPU.

"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from shardwise.clients.client import ShardwiseClient
from shardwise.runtime.apply import apply_plan, param_groups, split_parameters
from shardwise.runtime.describe import describe
from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection
from shardwise.runtime.embedding.optim import RowWiseAdagrad
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, SolveParams

# ------------------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class TableConfig:
    name: str  # the key in ``DLRM.sparse``; the table's FQN is ``sparse.<name>``
    rows: int
    pooling_factor: float  # mean ids per bag in the synthetic data


@dataclass(frozen=True)
class DLRMConfig:
    tables: tuple[TableConfig, ...]
    dim: int  # every table's embedding dim, and the bottom MLP's output width
    dense_features: int
    bottom: tuple[int, ...]  # hidden widths of the bottom MLP (its last layer outputs ``dim``)
    top: tuple[int, ...]  # hidden widths of the top MLP (its last layer outputs one logit)

    def fqn(self, t: TableConfig) -> str:
        return f"sparse.{t.name}"


SMALL = DLRMConfig(
    tables=(
        TableConfig("t_user", 200_000, 4.0),
        TableConfig("t_item", 1_000_000, 8.0),
        TableConfig("t_cat", 500, 1.0),
        TableConfig("t_ctx", 2_000, 2.0),
    ),
    dim=16,
    dense_features=13,
    bottom=(64,),
    top=(128, 64),
)


def _mlp(widths: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Bottom MLP on the dense features, sum-pooled embedding bags, interaction by concatenation, top MLP → logit."""

    def __init__(self, cfg: DLRMConfig, table_device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.bottom = _mlp((cfg.dense_features, *cfg.bottom, cfg.dim))
        self.sparse = nn.ModuleDict(
            {t.name: nn.EmbeddingBag(t.rows, cfg.dim, mode="sum", device=table_device) for t in cfg.tables}
        )
        self.top = _mlp((cfg.dim * (1 + len(cfg.tables)), *cfg.top, 1))

    def embed(self, features: Mapping[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
        """Pooled rows per table FQN, one lookup (and, once sharded, one exchange) per table."""
        return {f"sparse.{k}": bag(*features[f"sparse.{k}"]) for k, bag in self.sparse.items()}

    def head(self, dense: Tensor, pooled: Mapping[str, Tensor]) -> Tensor:
        """Interaction by concatenation (tables in FQN order), then the top MLP: one logit per sample."""
        z = torch.cat([self.bottom(dense), *(pooled[n] for n in sorted(pooled))], dim=1)
        out: Tensor = self.top(z).squeeze(1)
        return out

    def forward(self, dense: Tensor, features: Mapping[str, tuple[Tensor, Tensor]]) -> Tensor:
        return self.head(dense, self.embed(features))


def model_spec(cfg: DLRMConfig, batch_size_per_gpu: int) -> ModelSpec:
    """The model's ModelSpec, described from a copy built entirely on the meta device (no memory, no compute)."""
    with torch.device("meta"):
        meta = DLRM(cfg)
    return describe(
        meta,
        name="dlrm",
        batch_size_per_gpu=batch_size_per_gpu,
        pooling_factors={cfg.fqn(t): t.pooling_factor for t in cfg.tables},
        optimizer="rowwise_adagrad",
        dense_optimizer="adam",
    )


# ------------------------------------------------------------------------------------------------ data


Batch = tuple[Tensor, dict[str, tuple[Tensor, Tensor]], Tensor]


def synthetic_batch(cfg: DLRMConfig, batch: int, device: torch.device, generator: torch.Generator) -> Batch:
    """Dense features, per table 1-D ids with bag offsets (lengths uniform in 1..2L−1, mean L; uniform ids), labels."""
    dense = torch.randn(batch, cfg.dense_features, generator=generator)
    labels = torch.randint(0, 2, (batch,), generator=generator).float()
    feats: dict[str, tuple[Tensor, Tensor]] = {}
    for t in cfg.tables:
        hi = max(1, round(2 * t.pooling_factor - 1))
        lengths = torch.randint(1, hi + 1, (batch,), generator=generator)
        ids = torch.randint(0, t.rows, (int(lengths.sum()),), generator=generator)
        offsets = torch.cumsum(lengths, 0) - lengths
        feats[cfg.fqn(t)] = (ids.to(device), offsets.to(device))
    return dense.to(device), feats, labels.to(device)


# ------------------------------------------------------------------------------------------------ plan, shard


def fleet_from_env(gpu: str) -> FleetSpec:
    """The fleet torchrun started: ``WORLD_SIZE`` ranks in hosts of ``LOCAL_WORLD_SIZE`` GPUs of kind ``gpu``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world % per_host:
        raise SystemExit(f"WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {per_host}")
    return FleetSpec.model_validate(
        {
            "name": f"{world // per_host}x{per_host}x{gpu}",
            "hosts": [{"gpu": gpu, "count": world // per_host, "gpus_per_host": per_host}],
        }
    )


def plan_on_rank0(spec: ModelSpec, fleet: FleetSpec, params: SolveParams) -> Plan:
    """Rank 0 plans, every rank gets the same plan (a collective). Without the planner extra every rank stops before
    the collective, rank 0 saying in one line what to install (or to plan on a service instead)."""
    try:  # the local planner needs the planner extra; the service path does not
        from shardwise.solver.planner import make_plan
    except ImportError as exc:
        if dist.get_rank() == 0:
            print(
                f"error: planning here needs shardwise's planner extra ({exc.name} is missing): pip install "
                "'.[planner]' in the shardwise checkout, or pass --url to plan on a shardwise service",
                file=sys.stderr,
            )
        raise SystemExit(2) from None

    box: list[str | None] = [None]
    if dist.get_rank() == 0:
        box[0] = make_plan(spec, fleet, params).model_dump_json()
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return Plan.model_validate_json(box[0])


def plan_from_service(url: str, spec: ModelSpec, fleet: FleetSpec, params: SolveParams) -> Plan:
    """Every rank asks the service; one request hash, so one solve and the same plan for all of them."""
    with ShardwiseClient(url) as client:
        return client.plan(spec, fleet, solver=params.solver, time_limit_s=params.time_limit_s)


def describe_plan(plan: Plan) -> list[str]:
    lines = [
        f"plan: {plan.status.value}, predicted step {plan.predicted_step_ms or 0:.3f} ms "
        f"({plan.solver.name}, {plan.solver.seconds:.1f} s)"
    ]
    for t in plan.tables:
        ranks = sorted({s.rank for s in t.shards})
        lines.append(f"  {t.name:<16} {t.sharding_type.value:<15} ranks {ranks}")
    for d in plan.dense:
        lines.append(f"  {d.name:<16} {d.style.value}")
    for r in plan.ranks:
        p = r.predicted_ms
        lines.append(f"  rank {r.rank}: predicted {p.total:.3f} ms (compute {p.compute:.3f}, comm {p.comm:.3f})")
    return lines


def build_sharded(cfg: DLRMConfig, plan: Plan, spec: ModelSpec, device: torch.device, seed: int = 0) -> DLRM:
    """The model with tables on the meta device (each rank materialises only its shards) and dense layers real."""
    torch.manual_seed(seed)  # dense layers start equal on every rank (DDP also broadcasts them)
    model = DLRM(cfg, table_device="meta")
    apply_plan(model, plan, model_spec=spec, device=device)
    return model


def optimizers(model: nn.Module, lr_dense: float = 1e-3, lr_emb: float = 0.05) -> list[torch.optim.Optimizer]:
    """Adam on the dense parameters, row-wise Adagrad (sparse gradients) on this rank's table shards."""
    emb, dense = split_parameters(model)
    opts: list[torch.optim.Optimizer] = [torch.optim.Adam(param_groups(dense), lr=lr_dense)]
    if emb:  # a rank may hold no shard
        opts.append(RowWiseAdagrad(emb, lr=lr_emb))
    return opts


def train_step(
    model: DLRM, ebc: ShardedEmbeddingBagCollection, opts: Sequence[torch.optim.Optimizer], batch: Batch
) -> Tensor:
    """Forward (one exchange for all tables), BCE loss, backward, every optimizer's step; returns the loss."""
    dense, feats, labels = batch
    logits = model.head(dense, ebc(feats))
    loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
    loss.backward()  # type: ignore[no-untyped-call]
    for o in opts:
        o.step()
        o.zero_grad(set_to_none=True)
    return loss.detach()


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: gloo; cuda: nccl, one GPU a rank")
    p.add_argument("--gpu", default="nvidia-h200", help="catalogue profile of the fleet's GPUs (default nvidia-h200)")
    p.add_argument("--solver", choices=["cpsat", "greedy"], default="cpsat")
    p.add_argument("--time-limit", type=float, default=5.0, help="CP-SAT's time limit, seconds")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256, help="samples per rank and step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", default=os.environ.get("SHARDWISE_URL"), help="a shardwise service [env SHARDWISE_URL]")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun, e.g. torchrun --standalone --nproc-per-node 2 examples/train_dlrm.py")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", timeout=timedelta(minutes=5), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    rank = dist.get_rank()
    try:
        run(args, device, rank)
    finally:
        # the model (its DDP reducer, the sharded tables' process-group references) is gone with run()'s frame and
        # collected, and every rank is past its last collective, before any rank tears the group down: with the
        # model still alive at destroy_process_group, about one run in eight on gloo ended in an abort ("terminate
        # called without an active exception"); 30 runs in a row passed after this change (2-core VM, 2026-12-01)
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.barrier()
        gc.collect()
        dist.destroy_process_group()


def run(args: argparse.Namespace, device: torch.device, rank: int) -> None:
    """Plan, shard and train ``args.steps`` steps (inside :func:`main`'s process group)."""
    cfg = SMALL
    spec = model_spec(cfg, args.batch_size)
    fleet = fleet_from_env(args.gpu)
    params = SolveParams(solver=args.solver, time_limit_s=args.time_limit)
    plan = plan_from_service(args.url, spec, fleet, params) if args.url else plan_on_rank0(spec, fleet, params)
    if rank == 0:
        where = f"service {args.url}" if args.url else "planned locally"
        print(f"fleet {fleet.name}, world {fleet.world_size}, device {args.device}, {where}")
        print("\n".join(describe_plan(plan)))
    model = build_sharded(cfg, plan, spec, device, seed=args.seed)
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    opts = optimizers(model)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)  # each rank its own data
    for step in range(args.steps):
        batch = synthetic_batch(cfg, args.batch_size, device, gen)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = train_step(model, ebc, opts, batch)
        dist.all_reduce(loss)  # the mean loss over ranks (and a barrier: the step time is the slowest rank's)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0:
            print(f"step {step}: loss {loss.item() / dist.get_world_size():.4f}, {ms:.1f} ms")


if __name__ == "__main__":
    main()
