"""``ShardwiseClient``: the typed, retrying HTTP client a job script uses to get a plan from a shardwise service.

::

    from shardwise.clients.client import ShardwiseClient

    with ShardwiseClient() as client:              # SHARDWISE_URL, SHARDWISE_TOKEN
        plan = client.plan(spec, "h100-2x8@3", solver="cpsat", time_limit_s=60)

Every method returns the wire models of ``shardwise.wire.spec`` / ``shardwise.wire.resources`` (never dicts, except the
two documents that are dicts by nature: ``export`` and ``healthz``) and raises the typed errors of
``shardwise.clients.errors``.

This module holds the resources: one method per call of the API, and following a solve's job to its end. The
transport under them is ``shardwise.clients.transport`` (its public names are importable from here too): connection
errors, timeouts and HTTP 408/429/5xx are retried up to ``max_retries`` extra times with exponential backoff (0.5 s
doubling to 8 s, minus up to 25 % jitter), or after the server's ``Retry-After`` (seconds or an HTTP date, capped at
60 s) when it sends one. Every POST carries an ``Idempotency-Key``, the same on each retry of one call and a new one
per call, so a retried POST cannot solve or register twice.

Import-light on purpose: httpx, pydantic and the wire models; never the server's stack (FastAPI, SQLAlchemy,
OR-Tools, numpy).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from shardwise.clients.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PlanInfeasibleError,
    PlannerAPIError,
    PlannerConnectionError,
    PlannerError,
    PlannerResponseError,
    PlannerTimeoutError,
    PlanNotFoundError,
    RateLimitError,
    ServerError,
    ValidationFailedError,
    error_from_problem,
)

# the transport's public names, still importable from here (explicit re-exports: mypy's strict mode reads them)
from shardwise.clients.transport import API_PREFIX as API_PREFIX
from shardwise.clients.transport import DEFAULT_BASE_URL as DEFAULT_BASE_URL
from shardwise.clients.transport import DEFAULT_MAX_RETRIES as DEFAULT_MAX_RETRIES
from shardwise.clients.transport import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from shardwise.clients.transport import INITIAL_RETRY_DELAY_S as INITIAL_RETRY_DELAY_S
from shardwise.clients.transport import JITTER as JITTER
from shardwise.clients.transport import MAX_RETRY_AFTER_S as MAX_RETRY_AFTER_S
from shardwise.clients.transport import MAX_RETRY_DELAY_S as MAX_RETRY_DELAY_S
from shardwise.clients.transport import RETRY_STATUSES as RETRY_STATUSES
from shardwise.clients.transport import BaseClient
from shardwise.clients.transport import parse_retry_after as parse_retry_after
from shardwise.hwprofiles import Calibration, HardwareProfile
from shardwise.wire import hashing
from shardwise.wire.resources import (
    CalibrationRecord,
    Evaluation,
    FleetRecord,
    Job,
    JobState,
    ModelRecord,
    Page,
    PlanOptions,
    PlanSummary,
    Problem,
    ProfileRecord,
    StoredPlan,
)
from shardwise.wire.spec import Executor, FleetSpec, ModelSpec, PlanStatus

if TYPE_CHECKING:
    from shardwise.wire.port_spec import PortReport
    from shardwise.wire.replan_spec import ReplanReport

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
    "ShardwiseClient",
    "ValidationFailedError",
]


KNOWN_PLANS: Final = 64  # plans a client remembers with their ETag, to ask again with If-None-Match
WAIT_MARGIN_S: Final = 10.0  # a POST /plans that asks the server to wait wait_s reads for at least wait_s + this
PAGE_SIZE: Final = 100  # the server refuses a limit over its max_page_size (200 unless it says)

ModelRef = ModelSpec | Mapping[str, Any] | str
"""A model inline (``ModelSpec`` or its JSON as a dict) or by reference (``"name@version"``, or ``"name"``: latest)."""
FleetRef = FleetSpec | Mapping[str, Any] | str
"""A fleet inline (``FleetSpec`` or its JSON as a dict) or by reference (``"name@version"``, or ``"name"``)."""
ProgressCallback = Callable[[Job], None]

M = TypeVar("M", bound=BaseModel)


def _ref(value: BaseModel | Mapping[str, Any] | str) -> Any:
    """A model/fleet/profile as the JSON the API takes. Dicts go as they are: the server validates them, and only
    it knows the custom profiles a fleet may name (and fields a newer server accepts)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, str):
        return value
    return dict(value)


