"""What ``ShardwiseClient`` raises: one class per way a call can fail, each with a one-line ``str()``.

::

    PlannerError
    ├── PlannerConnectionError      the server could not be reached (after the retries)
    ├── PlannerTimeoutError         a request, or the wait for a job, ran out of time (``.job``: the last state seen)
    ├── PlannerResponseError        a 2xx answer that is not the documented body (client/server version skew)
    └── PlannerAPIError             an HTTP error answer: ``.status``, ``.problem`` (RFC 9457), ``.job_id``
        ├── BadRequestError         400
        ├── AuthenticationError     401, 403
        ├── PlanNotFoundError       404 (any resource: plan, job, model, fleet, profile; alias NotFoundError)
        ├── ConflictError           409
        ├── PayloadTooLargeError    413
        ├── ValidationFailedError   422 /problems/validation (``.errors``: [{loc, msg, type}])
        ├── PlanInfeasibleError     422 /problems/infeasible (``.explanation``, ``.plan_id``, ``.plan``)
        ├── RateLimitError          429
        └── ServerError             5xx

A failed job raises the same classes, built from the job's ``error`` problem object (``.job_id`` set).
Imports pydantic and the wire models only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from shardwise.wire.resources import Problem
from shardwise.wire.spec import Plan

if TYPE_CHECKING:
    from shardwise.wire.resources import Job

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PlanInfeasibleError",
    "PlanNotFoundError",
    "PlannerAPIError",
    "PlannerConnectionError",
    "PlannerError",
    "PlannerResponseError",
    "PlannerTimeoutError",
    "RateLimitError",
    "ServerError",
    "ValidationFailedError",
    "error_from_problem",
]

INFEASIBLE_TYPE = "/problems/infeasible"
VALIDATION_TYPE = "/problems/validation"


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


class PlannerError(Exception):
    """Base of every error the client raises."""


class PlannerConnectionError(PlannerError):
    """The server could not be reached, or the connection broke mid-answer (after the retries)."""


class PlannerTimeoutError(PlannerError):
    """A request timed out (after the retries), or a job did not finish within ``timeout_s``.

    ``job`` is the job's last state when waiting for one timed out: resume with ``client.wait_for(err.job.id)``.
    """

    def __init__(self, message: str, *, job: Job | None = None) -> None:
        super().__init__(message)
        self.job = job


class PlannerResponseError(PlannerError):
    """A success answer whose body is not what the contract says (usually a client/server version skew)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PlannerAPIError(PlannerError):
    """The server answered with an error: ``status`` and the RFC 9457 ``problem`` it sent."""

    def __init__(self, status: int, problem: Problem, *, job_id: str | None = None) -> None:
        self.status = status
        self.problem = problem
        self.job_id = job_id
        super().__init__(self._message())

    def _message(self) -> str:
        title = self.problem.title or "error"
        detail = self.problem.detail
        text = f"{self.status} {title}" + (f": {detail}" if detail and detail != title else "")
        if self.job_id:
            text += f" (job {self.job_id})"
        return _one_line(text)

    @property
    def type(self) -> str:
        return self.problem.type

    @property
    def title(self) -> str:
        return self.problem.title

    @property
    def detail(self) -> str | None:
        return self.problem.detail

    def extension(self, name: str, default: Any = None) -> Any:
        """An extension member of the problem (``errors``, ``explanation``, ``plan_id``...)."""
        extra = self.problem.model_extra or {}
        return extra.get(name, default)


class BadRequestError(PlannerAPIError):
    """400: the request could not be understood."""


class AuthenticationError(PlannerAPIError):
    """401/403: no token, a wrong token, or a token that may not do this."""


class PlanNotFoundError(PlannerAPIError):
    """404: no such plan (or job, model, fleet, profile: the name says plan because plans are the usual case)."""


NotFoundError = PlanNotFoundError


class ConflictError(PlannerAPIError):
    """409: clashes with what is stored (a profile of that name, an idempotency key reused with another body)."""


class PayloadTooLargeError(PlannerAPIError):
    """413: the request body is over the server's limit."""


class ValidationFailedError(PlannerAPIError):
    """422 ``/problems/validation``: the server refused the input; ``errors`` = ``[{loc, msg, type}, ...]``."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        value = self.extension("errors", [])
        return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []

    def _message(self) -> str:
        text = super()._message()
        errors = self.errors
        if errors and not self.problem.detail:
            first = errors[0]
            loc = ".".join(str(p) for p in first.get("loc", [])) or "<root>"
            more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
            text = f"{text}: {loc}: {first.get('msg', '')}{more}"
        return _one_line(text)


class PlanInfeasibleError(PlannerAPIError):
    """422 ``/problems/infeasible``: the model does not fit the fleet. The plan is an answer, not a crash:

    ``explanation`` says which resource is short and by how much, ``plan_id`` is the stored infeasible plan,
    ``plan`` the plan itself when the server sent it.
    """

    def __init__(self, status: int, problem: Problem, *, job_id: str | None = None) -> None:
        raw_plan = (problem.model_extra or {}).get("plan")
        self.plan: Plan | None = None
        if isinstance(raw_plan, Mapping):
            try:
                self.plan = Plan.model_validate(raw_plan)
            except ValidationError:
                self.plan = None
        explanation = (problem.model_extra or {}).get("explanation")
        if isinstance(explanation, list):
            self.explanation: list[str] = [str(line) for line in explanation]
        else:
            self.explanation = list(self.plan.explanation) if self.plan else []
        plan_id = (problem.model_extra or {}).get("plan_id") or (self.plan.id if self.plan else None)
        self.plan_id: str | None = str(plan_id) if plan_id else None
        super().__init__(status, problem, job_id=job_id)

    def _message(self) -> str:
        text = super()._message()
        if self.explanation and not self.problem.detail:
            text = f"{text}: {self.explanation[0]}"
        return _one_line(text)


class RateLimitError(PlannerAPIError):
    """429: too many requests (after the retries)."""


class ServerError(PlannerAPIError):
    """5xx: the server failed (after the retries)."""


_BY_STATUS: dict[int, type[PlannerAPIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: PlanNotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: RateLimitError,
}


def error_from_problem(status: int, problem: Problem, *, job_id: str | None = None) -> PlannerAPIError:
    """The typed error for an HTTP status and its problem (422 splits on the problem ``type``)."""
    cls: type[PlannerAPIError]
    if problem.type.endswith(INFEASIBLE_TYPE):
        cls = PlanInfeasibleError
    elif status == 422:
        cls = ValidationFailedError
    elif status >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(status, PlannerAPIError)
    return cls(status, problem, job_id=job_id)
