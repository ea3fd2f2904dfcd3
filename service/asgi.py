"""The ASGI entry point for servers: ``uvicorn --factory shardwise.service.asgi:app_from_env`` (settings from the
environment, ``SHARDWISE_*``). ``shardwise serve`` migrates the database first, then runs this."""

from __future__ import annotations

from fastapi import FastAPI

from shardwise.service.app import create_app


def app_from_env() -> FastAPI:
    return create_app()
