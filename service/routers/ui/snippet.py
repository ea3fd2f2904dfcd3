"""The plan page's "Apply it" snippet: the few lines of a training script that fetch this plan and shard a model
with it, written against the package's public API (``from shardwise import ...``; a name ``shardwise/__init__.py``
does not export would come from its module path, e.g. ``shardwise.runtime.apply``).

Only text: the service never imports the client side (``shardwise.clients``); tests/service/ui parses the snippet and
checks its imports against ``shardwise.__all__`` and its call against the real ``apply_plan``.
"""

from __future__ import annotations

from shardwise.wire.spec import Plan


def snippet(base_url: str, plan: Plan) -> str:
    """Python that applies ``plan`` (fetched from the service at ``base_url``) on every rank of a torchrun job."""
    world = len(plan.ranks)
    return f"""import os

import torch
import torch.distributed as dist

from shardwise import ShardwiseClient, apply_plan

# launch with torchrun: one process per rank of the plan ({world} in all)
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
plan = ShardwiseClient("{base_url}").get_plan("{plan.id}")
model = build_model()  # your nn.Module, its tables and dense layers named as in the plan
model = apply_plan(model, plan)  # shards it in place on this rank's GPU
"""
