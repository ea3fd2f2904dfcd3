"""Bearer tokens. With ``SHARDWISE_API_TOKENS`` unset the API is open; set, every write needs a token (and every
read too when ``SHARDWISE_AUTH_READS`` is true). Tokens are compared in constant time and never logged.

A browser logged in at ``/ui/login`` (``sessions.py``) holds a session cookie instead: it stands for a token on
reads (the pages, and the API's GETs the pages link to) but never on an API write, which takes the bearer header
only. The pages answer a read that needs a login with a redirect to it (``LoginRequired``), not a 401.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shardwise.service.errors import Unauthorized
from shardwise.service.sessions import matching_token, request_session
from shardwise.service.settings import Settings

bearer = HTTPBearer(auto_error=False, description="one of the tokens in SHARDWISE_API_TOKENS")


class LoginRequired(Exception):
    """A page that needs a login: answered with a redirect to ``/ui/login?next=<target>`` (this page's path and
    query when ``target`` is ``None``)."""

    def __init__(self, target: str | None = None) -> None:
        super().__init__("this page needs a login")
        self.target = target


def _needed(request: Request, *, write: bool) -> bool:
    settings: Settings = request.app.state.settings
    return bool(settings.token_values()) and (write or settings.auth_reads)


def _bearer_ok(request: Request, credentials: HTTPAuthorizationCredentials | None) -> bool:
    settings: Settings = request.app.state.settings
    return matching_token(settings, credentials.credentials if credentials else "") is not None


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None, *, write: bool) -> None:
    if not _needed(request, write=write) or _bearer_ok(request, credentials):
        return
    if not write and request_session(request) is not None:  # a page login reads; it never writes through the API
        return
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


def page_access(request: Request, *, write: bool) -> bool:
    """Whether this request may read (or, through a page's form, change) what the pages show: the service is open
    for it, or the request has a valid bearer token or a page session."""
    if not _needed(request, write=write) or request_session(request) is not None:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    settings: Settings = request.app.state.settings
    return scheme.lower() == "bearer" and matching_token(settings, given.strip()) is not None


def require_page_read(request: Request) -> None:
    if not page_access(request, write=False):
        raise LoginRequired


WriteAccess = Depends(require_write)
ReadAccess = Depends(require_read)
PageReadAccess = Depends(require_page_read)
