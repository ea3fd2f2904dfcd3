"""Plan, shard and train a small HSTU-like sequence recommender with shardwise, under torchrun.

::

    torchrun --standalone --nproc-per-node 2 examples/train_hstu.py --steps 3                      # gloo, CPU
    torchrun --standalone --nproc-per-node 2 examples/train_hstu.py --steps 3 --export hstu_tr.json

The model: every sample is a user's history of item ids (jagged: its own length) with one candidate item appended;
an unpooled item table (``nn.Embedding``) looks up every id of it, an unpooled user table the user; the rows, padded to
the longest history, go through one HSTU-style block (pointwise SiLU attention, causal, with the user's row added to
every position), and the candidate is scored against the output at the last history position.

What it does, on every rank:

1. describes the model, built on the meta device: ``describe(..., example_inputs=...)`` runs the forward on meta
   (the block's GEMMs and its attention counted as they run), ``sample_batch=`` measures the item table's ids per
   sample, mean and tail, from a real batch;
2. builds a **mixed** fleet from torchrun's environment: ``WORLD_SIZE`` ranks in hosts of ``--gpus-per-host``, the
   first half of the hosts of the first type ``--gpus`` names, the rest of the second (default: H100 and H200);
3. rank 0 plans with the library call and broadcasts the plan; with ``--export FILE`` it also writes the plan as
   TorchRec's ``ShardingPlan`` for an ``EmbeddingCollection`` of the two tables (``to_torchrec_dict``; TorchRec's own
   row blocks, ``relayout_rows``), or says in one line why TorchRec cannot run it;
4. ``apply_plan`` shards the model (the tables still on the meta device: each rank draws only its own shards), with
   row-wise Adagrad fused into the tables' backward; Adam steps the dense layers;
5. trains ``--steps`` steps on synthetic data (histories of 1..2L−1 items, uniform ids, random click labels): one
   exchange for both tables through ``ShardedEmbeddingBagCollection`` — one row per id back, in order — and rank 0
   prints the loss.

On the CPU the plan is still made for the fleet's GPUs: the layout is valid for any executor of that world size, and
the printed predicted step is what the cost model expects on those GPUs, not on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from shardwise.runtime.apply import apply_plan, param_groups, split_parameters
from shardwise.runtime.describe import describe
from shardwise.runtime.embedding.collection import ShardedEmbeddingBagCollection
from shardwise.runtime.embedding.update import UpdateConfig
from shardwise.wire.spec import FleetSpec, ModelSpec, Plan, SolveParams


@dataclass(frozen=True)
class Config:
    items: int = 200_000
    users: int = 50_000
    dim: int = 32
    history: int = 24  # mean history length L (lengths uniform in 1..2L-1)

    @property
    def max_len(self) -> int:
        """The padded sequence: the longest history and its candidate."""
        return 2 * self.history


# ------------------------------------------------------------------------------------------------ the model


class HSTUBlock(nn.Module):
    """One HSTU-style layer: ``U, V, Q, K = SiLU(x·W)``, attention ``SiLU(Q·Kᵀ)/L`` (causal, padding masked, no
    softmax), output ``x + (LayerNorm(A·V) ⊙ U)·W_o``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        length = x.shape[1]
        u, v, q, k = F.silu(self.uvqk(x)).chunk(4, dim=-1)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        mask = causal.unsqueeze(0) & valid.unsqueeze(1)  # (batch, query, key)
        attention = F.silu(q @ k.transpose(1, 2)) / length * mask.to(x.dtype)
        out: Tensor = x + self.out(self.norm(attention @ v) * u)
        return out


