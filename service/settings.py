"""Service settings, read from ``SHARDWISE_*`` environment variables (and a ``.env`` file when present).

The database and broker URLs may carry a password: ``redact_url`` and ``redact`` hide it wherever a URL is shown
(the start-up line, ``repr(settings)``, every log record through the log formatter).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# scheme://user:password@host -> scheme://user:***@host (also a password with no user: scheme://:password@host)
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@?#]*:)(?P<password>[^\s/?#]+)(?=@)")


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(lambda m: m["head"] + "***", text)


def redact_url(url: str | None) -> str:
    """A URL for display: its password (if any) replaced by ``***``."""
    return redact(url) if url else ""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SHARDWISE_", env_file=".env", env_ignore_empty=True, extra="ignore")

    database_url: str = Field(
        default="sqlite:///./shardwise.db", description="SQLAlchemy URL; postgresql://... for PostgreSQL"
    )
    api_tokens: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="comma-separated bearer tokens; when set, writes need one"
    )
    auth_reads: bool = Field(default=False, description="reads need a token too (when tokens are set)")
    session_secret: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="signs the pages' session cookies; unset, a key derived from the API tokens (changing them then "
        "ends every session)",
    )
    session_max_age_s: int = Field(
        default=8 * 3600, ge=60, le=30 * 24 * 3600, description="how long a page login lasts (the cookie's Max-Age)"
    )
    session_cookie_secure: bool = Field(
        default=False,
        description="mark the pages' cookies Secure even when the request came over http (a TLS proxy that does not "
        "say https); over https they are Secure anyway",
    )

    # caps on what one request may ask for
    max_tables: int = Field(default=5000, ge=1)
    max_ranks: int = Field(default=4096, ge=1)
    max_time_limit_s: float = Field(default=600.0, gt=0)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="seconds a request may take to send its whole body; past them, 408 and the connection closed",
    )
    max_page_size: int = Field(default=200, ge=1)

    # jobs
    wait_s: float = Field(default=10.0, ge=0, description="default seconds a POST /plans waits before 202")
    request_threads: int = Field(default=200, ge=1, description="threads serving requests (waiting ones included)")
    plan_threads: int = Field(
        default=4,
        ge=1,
        description="threads that parse, validate and look up POST /plans bodies at once, of the request threads "
        "(more would only contend for the interpreter lock with the event loop that answers the probes)",
    )
    job_workers: int = Field(
        default=1, ge=1, description="local solver processes (the embedded runner), in each server process"
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="server processes `shardwise serve` starts (uvicorn --workers), sharing the port and the database",
    )
    plan_cache_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0, description="stored plans each server process keeps rendered (0: none)"
    )
    plan_cache_s: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="how long a rendered plan is answered before the database is asked again (a deletion in another "
        "server process is seen after this long)",
    )
    broker_url: str | None = Field(default=None, description="Celery broker; jobs run on workers when set")
    job_lease_s: float = Field(
        default=30.0,
        gt=0,
        description="a running job whose row was not touched for this long has lost its holder: it is ended (or, on "
        "Celery, queued again); the API and the workers must agree on it",
    )

    log_json: bool = Field(default=True, description="one JSON object per log line")
    log_level: str = "INFO"

    @field_validator("api_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            return [t.strip() for t in value.split(",") if t.strip()]
        return value

    @field_validator("database_url")
    @classmethod
    def _normalise_driver(cls, value: str) -> str:
        # one PostgreSQL driver (psycopg 3) whatever spelling the user gives
        for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
            if value.startswith(prefix):
                return "postgresql+psycopg://" + value[len(prefix) :]
        return value

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name in {"database_url", "broker_url"} and value else value

    def token_values(self) -> list[str]:
        return [t.get_secret_value() for t in self.api_tokens]