def _calibration_refs(calibrations: Sequence[str] | str) -> list[str]:
    """The request's ``calibrations``: one reference given as a string is a list of one (not of its letters)."""
    return [calibrations] if isinstance(calibrations, str) else list(calibrations)


def _engine_options(
    options: Mapping[str, Any],
    executor: Executor | str | None,
    sparse_2d: bool | None,
    allow_weight_averaging: bool | None,
) -> dict[str, Any]:
    """``options`` with the engine keywords that were given (not None) among them: left out, the server's default
    holds, and the request key stays the one it was without them."""
    named = {"executor": executor, "sparse_2d": sparse_2d, "allow_weight_averaging": allow_weight_averaging}
    return {**options, **{name: value for name, value in named.items() if value is not None}}


def _segment(value: str | int) -> str:
    """One path segment, percent-encoded (names may hold ``/`` and ``:``)."""
    return quote(str(value), safe="")


class ShardwiseClient(BaseClient):
    """A synchronous client for the shardwise planning service (``/api/v1``).

    ``base_url``: the server's root (``http://host:8000``; a trailing ``/api/v1`` is accepted); default
    ``$SHARDWISE_URL``, then ``http://127.0.0.1:8000``. ``token``: sent as ``Authorization: Bearer``; default
    ``$SHARDWISE_TOKEN``. ``http_client``: an ``httpx.Client`` to use as is (FastAPI's ``TestClient`` is one); when
    it has a ``base_url`` of its own and no ``base_url`` is given here, paths are sent relative to it. Its own
    timeout applies unless ``timeout`` is given. ``close()`` closes only a client this one created.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.Client | None = None,
        poll_interval: float = 0.5,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if poll_interval <= 0:
            raise ValueError("poll_interval must be > 0")
        super().__init__(base_url, token=token, timeout=timeout, max_retries=max_retries, http_client=http_client)
        self.poll_interval = poll_interval
        self._known: OrderedDict[str, tuple[str, StoredPlan]] = OrderedDict()  # request key -> (ETag, plan)

    def __repr__(self) -> str:
        return f"ShardwiseClient(base_url={self.base_url!r}, max_retries={self.max_retries})"

    # ------------------------------------------------------------------------------------------- plans

    @overload
    def plan(
        self,
        model: ModelRef,
        fleet: FleetRef,
        *,
        wait: Literal[True] = ...,
        on_progress: ProgressCallback | None = ...,
        timeout_s: float | None = ...,
        calibrations: Sequence[str] | None = ...,
        executor: Executor | str | None = ...,
        sparse_2d: bool | None = ...,
        allow_weight_averaging: bool | None = ...,
        **options: Any,
    ) -> StoredPlan: ...

    @overload
    def plan(
        self,
        model: ModelRef,
        fleet: FleetRef,
        *,
        wait: bool,
        on_progress: ProgressCallback | None = ...,
        timeout_s: float | None = ...,
        calibrations: Sequence[str] | None = ...,
        executor: Executor | str | None = ...,
        sparse_2d: bool | None = ...,
        allow_weight_averaging: bool | None = ...,
        **options: Any,
    ) -> StoredPlan | Job: ...

    def plan(
        self,
        model: ModelRef,
        fleet: FleetRef,
        *,
        wait: bool = True,
        on_progress: ProgressCallback | None = None,
        timeout_s: float | None = None,
        calibrations: Sequence[str] | None = None,
        executor: Executor | str | None = None,
        sparse_2d: bool | None = None,
        allow_weight_averaging: bool | None = None,
        **options: Any,
    ) -> StoredPlan | Job:
        """Plan ``model`` on ``fleet``: the stored plan (``reused`` when it was already there).

        When the client can compute the request's key itself (an inline model and fleet of catalogue GPUs or inline
        profiles, no calibrations: ``shardwise.wire.hashing.request_key``) it first asks
        ``GET /plans/by-key/{key}`` — no parsing on the server, and a 304 when this client holds the plan already;
        otherwise, or on a miss, ``POST /plans``.

        ``options`` are ``PlanOptions`` fields (``solver``, ``time_limit_s``, ``random_seed``, ``wait_s``...);
        ``executor`` (``"shardwise"`` or ``"torchrec"``: the engine that will run the plan, which it is priced for and
        laid out for), ``sparse_2d`` (False: 1D plans only) and ``allow_weight_averaging`` (a 2D plan may sync by
        averaging weights, TorchRec's DMPCollection) are three of them, named here; None leaves the server's default.
        When the solve outlives the request (202), follow the job until it ends, calling ``on_progress(job)``
        with every state seen, for at most ``timeout_s`` seconds from the call (None: no limit) — or, with
        ``wait=False``, return the ``Job`` at once (see ``submit``). An infeasible model raises
        ``PlanInfeasibleError`` carrying the explanation. ``calibrations``: stored calibrations to price the fleet
        with (``"<profile>@<version>"`` or a digest; see ``add_calibration``); the plan's ``calibrations`` name them.
        """
        deadline = None if timeout_s is None else self._monotonic() + timeout_s
        options = _engine_options(options, executor, sparse_2d, allow_weight_averaging)
        answer, delay = self._submit(model, fleet, options, calibrations)
        if isinstance(answer, StoredPlan) or not wait:
            return answer
        return self._follow(answer, delay, on_progress, deadline, timeout_s)

    def submit(
        self,
        model: ModelRef,
        fleet: FleetRef,
        *,
        calibrations: Sequence[str] | None = None,
        executor: Executor | str | None = None,
        sparse_2d: bool | None = None,
        allow_weight_averaging: bool | None = None,
        **options: Any,
    ) -> StoredPlan | Job:
        """``POST /plans`` without following a job: the plan when the server had it or solved it within its wait
        (pass ``wait_s=0`` for a job at once), else the ``Job`` to poll with ``get_job`` or ``wait_for``. The
        options are ``plan``'s."""
        options = _engine_options(options, executor, sparse_2d, allow_weight_averaging)
        answer, _ = self._submit(model, fleet, options, calibrations)
        return answer

    def wait_for(
        self, job_id: str, on_progress: ProgressCallback | None = None, timeout_s: float | None = None
    ) -> StoredPlan:
        """Poll ``GET /jobs/{id}`` until the job ends: its plan, or the job's error raised as its typed exception
        (``PlanInfeasibleError`` for an infeasible model). ``PlannerTimeoutError`` (with ``.job``) after
        ``timeout_s`` seconds."""
        deadline = None if timeout_s is None else self._monotonic() + timeout_s
        job, delay = self._fetch_job(job_id)
        return self._follow(job, delay, on_progress, deadline, timeout_s)

    def get_job(self, job_id: str) -> Job:
        """``GET /jobs/{id}``."""
        return self._fetch_job(job_id)[0]

    def get_plan(self, plan_id: str) -> StoredPlan:
        """``GET /plans/{id}``."""
        return self._parse(StoredPlan, self._request("GET", f"/plans/{_segment(plan_id)}"))

    def delete_plan(self, plan_id: str) -> None:
        """``DELETE /plans/{id}``."""
        self._request("DELETE", f"/plans/{_segment(plan_id)}")

    def list_plans_page(
        self,
        page: int = 1,
        limit: int = 50,
        *,
        model: str | None = None,
        fleet: str | None = None,
        gpu: str | None = None,
        status: PlanStatus | str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
    ) -> Page[PlanSummary]:
        """One page of the plan history (``GET /plans``), newest first; the server refuses a ``limit`` over its
        ``max_page_size`` (200 unless it says)."""
        filters = {
            "model": model,
            "fleet": fleet,
            "gpu": gpu,
            "status": status,
            "created_after": created_after,
            "created_before": created_before,
        }
        return self._page(PlanSummary, "/plans", page, limit, filters)

    def list_plans(
        self,
        *,
        model: str | None = None,
        fleet: str | None = None,
        gpu: str | None = None,
        status: PlanStatus | str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        page_size: int = PAGE_SIZE,
    ) -> Iterator[PlanSummary]:
        """Every plan matching the filters, newest first, fetching one page at a time as the iteration needs it."""
        filters = {
            "model": model,
            "fleet": fleet,
            "gpu": gpu,
            "status": status,
            "created_after": created_after,
            "created_before": created_before,
        }
        return self._iterate(PlanSummary, "/plans", page_size, filters, key=lambda s: s.id)

    def evaluate(
        self,
        plan_id: str,
        fleet: FleetRef,
        model: ModelRef | None = None,
        *,
        calibrations: Sequence[str] | None = None,
        executor: Executor | str | None = None,
    ) -> Evaluation:
        """Score a stored plan on ``fleet`` (``POST /plans/{id}/evaluate``; the plan's own model unless given),
        priced with the stored ``calibrations`` when given, for the engine ``executor`` names (``"shardwise"`` or
        ``"torchrec"``; None: the engine the plan was priced for). The evaluation's plan says which
        (``Plan.executor``); for torchrec a layout TorchRec cannot run is one of its problems."""
        body: dict[str, Any] = {"fleet": _ref(fleet)}
        if model is not None:
            body["model"] = _ref(model)
        if calibrations:
            body["calibrations"] = _calibration_refs(calibrations)
        if executor is not None:
            body["executor"] = Executor(executor).value
        return self._parse(Evaluation, self._request("POST", f"/plans/{_segment(plan_id)}/evaluate", json=body))

    def export(self, plan_id: str, format: Literal["torchrec", "json"] = "torchrec") -> dict[str, Any]:
        """A stored plan as a document: ``torchrec`` (TorchRec's serialized sharding plan) or ``json`` (the plan)."""
        if format == "torchrec":
            path = f"/plans/{_segment(plan_id)}/torchrec"
        elif format == "json":
            path = f"/plans/{_segment(plan_id)}"
        else:
            raise ValueError(f"format must be 'torchrec' or 'json', not {format!r}")
        body = self._json(self._request("GET", path))
        if not isinstance(body, dict):
            raise PlannerResponseError(f"GET {path}: expected a JSON object, got {type(body).__name__}", status=200)
        return body

    def port(
        self,
        model: ModelRef,
        source_fleet: FleetRef,
        target_fleet: FleetRef,
        *,
        calibrations: Sequence[str] | None = None,
        executor: Executor | str | None = None,
        sparse_2d: bool | None = None,
        allow_weight_averaging: bool | None = None,
        **options: Any,
    ) -> PortReport:
        """Carry ``model``'s plan from ``source_fleet`` to ``target_fleet`` and re-plan it there (``POST /port``).

        ``options`` are ``PlanOptions`` fields for both plans (``executor``, ``sparse_2d`` and
        ``allow_weight_averaging`` as in ``plan``). ``calibrations``: stored calibrations, each applied to whichever
        fleet has its GPU.
        """
        from shardwise.wire.port_spec import PortReport  # written beside this client; pydantic only

        options = _engine_options(options, executor, sparse_2d, allow_weight_averaging)

        body = {
            "model": _ref(model),
            "source_fleet": _ref(source_fleet),
            "target_fleet": _ref(target_fleet),
            "options": self._options(options),
        }
        if calibrations:
            body["calibrations"] = _calibration_refs(calibrations)
        timeout = self._timeout_for_wait(options.get("wait_s"))
        return self._parse(PortReport, self._request("POST", "/port", json=body, timeout=timeout))

    def replan(
        self,
        plan_id: str,
        fleet: FleetRef | None = None,
        model: ModelRef | None = None,
        *,
        max_slowdown: float | None = None,
        ms_per_gb: float | None = None,
        calibrations: Sequence[str] | None = None,
        on_progress: ProgressCallback | None = None,
        timeout_s: float | None = None,
        **options: Any,
    ) -> ReplanReport:
        """Re-make the stored plan ``plan_id`` for ``fleet`` and/or ``model`` (``POST /plans/{id}/replan``), moving
        the least data within the budget: ``max_slowdown`` (a fraction of the fresh plan's predicted step: 0.03 for
        3 %) or ``ms_per_gb`` (the step a GB not moved is worth); neither: the server's default, max_slowdown 0.03.
        ``options``: ``PlanOptions`` fields for the fresh plan it is weighed against (none: the stored plan's own).
        When the fresh plan outlives the request (202), follow its job (``on_progress``, ``timeout_s`` as in
        ``plan``), then ask again. The report lists every move (``ReplanReport.moves``) and the fresh plan beside
        the re-plan."""
        from shardwise.wire.replan_spec import ReplanReport  # written beside this client; pydantic only

        deadline = None if timeout_s is None else self._monotonic() + timeout_s
        body: dict[str, Any] = {}
        if fleet is not None:
            body["fleet"] = _ref(fleet)
        if model is not None:
            body["model"] = _ref(model)
        if max_slowdown is not None or ms_per_gb is not None:
            body["budget"] = {"max_slowdown": max_slowdown, "ms_per_gb": ms_per_gb}
        if options:
            body["options"] = self._options(options)
        if calibrations:
            body["calibrations"] = _calibration_refs(calibrations)
        path = f"/plans/{_segment(plan_id)}/replan"
        timeout = self._timeout_for_wait(options.get("wait_s"))
        while True:
            response = self._request("POST", path, json=body, timeout=timeout)
            if response.status_code != 202:
                return self._parse(ReplanReport, response)
            self._follow(self._parse(Job, response), self._poll_delay(response), on_progress, deadline, timeout_s)

    # ------------------------------------------------------------------------------------------- models, fleets

    def register_model(self, spec: ModelSpec | Mapping[str, Any]) -> ModelRecord:
        """``POST /models``: a new version, or the existing version when identical to one."""
        return self._parse(ModelRecord, self._request("POST", "/models", json=_ref(spec)))

    def get_model(self, name: str, version: int | None = None) -> ModelRecord:
        """``GET /models/{name}[/{version}]``: that version, or the latest; ``name`` may be ``"name@version"``."""
        name, version = self._split_ref(name, version)
        path = f"/models/{_segment(name)}" + (f"/{version}" if version is not None else "")
        return self._parse(ModelRecord, self._request("GET", path))

    def list_models(self, name: str | None = None, *, page_size: int = PAGE_SIZE) -> Iterator[ModelRecord]:
        """Every registered model version (``GET /models``), of one name when given."""
        return self._iterate(ModelRecord, "/models", page_size, {"name": name}, key=lambda r: (r.name, r.version))

    def register_fleet(self, spec: FleetSpec | Mapping[str, Any]) -> FleetRecord:
        """``POST /fleets``: a new version, or the existing version when identical to one."""
        return self._parse(FleetRecord, self._request("POST", "/fleets", json=_ref(spec)))

    def get_fleet(self, name: str, version: int | None = None) -> FleetRecord:
        """``GET /fleets/{name}[/{version}]``: that version, or the latest; ``name`` may be ``"name@version"``."""
        name, version = self._split_ref(name, version)
        path = f"/fleets/{_segment(name)}" + (f"/{version}" if version is not None else "")
        return self._parse(FleetRecord, self._request("GET", path))

    def list_fleets(self, name: str | None = None, *, page_size: int = PAGE_SIZE) -> Iterator[FleetRecord]:
        """Every registered fleet version (``GET /fleets``), of one name when given."""
        return self._iterate(FleetRecord, "/fleets", page_size, {"name": name}, key=lambda r: (r.name, r.version))

    # ------------------------------------------------------------------------------------------- profiles

    def profiles(self) -> list[ProfileRecord]:
        """``GET /hwprofiles``: the catalogue and the custom profiles."""
        response = self._request("GET", "/hwprofiles")
        body = self._json(response)
        if not isinstance(body, list):
            raise PlannerResponseError(f"GET /hwprofiles: expected a JSON list, got {type(body).__name__}", status=200)
        try:
            return [ProfileRecord.model_validate(item) for item in body]
        except ValidationError as exc:
            raise self._bad_body(response, exc) from exc

    def get_profile(self, name: str) -> ProfileRecord:
        """``GET /hwprofiles/{name}``."""
        return self._parse(ProfileRecord, self._request("GET", f"/hwprofiles/{_segment(name)}"))

    def register_profile(self, profile: HardwareProfile | Mapping[str, Any]) -> ProfileRecord:
        """``POST /hwprofiles``: a custom profile (``ConflictError`` when the name is taken by another one)."""
        return self._parse(ProfileRecord, self._request("POST", "/hwprofiles", json=_ref(profile)))

    # ------------------------------------------------------------------------------------------- calibrations

    def add_calibration(self, calibration: Calibration | Mapping[str, Any]) -> CalibrationRecord:
        """``POST /calibrations``: store a calibration of one profile, as that profile's next version (or the record
        already stored for identical content). ``ValidationFailedError`` when the profile is unknown or the
        calibrated profile would be invalid."""
        return self._parse(CalibrationRecord, self._request("POST", "/calibrations", json=_ref(calibration)))

    def calibrations(self, profile: str | None = None, *, page_size: int = PAGE_SIZE) -> Iterator[CalibrationRecord]:
        """Every stored calibration (``GET /calibrations``), of one profile when given; newest version first."""
        return self._iterate(
            CalibrationRecord, "/calibrations", page_size, {"profile": profile}, key=lambda r: r.digest
        )

    def get_calibration(self, ref: str) -> CalibrationRecord:
        """``GET /calibrations/{profile}/{version}`` for ``"<profile>@<version>"``, else ``GET /calibrations/{ref}``
        (a digest)."""
        profile, at, version = ref.rpartition("@")
        path = f"/calibrations/{_segment(profile)}/{_segment(version)}" if at else f"/calibrations/{_segment(ref)}"
        return self._parse(CalibrationRecord, self._request("GET", path))

    # ------------------------------------------------------------------------------------------- health

    def healthz(self) -> dict[str, Any]:
        """``GET /healthz`` (at the server's root, beside ``/api/v1``): the server's health document."""
        body = self._json(self._request("GET", "/healthz", api=False))
        return body if isinstance(body, dict) else {"status": body}

    # ------------------------------------------------------------------------------------------- internals: plans

    def _options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as sent: validated here (a typo fails before any request), only the fields given, so the
        server's defaults apply to the rest."""
        return PlanOptions.model_validate(dict(options)).model_dump(mode="json", exclude_unset=True)

    def _timeout_for_wait(self, wait_s: Any) -> httpx.Timeout | None:
        """A read timeout long enough for a request that asks the server to wait ``wait_s`` seconds."""
        if not isinstance(wait_s, int | float) or self.timeout.read is None:
            return None
        needed = float(wait_s) + WAIT_MARGIN_S
        if self.timeout.read >= needed:
            return None
        return httpx.Timeout(
            connect=self.timeout.connect, read=needed, write=self.timeout.write, pool=self.timeout.pool
        )

    def request_key(
        self,
        model: ModelRef,
        fleet: FleetRef,
        *,
        calibrations: Sequence[str] | None = None,
        executor: Executor | str | None = None,
        sparse_2d: bool | None = None,
        allow_weight_averaging: bool | None = None,
        **options: Any,
    ) -> str | None:
        """The request key of ``plan(model, fleet, calibrations=..., **options)`` as this client can compute it, or
        None where only the server can (a model or fleet by name, a custom profile by name, calibrations). Assumes
        the server's defaults for the options not given: a server whose ``max_time_limit_s`` caps the default time
        limit stores the request under another key (the lookup misses and the request is posted). ``executor``,
        ``sparse_2d`` and ``allow_weight_averaging`` enter the key only when set away from their defaults
        (``SolveParams.key_dump``), as on the server."""
        options = _engine_options(options, executor, sparse_2d, allow_weight_averaging)
        if calibrations or isinstance(model, str) or isinstance(fleet, str):
            return None
        try:
            params = PlanOptions.model_validate(dict(options)).solve_params()
            model_spec = model if isinstance(model, ModelSpec) else ModelSpec.model_validate(_ref(model))
            fleet_spec = fleet if isinstance(fleet, FleetSpec) else FleetSpec.model_validate(_ref(fleet))
        except (ValidationError, ValueError):  # e.g. a custom profile named: the server knows it, the client not
            return None
        return hashing.request_key(model_spec, fleet_spec, params)

    def plan_by_key(self, key: str) -> StoredPlan | None:
        """``GET /plans/by-key/{key}``: the stored plan for a request key, or None when the server has none (a
        server without the route answers 404 too). The plan is remembered with its ETag: asking again for the
        same key sends ``If-None-Match`` and a 304 answers from memory."""
        known = self._known.get(key)
        headers = {"If-None-Match": known[0]} if known is not None else None
        try:
            response = self._request("GET", f"/plans/by-key/{_segment(key)}", headers=headers)
        except NotFoundError:
            self._known.pop(key, None)
            return None
        if response.status_code == 304 and known is not None:
            self._known.move_to_end(key)
            return known[1]
        plan = self._parse(StoredPlan, response)
        etag = response.headers.get("etag")
        if etag:
            self._known[key] = (etag, plan)
            self._known.move_to_end(key)
            while len(self._known) > KNOWN_PLANS:
                self._known.popitem(last=False)
        return plan

    def _submit(
        self,
        model: ModelRef,
        fleet: FleetRef,
        options: Mapping[str, Any],
        calibrations: Sequence[str] | None = None,
    ) -> tuple[StoredPlan | Job, float]:
        key = self.request_key(model, fleet, calibrations=calibrations, **options)
        if key is not None:
            found = self.plan_by_key(key)
            if found is not None and found.status is not PlanStatus.infeasible:  # infeasible: the POST explains it
                return found, 0.0
        body = {"model": _ref(model), "fleet": _ref(fleet), "options": self._options(options)}
        if calibrations:
            body["calibrations"] = _calibration_refs(calibrations)
        timeout = self._timeout_for_wait(options.get("wait_s"))
        response = self._request("POST", "/plans", json=body, timeout=timeout)
        if response.status_code == 202:
            return self._parse(Job, response), self._poll_delay(response)
        return self._parse(StoredPlan, response), 0.0

    def _poll_delay(self, response: httpx.Response) -> float:
        after = parse_retry_after(response.headers)
        return self.poll_interval if after is None else after

    def _fetch_job(self, job_id: str) -> tuple[Job, float]:
        response = self._request("GET", f"/jobs/{_segment(job_id)}")
        return self._parse(Job, response), self._poll_delay(response)

    def _follow(
        self,
        job: Job,
        delay: float,
        on_progress: ProgressCallback | None,
        deadline: float | None,
        timeout_s: float | None,
    ) -> StoredPlan:
        """Report ``job``, then poll it every ``delay`` (the server's Retry-After, else poll_interval) until it
        ends or the ``deadline`` (a ``_monotonic()`` time) passes."""
        while True:
            if on_progress is not None:
                on_progress(job)
            if job.state is JobState.succeeded:
                if not job.plan_id:
                    raise PlannerResponseError(f"job {job.id} succeeded without a plan_id", status=200)
                return self.get_plan(job.plan_id)
            if job.state is JobState.failed:
                raise self._job_error(job)
            if deadline is not None:
                remaining = deadline - self._monotonic()
                if remaining <= 0:
                    raise PlannerTimeoutError(
                        f"job {job.id} still {job.state.value} after {timeout_s:g} s; resume with wait_for({job.id!r})",
                        job=job,
                    )
                delay = min(delay, remaining)
            self._sleep(delay)
            job, delay = self._fetch_job(job.id)

    @staticmethod
    def _job_error(job: Job) -> PlannerAPIError:
        error = dict(job.error or {})
        error.setdefault("title", "Job failed")
        status = error.get("status")
        if not isinstance(status, int) or status < 400:
            status = 500
            error["status"] = status
        try:
            problem = Problem.model_validate(error)
        except ValidationError:
            problem = Problem(title="Job failed", status=status, detail=str(job.error))
        return error_from_problem(status, problem, job_id=job.id)

    @staticmethod
    def _split_ref(name: str, version: int | None) -> tuple[str, int | None]:
        if version is None and "@" in name:
            base, _, tail = name.rpartition("@")
            if tail.isdigit():
                return base, int(tail)
        return name, version
