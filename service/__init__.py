"""The shardwise service: FastAPI app, storage, job runners and web pages (the ``server`` extra)."""
