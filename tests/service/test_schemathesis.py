"""Property-based calls generated from the app's own OpenAPI schema: whatever comes in, no 500s.

Runs on SQLite (the schema is identical on PostgreSQL; the API suite covers both). Small caps keep each
generated solve short: the point is the handling of odd input, not the solver.

Two parts: every operation on its own (``test_no_server_errors``), and stateful sequences that follow the schema's
OpenAPI links from each create to the operations that read, export, evaluate or delete what it made
(``test_stateful_sequences_follow_the_links``): no 5xx anywhere, what a create made is there for its links
(``ensure_resource_availability``), and a deleted plan stays deleted (``use_after_free``).
"""

from __future__ import annotations

import atexit
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.hooks import HookContext
from schemathesis.specs.openapi.checks import ensure_resource_availability, use_after_free

from conftest import make_settings
from service_support import empty_tables, fleet, small_model
from shardwise.hwprofiles import get_profile
from shardwise.service.app import create_app
from shardwise.service.db import upgrade
from shardwise.service.runners import LocalRunner

# a minute of generated requests: make test runs them, the edit loop (make test-fast) has the hostile catalogue
pytestmark = pytest.mark.slow

DATABASE_URL = f"sqlite:///{Path(tempfile.mkdtemp(prefix='shardwise-schemathesis-')) / 'api.db'}"


def _app() -> object:
    url = DATABASE_URL
    upgrade(url)
    runner = LocalRunner(url, workers=1)
    runner.start()
    atexit.register(runner.shutdown)  # schemathesis keeps the app's lifespan open until the process ends
    # no ready-plan cache: it outlives the rows a sequence's setup deletes, so a later sequence's create of the same
    # request would answer 200 from it (no links) where the first answered 201, which Hypothesis calls flaky
    return create_app(
        make_settings(
            url, max_tables=20, max_ranks=16, max_time_limit_s=2, wait_s=3, plan_cache_bytes=0, log_level="WARNING"
        ),
        runner=runner,
    )


_APP = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_no_server_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])


# ------------------------------------------------------------------------------------------------- stateful

#: a second schema over the same app, for the sequences: its generated create bodies are mixed with valid ones (a
#: random body almost never makes a model whose tables fit the bounds, or a fleet of a known GPU), so that creates
#: succeed and their links are followed
sequences_schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)
NAME = st.from_regex(r"seq-[a-z]{1,6}", fullmatch=True)
#: a small greedy solve ends in well under a second once the pool's process is up (``_warm_the_solver_pool``); the wait
#: is long enough that a slow machine still answers 201, not a 202 with other links
GREEDY = {"solver": "greedy", "wait_s": 20}
VALID_BODIES: dict[str, st.SearchStrategy[Any]] = {
    "POST /api/v1/models": NAME.map(lambda n: small_model(n, tables=2)),
    "POST /api/v1/fleets": st.builds(fleet, NAME, gpus=st.sampled_from([1, 2, 4])),
    "POST /api/v1/hwprofiles": NAME.map(
        lambda n: {**get_profile("nvidia-h100-sxm").model_dump(mode="json"), "name": n}
    ),
    "POST /api/v1/calibrations": st.sampled_from([0.5, 0.6, 0.7]).map(
        lambda v: {
            "profile": "nvidia-h200",
            "device": "NVIDIA H200",
            "torch": "2.13.0",
            "date": "2026-12-01",
            "figures": {"achieved.embedding_gather": {"value": v, "source": "sequences", "samples": 3}},
        }
    ),
    "POST /api/v1/plans": st.builds(
        lambda m, f: {"model": m, "fleet": f, "options": GREEDY},
        NAME.map(lambda n: small_model(n, tables=2)),
        st.builds(fleet, NAME, gpus=st.sampled_from([1, 2])),
    ),
    "POST /api/v1/plans/{plan_id}/evaluate": st.builds(lambda f: {"fleet": f}, st.builds(fleet, NAME, gpus=st.just(4))),
    "POST /api/v1/port": st.builds(
        lambda m: {"model": m, "source_fleet": fleet("a"), "target_fleet": fleet("b", gpus=4), "options": GREEDY},
        NAME.map(lambda n: small_model(n, tables=2)),
    ),
}


@sequences_schema.hook
def before_generate_body(context: HookContext, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    operation = context.operation
    valid = VALID_BODIES.get(f"{operation.method.upper()} {operation.path}") if operation else None
    return strategy if valid is None else st.one_of(strategy, valid)


class Sequences(sequences_schema.as_state_machine()):  # type: ignore[misc]
    """Schemathesis' state machine over the links, with the checks above; it counts the calls it made and the ones
    that followed a link."""

    calls: ClassVar[Counter[tuple[str, int]]] = Counter()
    followed: ClassVar[Counter[tuple[str, int]]] = Counter()

    def setup(self) -> None:
        # every sequence starts from an empty store: the same steps get the same answers (else Hypothesis finds
        # its generation "flaky": a profile name taken by an earlier sequence answers 409, which has no links)
        empty_tables(DATABASE_URL)

    def after_call(self, response: Any, case: schemathesis.Case) -> None:
        super().after_call(response, case)
        label = f"{case.operation.method.upper()} {case.operation.path}"
        self.calls[(label, response.status_code)] += 1
        node = self.recorder.cases.get(case.id)
        if node is not None and node.is_transition_applied:
            self.followed[(label, response.status_code)] += 1

    def validate_response(self, response: Any, case: schemathesis.Case, *args: Any, **kwargs: Any) -> None:
        case.validate_response(
            response,
            checks=[not_a_server_error, ensure_resource_availability, use_after_free],
            transport_kwargs=kwargs or None,
            recorder=self.recorder,
        )


def _warm_the_solver_pool() -> None:
    """Solve once before the sequences: the first solve starts the pool's process and loads the numerics, which
    may outlast a sequence's wait, so the first sequence's plan would answer 202 where the same step later answers
    201 (Hypothesis calls the changed links flaky)."""
    body = {"model": small_model("warm", tables=2), "fleet": fleet("warm"), "options": {**GREEDY, "wait_s": 120}}
    response = sequences_schema["/api/v1/plans"]["POST"].Case(body=body).call()
    assert response.status_code == 201, response.text


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_stateful_sequences_follow_the_links() -> None:
    _warm_the_solver_pool()
    Sequences.run(
        settings=settings(
            max_examples=30,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            # a replayed or shrunk sequence may not get the same answers (a solve answers 201 or, slower, 202), which
            # Hypothesis calls flaky: a failure is reported as it was found
            database=None,
            phases=[Phase.generate],
        )
    )
    created = {label for (label, status) in Sequences.calls if label.startswith("POST") and status < 300}
    followed = {label for (label, status) in Sequences.followed if status < 300}
    # creates succeeded, and links from them were followed to operations that answered (which ones varies by run)
    assert len(created) >= 2, sorted(Sequences.calls.items())
    assert len(followed) >= 2, sorted(Sequences.followed.items())


def test_every_create_links_to_what_reads_it() -> None:
    paths = schema.raw_schema["paths"]
    for path, item in paths.items():
        post = item.get("post", {})
        for status in ("201",):
            if status in post.get("responses", {}):
                links = post["responses"][status].get("links", {})
                assert links, f"POST {path} {status} has no OpenAPI links"
                for link in links.values():
                    assert link["parameters"], link
    plan_links = paths["/api/v1/plans"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in plan_links.values()} == {
        "plans-get_plan",
        "plans-export_torchrec",
        "plans-evaluate_plan",
        "plans-delete_plan",
    }
