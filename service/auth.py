"""Bearer tokens. With ``SHARDWISE_API_TOKENS`` unset the API is open; set, every write needs a token (and every
read too when ``SHARDWISE_AUTH_READS`` is true). Tokens are compared in constant time and never logged."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shardwise.service.errors import Unauthorized
from shardwise.service.settings import Settings

bearer = HTTPBearer(auto_error=False, description="one of the tokens in SHARDWISE_API_TOKENS")


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None, *, write: bool) -> None:
    settings: Settings = request.app.state.settings
    tokens = settings.token_values()
    if not tokens or (not write and not settings.auth_reads):
        return
    given = credentials.credentials.encode() if credentials else b""
    ok = False
    for token in tokens:  # every token compared, whichever matches
        ok |= hmac.compare_digest(given, token.encode())
    if not ok:
        raise Unauthorized(
            "this request needs a valid bearer token" if credentials is None else "the bearer token is not valid",
            headers={"WWW-Authenticate": 'Bearer realm="shardwise"'},
        )


def require_write(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    _check(request, credentials, write=True)


def require_read(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    _check(request, credentials, write=False)


WriteAccess = Depends(require_write)
ReadAccess = Depends(require_read)
