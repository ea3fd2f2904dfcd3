"""The HTTP half of ``ShardwiseClient``: one call to the service, retried, answered as a typed result or error.

``BaseClient`` holds the connection (server root, token, timeouts, the ``httpx.Client`` and whether it owns it) and
``_request``: connection errors, timeouts and HTTP 408/429/5xx are retried up to ``max_retries`` extra times with
exponential backoff (0.5 s doubling to 8 s, minus up to 25 % jitter), or after the server's ``Retry-After``
(``parse_retry_after``: seconds or an HTTP date, capped at 60 s) when it sends one; every POST carries an
``Idempotency-Key``, the same on each retry of one call. An error answer becomes the typed error of
``shardwise.clients.errors`` (``_problem_of`` reads its RFC 9457 body, or makes one up); ``_parse`` validates a
success answer into a wire model, and ``_page``/``_iterate`` walk any paged list (``GET /plans``, ``/models``...).
``shardwise.clients.client.ShardwiseClient`` adds the resources on top: one method per call of the API.

Import-light, like the client: httpx, pydantic and the wire models.
"""

from __future__ import annotations

import email.utils
import math
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, date, datetime
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from shardwise.clients.errors import (
    PlannerConnectionError,
    PlannerResponseError,
    PlannerTimeoutError,
    error_from_problem,
)
from shardwise.wire.resources import Page, Problem
from shardwise.wire.spec import PlanStatus

DEFAULT_BASE_URL: Final = "http://127.0.0.1:8000"
API_PREFIX: Final = "/api/v1"
DEFAULT_TIMEOUT: Final = httpx.Timeout(30, connect=5)
DEFAULT_MAX_RETRIES: Final = 2
INITIAL_RETRY_DELAY_S: Final = 0.5
MAX_RETRY_DELAY_S: Final = 8.0
MAX_RETRY_AFTER_S: Final = 60.0  # a Retry-After longer than this is waited for this long, then asked again
JITTER: Final = 0.25  # a backoff delay is shortened by up to this fraction, so that clients spread out

RETRY_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})
#: transport failures worth another try: the request may not have reached the server, or the answer was lost
_RETRY_TRANSPORT: Final = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError)

M = TypeVar("M", bound=BaseModel)


