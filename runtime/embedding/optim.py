"""Row-wise Adagrad as a torch optimizer, for the tables' row-sparse gradients (the executor's compatible mode).

With the optimizer in backward (``apply_plan(..., embedding_optimizer=...)``) the same update runs fused into
backward instead (:mod:`shardwise.runtime.embedding.update`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["RowWiseAdagrad"]


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad (the wire's ``rowwise_adagrad``) for 2-D parameters, sparse or dense gradients.

    One fp32 accumulator per row (``r·4`` B of state): ``s[i] += mean_j g[i, j]²``,
    ``w[i] -= lr · g[i] / (√s[i] + eps)``, applied to the touched rows only when the gradient is sparse (an
    untouched row's update is zero either way, so sparse and dense gradients give the same weights). On a
    column_wise shard the mean runs over the shard's columns (one accumulator per row and column slice, as
    FBGEMM's fused kernels keep it), so it is not the unsharded table's update; SGD, Adagrad and SparseAdam are.
    """

    def __init__(self, params: Any, lr: float = 0.01, eps: float = 1e-10) -> None:
        if lr <= 0 or eps < 0:
            raise ValueError("lr must be positive and eps non-negative")
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() != 2:
                    raise ValueError("RowWiseAdagrad takes 2-D parameters (embedding tables)")
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
                acc: Tensor = state["sum"]
                g = p.grad
                if g.is_sparse:
                    g = g.coalesce()
                    rows, values = g.indices()[0], g.values().float()
                    acc.index_add_(0, rows, values.pow(2).mean(dim=1))
                    scale = acc.index_select(0, rows).sqrt_().add_(eps)
                    p.index_add_(0, rows, (values / scale.unsqueeze(1) * -lr).to(p.dtype))
                else:
                    g32 = g.float()
                    acc.add_(g32.pow(2).mean(dim=1))
                    p.add_((g32 / (acc.sqrt() + eps).unsqueeze(1) * -lr).to(p.dtype))
        return loss
