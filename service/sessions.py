"""Browser sessions for the pages: a token exchanged for a signed cookie, and the CSRF rules for the pages' forms.

The API keeps its bearer tokens (``auth.py``); a browser cannot send those, so ``/ui/login`` takes one of the same
tokens once and answers with a session cookie:

* ``shardwise_session`` = ``v1.<payload>.<signature>``: the payload (base64url JSON) holds a random session id, the
  expiry (``exp``, Unix seconds) and a fingerprint of the token it was made from; the signature is HMAC-SHA256 under
  the session key. Nothing is stored server-side. A session is good while the signature holds, ``exp`` is ahead and
  the fingerprint is that of a token still in ``SHARDWISE_API_TOKENS`` (dropping a token ends its sessions).
* The session key is ``SHARDWISE_SESSION_SECRET`` when set, else derived from the tokens themselves, so every
  server process and replica agrees on it without another secret to share (changing the tokens then ends every
  session).
* Cookies are ``HttpOnly``, ``SameSite=Strict``, ``Path=/``, with a ``Max-Age`` (``SHARDWISE_SESSION_MAX_AGE_S``),
  and ``Secure`` when the request came over https (``uvicorn --proxy-headers`` takes that from a trusted proxy) or
  ``SHARDWISE_SESSION_COOKIE_SECURE`` is true.

A session authorises page reads and the pages' own forms, and API *reads* (the plan page links to the plan's JSON);
never an API write, which needs the bearer header whatever cookie comes with it.

CSRF: every state-changing form carries the per-session token (``csrf_token``, an HMAC of the session id) in a hidden
field, checked in constant time; before a login (the login form itself, and every form of an open service) the
token is a random value kept in the ``shardwise_csrf`` cookie (double submit). A POST whose ``Origin`` is another
origin, or whose ``Sec-Fetch-Site`` says it came from another site, is refused before the token is even looked at.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import Request
from starlette.responses import Response

from shardwise.service.settings import Settings

SESSION_COOKIE: Final = "shardwise_session"
CSRF_COOKIE: Final = "shardwise_csrf"  # the pre-login (or open service) form token
CSRF_FIELD: Final = "csrf_token"
FORM_TYPE: Final = "application/x-www-form-urlencoded"
MAX_FORM_FIELDS: Final = 16
_VERSION: Final = "v1"
_NONCE_CHARS: Final = frozenset("0123456789abcdef")


class CsrfRefused(Exception):
    """A state-changing form request that did not prove it came from this service's own page (answered 403)."""


class BadForm(ValueError):
    """A form body the pages cannot read (answered 400)."""


@dataclass(frozen=True)
class Session:
    sid: str
    exp: int
    csrf: str


def session_key(settings: Settings) -> bytes | None:
    """The key that signs session cookies; ``None`` when the service has no tokens (there is nothing to log in to)."""
    tokens = settings.token_values()
    if not tokens:
        return None
    if settings.session_secret is not None:
        secret = settings.session_secret.get_secret_value().encode()
        return hashlib.sha256(b"shardwise-session-v1\x00" + secret).digest()
    joined = "\x00".join(sorted(tokens)).encode()
    return hmac.new(b"shardwise-session-v1", joined, hashlib.sha256).digest()


def _mac(key: bytes, label: bytes, value: str) -> str:
    return hmac.new(key, label + b"\x00" + value.encode(), hashlib.sha256).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def matching_token(settings: Settings, given: str) -> str | None:
    """The configured token equal to ``given`` (every token compared, in constant time), or ``None``."""
    found: str | None = None
    for token in settings.token_values():
        if hmac.compare_digest(given.encode(), token.encode()):
            found = token
    return found


def new_session_cookie(settings: Settings, token: str, now: float | None = None) -> str:
    """A signed cookie value for a session made from ``token`` (one of the configured tokens)."""
    key = session_key(settings)
    if key is None:
        raise ValueError("the service has no tokens: there are no sessions")
    payload = {
        "sid": secrets.token_hex(16),
        "exp": int(now if now is not None else time.time()) + settings.session_max_age_s,
        "tok": _mac(key, b"token", token)[:32],
    }
    body = f"{_VERSION}.{_b64(json.dumps(payload, separators=(',', ':')).encode())}"
    return f"{body}.{_mac(key, b'cookie', body)}"


