"""The plan page's "Apply it" snippet: the few lines of a training script that fetch this plan and shard a model
with it, written against the package's public API (``from shardwise import ...``; a name ``shardwise/__init__.py``
does not export would come from its module path, e.g. ``shardwise.runtime.apply``).

Only text: the service never imports the client side (``shardwise.clients``); tests/service/ui parses the snippet and
checks its imports against ``shardwise.__all__`` and its call against the real ``apply_plan``.
"""

from __future__ import annotations

from shardwise.wire.spec import Plan


def snippet(base_url: str, plan: Plan, model_ref: str | None = None) -> str:
    """Python that applies ``plan`` (fetched from the service at ``base_url``) on every rank of a torchrun job, with
    the model the plan was made for as ``model_spec`` (it checks the plan against the model and sizes the caches'
    spill reserve): fetched from the service where the request named a registered model (``model_ref``), else read
    from the file the user planned with."""
    world = len(plan.ranks)
    if model_ref is not None:
        imports = "from shardwise import ShardwiseClient, apply_plan"
        spec = f'spec = client.get_model("{model_ref}").spec  # the model the plan was made for'
    else:
        imports = "from pathlib import Path\n\nfrom shardwise import ModelSpec, ShardwiseClient, apply_plan"
        spec = 'spec = ModelSpec.model_validate_json(Path("model.json").read_text())  # the model you planned with'
    return f"""import os

import torch
import torch.distributed as dist

{imports}

# launch with torchrun: one process per rank of the plan ({world} in all)
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
client = ShardwiseClient("{base_url}")
plan = client.get_plan("{plan.id}")
{spec}
model = build_model()  # your nn.Module, its tables and dense layers named as in the plan
model = apply_plan(model, plan, model_spec=spec)  # checks the plan against the model, shards it in place
"""