def parse_retry_after(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Seconds the server asks us to wait (``Retry-After-Ms``, or ``Retry-After`` in seconds or as an HTTP date),
    or None when it did not ask (or the value cannot be read). Never negative, never above ``MAX_RETRY_AFTER_S``."""
    seconds: float | None = None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            seconds = float(ms) / 1000
        except ValueError:
            seconds = None
    value = headers.get("retry-after")
    if seconds is None and value is not None:
        value = value.strip()
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError):
                return None
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _problem_of(response: httpx.Response) -> Problem:
    """The RFC 9457 body of an error answer, or one made up from the status line when the body is not one
    (a proxy's HTML page, an empty 502)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        data = dict(body)
        data.setdefault("title", response.reason_phrase or f"HTTP {response.status_code}")
        data.setdefault("status", response.status_code)
        detail = data.get("detail")
        if isinstance(detail, list):  # FastAPI's default 422 body, {"detail": [{loc, msg, type}]}: the errors
            data.setdefault("errors", detail)
            data["detail"] = None
        elif detail is not None and not isinstance(detail, str):
            data["detail"] = str(detail)
        try:
            return Problem.model_validate(data)
        except ValidationError:
            pass
    text = response.text.strip() if response.content else ""
    return Problem(
        title=response.reason_phrase or f"HTTP {response.status_code}",
        status=response.status_code,
        detail=" ".join(text.split())[:200] or None,
    )


def _query_value(value: object) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, PlanStatus):
        return value.value
    return str(value)


class BaseClient:
    """The connection and the retrying request under ``ShardwiseClient`` (which documents the arguments and checks
    them before calling this constructor)."""

    def __init__(
        self,
        base_url: str | None,
        *,
        token: str | None,
        timeout: float | httpx.Timeout,
        max_retries: int,
        http_client: httpx.Client | None,
    ) -> None:
        self.max_retries = max_retries
        self.token = token if token is not None else (os.environ.get("SHARDWISE_TOKEN") or None)

        client_base = str(http_client.base_url).rstrip("/") if http_client is not None else ""
        relative = bool(client_base) and base_url is None
        root = client_base if relative else (base_url or os.environ.get("SHARDWISE_URL") or DEFAULT_BASE_URL)
        root = root.rstrip("/")
        if root.endswith(API_PREFIX):
            root = root[: -len(API_PREFIX)]
            relative = False  # the injected client's base already holds /api/v1: send absolute URLs instead
        self.base_url = root
        #: prefix of every request URL: the absolute root, or "" when the injected client resolves relative paths
        self._root = "" if relative else root

        if http_client is None:
            self.timeout = httpx.Timeout(timeout)
            self._http = httpx.Client(timeout=self.timeout, headers={"User-Agent": "shardwise-python"})
            self._owns_http = True
        else:
            self.timeout = http_client.timeout if timeout is DEFAULT_TIMEOUT else httpx.Timeout(timeout)
            self._http = http_client
            self._owns_http = False

        # seams for tests: replace to record delays instead of sleeping, or to fix the jitter and the clock
        self._sleep: Callable[[float], None] = time.sleep
        self._random: Callable[[], float] = random.random
        self._monotonic: Callable[[], float] = time.monotonic

    # ------------------------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Close the HTTP connection pool, if this client created it (an injected one is the caller's)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- internals: HTTP

    def _url(self, path: str, api: bool = True) -> str:
        return self._root + (API_PREFIX if api else "") + path

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json, application/problem+json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff for retry ``attempt`` (0 = the first retry): 0.5, 1, 2, 4, 8, 8... s, less jitter."""
        base = min(INITIAL_RETRY_DELAY_S * 2.0**attempt, MAX_RETRY_DELAY_S)
        return base * (1 - JITTER * self._random())

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        api: bool = True,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send one call, retrying what may succeed on another try; a success answer (a 304 included), or the typed
        error. ``headers`` are added to the client's own."""
        url = self._url(path, api)
        headers = {**self._headers(), **(headers or {})}
        if method == "POST":
            headers["Idempotency-Key"] = str(uuid.uuid4())  # one key for every try of this call
        what = f"{method} {url}"
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, url, json=json, params=params, headers=headers, timeout=timeout or self.timeout
                )
            except _RETRY_TRANSPORT as exc:
                if attempt < self.max_retries:
                    self._sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                tries = f"after {attempt + 1} tries" if attempt else "(no retries)"
                if isinstance(exc, httpx.TimeoutException):
                    raise PlannerTimeoutError(f"{what} timed out {tries}: {type(exc).__name__}") from exc
                raise PlannerConnectionError(f"{what} failed {tries}: {exc or type(exc).__name__}") from exc
            except httpx.TransportError as exc:  # not worth a retry: a bad URL, an unsupported scheme
                raise PlannerConnectionError(f"{what} failed: {exc or type(exc).__name__}") from exc

            if response.status_code in RETRY_STATUSES and attempt < self.max_retries:
                after = parse_retry_after(response.headers)
                response.close()
                self._sleep(self._backoff(attempt) if after is None else after)
                attempt += 1
                continue
            if response.is_error:
                raise error_from_problem(response.status_code, _problem_of(response))
            return response

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise PlannerResponseError(
                f"{response.request.method} {response.request.url}: the answer is not JSON", status=response.status_code
            ) from exc

    def _parse(self, model: type[M], response: httpx.Response) -> M:
        body = self._json(response)
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise self._bad_body(response, exc) from exc

    @staticmethod
    def _bad_body(response: httpx.Response, exc: ValidationError) -> PlannerResponseError:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        return PlannerResponseError(
            f"{response.request.method} {response.request.url}: unexpected answer ({loc}: {first['msg']}); "
            "are the client and server versions compatible?",
            status=response.status_code,
        )

    # ------------------------------------------------------------------------------------------- internals: pages

    def _page(self, item: type[M], path: str, page: int, limit: int, filters: Mapping[str, object]) -> Page[M]:
        params = {"page": str(page), "limit": str(limit)}
        params.update({k: _query_value(v) for k, v in filters.items() if v is not None})
        return self._parse(Page[item], self._request("GET", path, params=params))  # type: ignore[valid-type]

    def _iterate(
        self,
        item: type[M],
        path: str,
        page_size: int,
        filters: Mapping[str, object],
        key: Callable[[M], object],
    ) -> Iterator[M]:
        """Pages 1..max_page, lazily. Rows that a new insert pushed onto the next page are not yielded twice."""
        seen: set[object] = set()
        page = 1
        while True:
            result = self._page(item, path, page, page_size, filters)
            for row in result.items:
                k = key(row)
                if k not in seen:
                    seen.add(k)
                    yield row
            if not result.items or page >= result.pagination.max_page:
                return
            page += 1