def read_session(settings: Settings, cookie: str | None, now: float | None = None) -> Session | None:
    """The session a cookie value holds, or ``None`` when it is absent, malformed, forged, expired or made from a
    token the service no longer has."""
    key = session_key(settings)
    if key is None or not cookie or len(cookie) > 512:
        return None
    body, _, signature = cookie.rpartition(".")
    version, _, encoded = body.partition(".")
    if version != _VERSION or not hmac.compare_digest(signature.encode(), _mac(key, b"cookie", body).encode()):
        return None
    try:
        payload = json.loads(_unb64(encoded))
        sid, exp, fingerprint = str(payload["sid"]), int(payload["exp"]), str(payload["tok"])
    except (binascii.Error, ValueError, TypeError, KeyError):
        return None
    if exp <= (now if now is not None else time.time()):
        return None
    known = [_mac(key, b"token", t)[:32] for t in settings.token_values()]
    if not any(hmac.compare_digest(fingerprint.encode(), k.encode()) for k in known):
        return None
    return Session(sid=sid, exp=exp, csrf=_mac(key, b"csrf", sid))


def request_session(request: Request) -> Session | None:
    """The valid session of this request's cookie, if any."""
    settings: Settings = request.app.state.settings
    return read_session(settings, request.cookies.get(SESSION_COOKIE))


def _anonymous_nonce(request: Request) -> str | None:
    value = request.cookies.get(CSRF_COOKIE, "")
    return value if len(value) == 64 and set(value) <= _NONCE_CHARS else None


@dataclass(frozen=True)
class FormToken:
    """The CSRF token a page's forms carry, and the cookie to set when the browser has none yet."""

    value: str
    new_cookie: str | None = None


def form_token(request: Request) -> FormToken:
    """The token for this request's forms: the session's, else the browser's pre-login one (made when missing)."""
    session = request_session(request)
    if session is not None:
        return FormToken(session.csrf)
    nonce = _anonymous_nonce(request)
    if nonce is not None:
        return FormToken(nonce)
    nonce = secrets.token_hex(32)
    return FormToken(nonce, new_cookie=nonce)


def _secure(request: Request) -> bool:
    settings: Settings = request.app.state.settings
    return settings.session_cookie_secure or request.url.scheme == "https"


def set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    settings: Settings = request.app.state.settings
    response.set_cookie(
        name,
        value,
        max_age=settings.session_max_age_s,
        path="/",
        secure=_secure(request),
        httponly=True,
        samesite="strict",
    )


def clear_cookie(request: Request, response: Response, name: str) -> None:
    response.delete_cookie(name, path="/", secure=_secure(request), httponly=True, samesite="strict")


def own_origins(request: Request) -> set[str]:
    """This service's origin as the request reached it (scheme and ``Host``), and its https twin when the cookies are
    marked Secure by setting (a TLS proxy that does not say https: the browser's ``Origin`` is https then)."""
    settings: Settings = request.app.state.settings
    own = urlsplit(str(request.base_url))
    origins = {f"{own.scheme}://{own.netloc}".lower()}
    if settings.session_cookie_secure:
        origins.add(f"https://{own.netloc}".lower())
    return origins


def check_same_origin(request: Request) -> None:
    """Refuse a request a browser says came from another site or origin (``Sec-Fetch-Site``, ``Origin``)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise CsrfRefused(f"the form was sent from another site (Sec-Fetch-Site: {site[:20]})")
    origin = request.headers.get("origin")
    if origin is not None and origin.lower() not in own_origins(request):
        raise CsrfRefused("the form was sent from another origin")


def check_csrf(request: Request, fields: dict[str, str]) -> None:
    """The whole CSRF rule for a form POST: same origin, and the hidden token equal to this browser's."""
    check_same_origin(request)
    session = request_session(request)
    expected = session.csrf if session is not None else _anonymous_nonce(request)
    given = fields.get(CSRF_FIELD, "")
    if expected is None or not given or not hmac.compare_digest(given.encode(), expected.encode()):
        raise CsrfRefused("the form's security token is missing or stale: reload the page and try again")


async def read_form(request: Request) -> dict[str, str]:
    """A URL-encoded form body as one value per field (the last one wins), at most ``MAX_FORM_FIELDS`` fields."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != FORM_TYPE:
        raise BadForm(f"this form is sent as {FORM_TYPE}")
    raw = await request.body()
    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise BadForm("the form's body is not readable") from None
    return dict(pairs)


def safe_next(target: str | None, root: str = "") -> str:
    """Where to go after logging in: a path on this service (never another host), else the plan history."""
    fallback = f"{root}/ui/plans"
    if not target or len(target) > 2000 or not target.startswith("/") or target.startswith(("//", "/\\")):
        return fallback
    if any(c in target for c in "\\\r\n\t\x00") or urlsplit(target).netloc:
        return fallback
    return target
