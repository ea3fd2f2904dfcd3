"""What job scripts import: the HTTP client, the CLI, and the torch side (describe a module, apply a plan).

The client and the CLI stand on the wire contract (``shardwise.wire``) alone; torch is imported by the torch-side
modules (``describe``, ``apply``, ``sharded_embedding``), never by the client or the CLI.
"""
