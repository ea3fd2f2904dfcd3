"""What a job script imports to talk to a server: the HTTP client (``client``, ``transport``, ``errors``) and the
``shardwise`` CLI (``cli`` and its command modules).

The base install: they stand on the wire contract (``shardwise.wire``) alone and never import torch or Triton, not
even lazily (an import-linter contract). The CLI's local commands load the solver when they run; ``shardwise
calibrate`` is registered by ``shardwise.calibrate`` through the ``shardwise.commands`` entry point. The torch side
(``describe``, ``apply_plan``) is ``shardwise.runtime``.
"""
