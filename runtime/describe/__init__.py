"""Describe a real ``nn.Module`` as a shardwise ``ModelSpec``, without allocating its weights (``describe``)."""

from __future__ import annotations

from shardwise.runtime.describe.spec import describe, zipf_exponent

__all__ = ["describe", "zipf_exponent"]