class HSTULike(nn.Module):
    """Item rows of each history (candidate last) and the user's row, one HSTU block, a dot-product score."""

    def __init__(self, cfg: Config, table_device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.sparse = nn.ModuleDict(
            {
                "item": nn.Embedding(cfg.items, cfg.dim, device=table_device),
                "user": nn.Embedding(cfg.users, cfg.dim, device=table_device),
            }
        )
        self.block = HSTUBlock(cfg.dim)

    def embed(self, item_ids: Tensor, user_ids: Tensor) -> dict[str, Tensor]:
        """One row per id: ``(ids, dim)`` for the jagged items, ``(samples, dim)`` for the users."""
        return {"sparse.item": self.sparse["item"](item_ids), "sparse.user": self.sparse["user"](user_ids)}

    def head(self, rows: Mapping[str, Tensor], offsets: Tensor) -> Tensor:
        """Pad the jagged rows to ``max_len``, run the block, score each candidate: one logit per sample."""
        items, users = rows["sparse.item"], rows["sparse.user"]
        samples, n = offsets.numel(), items.shape[0]
        lengths = torch.diff(offsets, append=offsets.new_full((1,), n))
        sample_of = torch.repeat_interleave(torch.arange(samples, device=items.device), lengths, output_size=n)
        position = torch.arange(n, device=items.device) - offsets.index_select(0, sample_of)
        padded = items.new_zeros(samples, self.cfg.max_len, items.shape[1]).index_put((sample_of, position), items)
        valid = torch.arange(self.cfg.max_len, device=items.device).unsqueeze(0) < lengths.unsqueeze(1)
        y = self.block(padded + users.unsqueeze(1), valid)
        last = torch.arange(samples, device=items.device)
        before = y[last, lengths - 2]  # the last history position (the candidate is at lengths - 1)
        candidate = items.index_select(0, offsets + lengths - 1)
        out: Tensor = (before * candidate).sum(-1)
        return out

    def forward(self, item_ids: Tensor, offsets: Tensor, user_ids: Tensor) -> Tensor:
        return self.head(self.embed(item_ids, user_ids), offsets)


# ------------------------------------------------------------------------------------------------ data


Batch = tuple[Tensor, Tensor, Tensor, Tensor]  # item ids (jagged, candidate last), offsets, user ids, labels


def synthetic_batch(cfg: Config, batch: int, generator: torch.Generator) -> Batch:
    """Histories of 1..2L−1 items and a candidate each (uniform ids), a user each, random click labels."""
    lengths = torch.randint(1, 2 * cfg.history, (batch,), generator=generator) + 1  # + the candidate
    ids = torch.randint(0, cfg.items, (int(lengths.sum()),), generator=generator)
    offsets = torch.cumsum(lengths, 0) - lengths
    users = torch.randint(0, cfg.users, (batch,), generator=generator)
    labels = torch.randint(0, 2, (batch,), generator=generator).float()
    return ids, offsets, users, labels


def model_spec(cfg: Config, batch: int) -> ModelSpec:
    """Described on meta: the forward run on a meta copy of a real batch (FLOPs), that batch's ids per sample."""
    ids, offsets, users, _ = synthetic_batch(cfg, batch, torch.Generator().manual_seed(1))
    with torch.device("meta"):
        meta = HSTULike(cfg)
    return describe(
        meta,
        name="hstu-like",
        batch_size_per_gpu=batch,
        example_inputs=(ids, offsets, users),
        sample_batch={"sparse.item": (ids, offsets), "sparse.user": (users, torch.arange(batch))},
        optimizer="rowwise_adagrad",
        dense_optimizer="adam",
    )


# ------------------------------------------------------------------------------------------------ plan


def mixed_fleet(gpus: Sequence[str], per_host: int) -> FleetSpec:
    """torchrun's ranks in hosts of ``per_host`` GPUs: the first half of the hosts ``gpus[0]``, the rest
    ``gpus[-1]``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world % per_host:
        raise SystemExit(f"WORLD_SIZE {world} is not a multiple of --gpus-per-host {per_host}")
    hosts = world // per_host
    first = max(1, hosts // 2) if len(gpus) > 1 else hosts
    groups = [(gpus[0], first)] + ([(gpus[-1], hosts - first)] if hosts > first else [])
    return FleetSpec.model_validate(
        {
            "name": "_".join(f"{n}x{per_host}x{g}" for g, n in groups),
            "hosts": [{"gpu": g, "count": n, "gpus_per_host": per_host} for g, n in groups],
        }
    )


def plan_on_rank0(spec: ModelSpec, fleet: FleetSpec, params: SolveParams) -> Plan:
    """Rank 0 plans, every rank gets the same plan (a collective)."""
    from shardwise.solver.planner import make_plan

    box: list[str | None] = [None]
    if dist.get_rank() == 0:
        box[0] = make_plan(spec, fleet, params).model_dump_json()
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return Plan.model_validate_json(box[0])


def export(plan: Plan, spec: ModelSpec, path: Path) -> str:
    """The plan as TorchRec's ShardingPlan for one ``EmbeddingCollection`` at ``sparse`` (both tables), written to
    ``path``; the line to print."""
    from shardwise.solver.torchrec.exporter import TorchRecExportError, to_torchrec_dict

    try:
        serialized = to_torchrec_dict(plan, spec, module_fqn="sparse", relayout_rows=True)
    except TorchRecExportError as exc:
        return f"TorchRec cannot run this plan: {exc}"
    path.write_text(json.dumps(serialized, indent=1))
    kinds = {name: entry["sharding_type"] for name, entry in serialized["plan"]["sparse"].items()}
    return f"TorchRec plan written to {path}: {kinds}"


# ------------------------------------------------------------------------------------------------ train


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--gpus", default="nvidia-h100-sxm,nvidia-h200", help="the fleet's two GPU types, comma-separated")
    p.add_argument("--gpus-per-host", type=int, default=1)
    p.add_argument("--solver", choices=["cpsat", "greedy"], default="greedy")
    p.add_argument("--time-limit", type=float, default=5.0, help="CP-SAT's time limit, seconds")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--export", type=Path, help="write the plan as TorchRec's ShardingPlan (JSON) here")
    return p.parse_args(argv)


def run(args: argparse.Namespace, rank: int) -> None:
    cfg = Config()
    spec = model_spec(cfg, args.batch_size)
    fleet = mixed_fleet(args.gpus.split(","), args.gpus_per_host)
    plan = plan_on_rank0(spec, fleet, SolveParams(solver=args.solver, time_limit_s=args.time_limit))
    if rank == 0:
        item = spec.table("sparse.item")
        print(f"fleet {fleet.name}; item ids a sample: mean {item.pooling_factor:.1f}, p99 {item.pooling_factor_p99}")
        print(f"plan: {plan.status.value}, predicted step {plan.predicted_step_ms or 0:.3f} ms")
        for t in plan.tables:
            print(f"  {t.name:<12} {t.sharding_type.value:<15} ranks {sorted({s.rank for s in t.shards})}")
        if args.export is not None:
            print(export(plan, spec, args.export))
    torch.manual_seed(args.seed)  # dense layers start equal on every rank
    model = apply_plan(
        HSTULike(cfg, table_device="meta"),
        plan,
        model_spec=spec,
        embedding_optimizer=UpdateConfig(optimizer="rowwise_adagrad", lr=0.05),
        init_fns=lambda w: nn.init.uniform_(w, -0.05, 0.05),
    )
    assert isinstance(model, HSTULike)
    ebc = ShardedEmbeddingBagCollection.from_module(model)
    _, dense = split_parameters(model)
    opt = torch.optim.Adam(param_groups(dense), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)  # each rank its own data
    for step in range(args.steps):
        ids, offsets, users, labels = synthetic_batch(cfg, args.batch_size, gen)
        rows = ebc({"sparse.item": (ids, offsets), "sparse.user": users})  # one exchange, a row per id
        loss = F.binary_cross_entropy_with_logits(model.head(rows, offsets), labels)
        loss.backward()  # the tables are updated in here
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step}: loss {mean.item() / dist.get_world_size():.4f}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun, e.g. torchrun --standalone --nproc-per-node 2 examples/train_hstu.py")
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    try:
        run(args, dist.get_rank())
    finally:  # every rank past its last collective, the model collected, before the group goes (train_dlrm.py)
        with contextlib.suppress(Exception):
            dist.barrier()
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
