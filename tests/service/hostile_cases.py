"""The hostile-request catalogue that ``test_hostile_input.py`` sends to a real uvicorn on SQLite and PostgreSQL.

Each ``Case`` is one request (or one raw HTTP message) and the answer it must get: its status, for a validation
error the field it names, and whether it may store anything. Every case from issue 18's list is here (100k-level
nesting, integers over 4,300 digits, ``a@²``, ``a@99999999999999999999``, ``a@9223372036854775807``, NUL in names
and filters, 20 host groups of 63-character custom profiles, ``num_embeddings`` ≥ 1e18, pooling 1e300, host memory
1e30, Infinity and NaN, 8 MB names, ``/`` and ``../`` in names, wrong content types, huge bodies, unicode
confusables), over every endpoint and method. Bodies are built when a case runs (``Case.content``), not at import.

Placeholders filled in when a case runs: ``{plan}`` (a stored plan's id) in paths, query values and bodies.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from service_support import fleet, small_model
from shardwise.hwprofiles import get_profile

GREEDY = {"solver": "greedy"}
JSON = {"content-type": "application/json"}
#: the 20 custom profiles the server holds (63 characters each: the longest a profile name may be)
LONG_PROFILES = [f"lab-{i:02d}-" + "g" * 56 for i in range(20)]
BASE_PROFILE = "lab-base"
#: a model, a fleet and a calibration the server holds before the attack
BASE = "base"
#: a string that stands for a number in a template: replaced by a raw token (NaN, a 5,000-digit integer...)
N = "__NUMBER__"
#: the same for a string value
S = "__STRING__"


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    path: str
    #: the body, built when the case runs
    body: Callable[[], bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    params: list[tuple[str, str]] | None = None
    #: the answers that are right (a refusal names its status)
    status: tuple[int, ...] = (422,)
    #: for a 422 from validation: the error location every answer must name (a prefix of one error's ``loc``)
    where: tuple[str | int, ...] | None = None
    #: the request may store something (an accepted request); a refused one never does
    stores: bool = False
    #: a page for browsers: its 4xx is HTML, not problem+json
    html: bool = False
    #: a whole HTTP/1.1 message sent on a raw socket instead (for what an HTTP client will not send)
    raw: Callable[[], bytes] | None = None
    #: refused by the HTTP server (uvicorn) before the app sees it: its 4xx is uvicorn's plain text
    by_server: bool = False

    def content(self, plan_id: str) -> bytes | None:
        if self.body is None:
            return None
        return self.body().replace(b"{plan}", plan_id.encode())


# ------------------------------------------------------------------------------------------------- bodies


def custom_profile(name: str = "lab-x", **figures: Any) -> dict[str, Any]:
    data = get_profile("nvidia-h100-sxm").model_dump(mode="json")
    data.update({"name": name, "sources": {}, **figures})
    return data


def calibration(profile: str = "nvidia-h200", **fields: Any) -> dict[str, Any]:
    return {
        "profile": profile,
        "device": "NVIDIA H200",
        "torch": "2.13.0",
        "date": "2026-12-01",
        "figures": {"achieved.embedding_gather": {"value": 0.7, "source": "hostile", "samples": 3}},
        **fields,
    }


def plan_request(model: Any = None, fleet_: Any = None, **options: Any) -> dict[str, Any]:
    return {
        "model": model or small_model("hostile"),
        "fleet": fleet_ or fleet("hostile"),
        "options": {**GREEDY, **options},
    }


def encoded(value: Any) -> Callable[[], bytes]:
    return lambda: json.dumps(value).encode()


def raw(text: bytes) -> Callable[[], bytes]:
    return lambda: text


def poisoned(template: dict[str, Any], token: bytes) -> Callable[[], bytes]:
    """``template`` as JSON with the placeholder ``N`` (or ``S``) replaced by a raw token."""

    def build() -> bytes:
        text = json.dumps(template).encode()
        return text.replace(f'"{N}"'.encode(), token).replace(f'"{S}"'.encode(), token)

    return build


def at(template: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``template`` with ``value`` at ``path``."""
    out: Any = json.loads(json.dumps(template))
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out  # type: ignore[no-any-return]


@dataclass(frozen=True)
class JsonRoute:
    """A route that reads a JSON body: a valid body, and where in it a number and a text field are."""

    id: str
    path: str
    valid: dict[str, Any]
    number: tuple[str | int, ...]
    text: tuple[str | int, ...]
    #: the status an unknown-but-well-formed body gets on this route when it is otherwise fine (for oddities that
    #: strict JSON lets through)
    name_status: int = 422


JSON_ROUTES = [
    JsonRoute(
        "plans",
        "/api/v1/plans",
        plan_request(),
        ("model", "batch_size_per_gpu"),
        ("model", "name"),
    ),
    JsonRoute("models", "/api/v1/models", small_model("hostile"), ("batch_size_per_gpu",), ("name",)),
    JsonRoute("fleets", "/api/v1/fleets", fleet("hostile"), ("hosts", 0, "count"), ("name",)),
    JsonRoute("hwprofiles", "/api/v1/hwprofiles", custom_profile("lab-hostile"), ("hbm_bytes",), ("display_name",)),
    JsonRoute(
        "calibrations",
        "/api/v1/calibrations",
        calibration(),
        ("figures", "achieved.embedding_gather", "samples"),
        ("device",),
    ),
    JsonRoute(
        "port",
        "/api/v1/port",
        {"model": small_model("hostile"), "source_fleet": fleet("a"), "target_fleet": fleet("b", gpus=4)},
        ("model", "batch_size_per_gpu"),
        ("model", "name"),
    ),
    JsonRoute(
        "evaluate",
        "/api/v1/plans/{plan}/evaluate",
        {"fleet": fleet("hostile", gpus=4)},
        ("fleet", "hosts", 0, "count"),
        ("fleet", "name"),
    ),
    JsonRoute(
        "replan",
        "/api/v1/plans/{plan}/replan",
        {"fleet": fleet("hostile", gpus=4), "budget": {"max_slowdown": 0.03}},
        ("budget", "max_slowdown"),
        ("fleet", "name"),
    ),
]


def _json_syntax_cases(route: JsonRoute) -> Iterator[Case]:
    """What strict JSON refuses (or the size cap, or the parser), on one route."""
    post = {"method": "POST", "path": route.path, "headers": JSON}
    number_at = ("body", *route.number)
    text_at = ("body", *route.text)
    yield Case(f"{route.id}-nested-arrays-100k", body=raw(b"[" * 100_000 + b"]" * 100_000), where=("body",), **post)
    yield Case(
        f"{route.id}-nested-objects-100k",
        body=raw(b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
        where=("body",),
        **post,
    )
    yield Case(
        f"{route.id}-nested-65-levels-in-a-field",
        body=poisoned(at(route.valid, route.number, N), b"[" * 65 + b"1" + b"]" * 65),
        where=("body",),
        **post,
    )
    yield Case(
        f"{route.id}-integer-5000-digits",
        body=poisoned(at(route.valid, route.number, N), b"9" * 5000),
        where=number_at,
        **post,
    )
    yield Case(
        f"{route.id}-integer-2-to-the-64",
        body=poisoned(at(route.valid, route.number, N), str(2**64).encode()),
        where=number_at,
        **post,
    )
    for token in (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999"):
        yield Case(
            f"{route.id}-number-{token.decode()}",
            body=poisoned(at(route.valid, route.number, N), token),
            where=number_at,
            **post,
        )
    yield Case(
        f"{route.id}-nul-in-text",
        body=poisoned(at(route.valid, route.text, S), b'"a\\u0000b"'),
        where=text_at,
        **post,
    )
    yield Case(f"{route.id}-nul-in-a-key", body=raw(b'{"a\\u0000b": 1}'), where=("body",), **post)
    yield Case(
        f"{route.id}-lone-surrogate-in-text",
        body=poisoned(at(route.valid, route.text, S), b'"a\\ud800b"'),
        where=text_at,
        **post,
    )
    yield Case(
        f"{route.id}-invalid-utf8",
        body=poisoned(at(route.valid, route.text, S), b'"a\xff\xfeb"'),
        where=("body",),
        **post,
    )
    yield Case(f"{route.id}-truncated", body=raw(json.dumps(route.valid).encode()[:-7]), where=("body",), **post)
    yield Case(f"{route.id}-empty-body", body=raw(b""), where=("body",), **post)
    yield Case(f"{route.id}-top-level-array", body=raw(b"[]"), where=("body",), **post)
    yield Case(f"{route.id}-top-level-null", body=raw(b"null"), where=("body",), **post)
    yield Case(
        f"{route.id}-8MB-text",
        body=encoded(at(route.valid, route.text, "x" * 8_000_000)),
        where=text_at,
        **post,
    )
    yield Case(f"{route.id}-body-over-the-cap", body=raw(b" " * (9 * 1024 * 1024) + b"{}"), status=(413,), **post)
    yield Case(
        f"{route.id}-unknown-field",
        body=encoded({**route.valid, "extra\u202e": 1}),
        where=("body",),
        **post,
    )


CONTENT_TYPES = {
    "text-plain": {"content-type": "text/plain"},
    "form": {"content-type": "application/x-www-form-urlencoded"},
    "multipart": {"content-type": "multipart/form-data; boundary=x"},
    "xml": {"content-type": "application/xml"},
    "missing": {},
}


def _content_type_cases(route: JsonRoute) -> Iterator[Case]:
    for name, headers in CONTENT_TYPES.items():
        yield Case(
            f"{route.id}-content-type-{name}",
            "POST",
            route.path,
            body=encoded(route.valid),
            headers=headers,
            status=(415,),
        )


# ------------------------------------------------------------------------------------------------- numbers


def _number_cases() -> Iterator[Case]:
    model = small_model("numbers")
    for field_, value in [
        ("num_embeddings", 10**18),
        ("num_embeddings", 2**63 - 1),
        ("num_embeddings", 0),
        ("embedding_dim", 10**9),
        ("embedding_dim", -1),
        ("pooling_factor", 1e300),
        ("pooling_factor", -1.0),
        ("num_features", 10**12),
        ("access_skew", 1e300),
    ]:
        where = ("model", "embedding_tables", 1, field_)
        yield Case(
            f"plans-table-{field_}-{value:g}",
            "POST",
            "/api/v1/plans",
            body=encoded(plan_request(at(model, ("embedding_tables", 1, field_), value))),
            headers=JSON,
            where=("body", *where),
        )
        yield Case(
            f"models-table-{field_}-{value:g}",
            "POST",
            "/api/v1/models",
            body=encoded(at(model, ("embedding_tables", 1, field_), value)),
            headers=JSON,
            where=("body", *where[1:]),
        )
    for value in (10**12, 0, -1, 1.5, "1024x", None):
        yield Case(
            f"models-batch-size-{value!r}",
            "POST",
            "/api/v1/models",
            body=encoded(at(model, ("batch_size_per_gpu",), value)),
            headers=JSON,
            where=("body", "batch_size_per_gpu"),
        )
    host = fleet("numbers")
    for field_, value in [
        ("host_memory_bytes", 10**30),
        ("host_memory_bytes", 10**18),
        ("count", 10**30),
        ("count", 0),
        ("gpus_per_host", 10**9),
    ]:
        yield Case(
            f"plans-host-{field_}-{value:g}",
            "POST",
            "/api/v1/plans",
            body=encoded(plan_request(fleet_=at(host, ("hosts", 0, field_), value))),
            headers=JSON,
            where=("body", "fleet", "hosts", 0, field_),
        )
        yield Case(
            f"fleets-host-{field_}-{value:g}",
            "POST",
            "/api/v1/fleets",
            body=encoded(at(host, ("hosts", 0, field_), value)),
            headers=JSON,
            where=("body", "hosts", 0, field_),
        )
    for value in (1.0, -0.1, 1e300):
        yield Case(
            f"fleets-hbm-reserve-{value:g}",
            "POST",
            "/api/v1/fleets",
            body=encoded({**host, "hbm_reserve_fraction": value}),
            headers=JSON,
            where=("body", "hbm_reserve_fraction"),
        )
    yield Case(
        "models-100k-invalid-tables",
        "POST",
        "/api/v1/models",
        body=encoded({"name": "many", "batch_size_per_gpu": 1, "embedding_tables": [{"name": "t"}] * 100_000}),
        headers=JSON,
        where=("body", "embedding_tables"),
    )
    tiny = (8 * 1024 * 1024 - 100) // 13  # {"name":"t"}, thirteen bytes: as many bad tables as the cap lets in
    yield Case(
        "models-8MiB-of-bad-tables",
        "POST",
        "/api/v1/models",
        body=lambda: (
            b'{"name":"many","batch_size_per_gpu":1,"embedding_tables":[' + b",".join([b'{"name":"t"}'] * tiny) + b"]}"
        ),
        headers=JSON,
        where=("body",),
    )
    yield Case(
        "models-8MiB-of-empty-layers",
        "POST",
        "/api/v1/models",
        body=lambda: (
            b'{"name":"many","batch_size_per_gpu":1,"dense_layers":[' + b",".join([b"{}"] * (tiny * 4)) + b"]}"
        ),
        headers=JSON,
        where=("body",),
    )
    yield Case(
        "hwprofiles-400k-bad-sources",
        "POST",
        "/api/v1/hwprofiles",
        body=encoded(custom_profile("lab-sources", sources={f"k{i}": i for i in range(400_000)})),
        headers=JSON,
        where=("body", "sources"),
    )
    yield Case(
        "calibrations-200k-bad-measurements",
        "POST",
        "/api/v1/calibrations",
        body=encoded(calibration(measurements={f"m{i}": {"value": "x"} for i in range(200_000)})),
        headers=JSON,
        where=("body", "measurements"),
    )
    yield Case(
        "models-8MB-key",
        "POST",
        "/api/v1/models",
        body=encoded({**small_model("key"), "k" * 8_000_000: 1}),
        headers=JSON,
        where=("body",),
    )
    yield Case(
        "models-infinity-under-an-8MB-key",
        "POST",
        "/api/v1/models",
        body=poisoned({**small_model("key"), "k" * 8_000_000: N}, b"Infinity"),
        headers=JSON,
        where=("body",),
    )
    yield Case(
        "fleets-100k-host-groups",
        "POST",
        "/api/v1/fleets",
        body=encoded({"name": "many", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 1}] * 100_000}),
        headers=JSON,
        where=("body", "hosts"),
    )
    for option, value in [
        ("max_deterministic_time", 1e300),
        ("time_limit_s", 1e300),
        ("time_limit_s", 0),
        ("time_limit_s", -1),
        ("num_workers", 10**9),
        ("random_seed", 2**63 - 1),
        ("relative_gap_limit", 1),
        ("wait_s", 1e9),
        ("solver", "gurobi"),
    ]:
        yield Case(
            f"plans-option-{option}-{value}",
            "POST",
            "/api/v1/plans",
            body=encoded(plan_request(**{option: value})),
            headers=JSON,
            where=("body", "options", option),
        )
    for field_, value in [
        ("hbm_bytes", 10**30),
        ("hbm_bandwidth_bytes_per_s", 10**40),
        ("host_memory_bytes", 10**30),
        ("intra_host_latency_us", 1e300),
        ("inter_host_latency_us", -1.0),
        ("gpus_per_host", 10**9),
        ("memory_access_granularity_bytes", 0),
        ("peak_flops_per_s", {"fp32": 10**18, "bf16": 10**19}),
        ("peak_flops_per_s", {"fp32": 1, "bf16": 1, "fp64": 1}),
    ]:
        yield Case(
            f"hwprofiles-{field_}-{json.dumps(value)}",
            "POST",
            "/api/v1/hwprofiles",
            body=encoded(custom_profile(**{field_: value})),
            headers=JSON,
            where=("body", field_),
        )
    for option, token in [("max_deterministic_time", b"Infinity"), ("time_limit_s", b"NaN")]:
        yield Case(
            f"plans-option-{option}-raw-{token.decode()}",
            "POST",
            "/api/v1/plans",
            body=poisoned(plan_request(**{option: N}), token),
            headers=JSON,
            where=("body", "options", option),
        )
    yield Case(
        "hwprofiles-latency-raw-Infinity",
        "POST",
        "/api/v1/hwprofiles",
        body=poisoned(custom_profile("lab-inf", inter_host_latency_us=N), b"Infinity"),
        headers=JSON,
        where=("body", "inter_host_latency_us"),
    )
    yield Case(
        "calibrations-figure-1e308",
        "POST",
        "/api/v1/calibrations",
        body=encoded(calibration(figures={"achieved.embedding_gather": {"value": 1e308, "source": "x", "samples": 1}})),
        headers=JSON,
        where=("body", "figures"),
    )
    yield Case(
        "calibrations-samples-2-to-the-63",
        "POST",
        "/api/v1/calibrations",
        body=poisoned(
            calibration(figures={"achieved.embedding_gather": {"value": 0.5, "source": "x", "samples": N}}),
            str(2**63).encode(),
        ),
        headers=JSON,
        where=("body", "figures", "achieved.embedding_gather", "samples"),
    )
    yield Case(
        "calibrations-unknown-figure",
        "POST",
        "/api/v1/calibrations",
        body=encoded(calibration(figures={"achieved.\u0430ll": {"value": 0.5, "source": "x", "samples": 1}})),
        headers=JSON,
        where=("body", "figures"),
    )
    yield Case(
        "evaluate-fleet-count-1e30",
        "POST",
        "/api/v1/plans/{plan}/evaluate",
        body=encoded({"fleet": at(host, ("hosts", 0, "count"), 10**30)}),
        headers=JSON,
        where=("body", "fleet", "hosts", 0, "count"),
    )
    yield Case(
        "replan-host-named-twice",
        "POST",
        "/api/v1/plans/{plan}/replan",
        body=encoded({"fleet": {**host, "hosts": [{**host["hosts"][0], "count": 1, "names": ["a"]}] * 2}}),
        headers=JSON,
        where=("body", "fleet"),
    )
    yield Case(
        "replan-max-slowdown-1e30",
        "POST",
        "/api/v1/plans/{plan}/replan",
        body=encoded({"fleet": host, "budget": {"max_slowdown": 10**30}}),
        headers=JSON,
        where=("body", "budget", "max_slowdown"),
    )
    yield Case(
        "replan-host-name-with-a-space",
        "POST",
        "/api/v1/plans/{plan}/replan",
        body=encoded({"fleet": {**host, "hosts": [{**host["hosts"][0], "count": 2, "names": ["a b", "c"]}]}}),
        headers=JSON,
        where=("body", "fleet", "hosts", 0, "names", 0),
    )
    yield Case(
        "port-target-host-memory-1e30",
        "POST",
        "/api/v1/port",
        body=encoded(
            {
                "model": small_model("numbers"),
                "source_fleet": host,
                "target_fleet": at(host, ("hosts", 0, "host_memory_bytes"), 10**30),
            }
        ),
        headers=JSON,
        where=("body", "target_fleet", "hosts", 0, "host_memory_bytes"),
    )


# ------------------------------------------------------------------------------------------------- names and references

BAD_VERSIONS = {
    "superscript-two": "²",
    "20-nines": "99999999999999999999",
    "int64-max": "9223372036854775807",
    "2-to-the-31": "2147483648",
    "zero": "0",
    "minus-one": "-1",
    "empty": "",
    "arabic-indic-one": "\u0661",
    "fullwidth-one": "\uff11",
    "twice": "1@1",
    "nul": "1\x00",
}


def _reference_cases() -> Iterator[Case]:
    for name, version in BAD_VERSIONS.items():
        ref = f"{BASE}@{version}"
        yield Case(
            f"plans-model-ref-{name}",
            "POST",
            "/api/v1/plans",
            body=encoded(plan_request(ref)),
            headers=JSON,
            where=("body", "model"),
        )
        yield Case(
            f"plans-calibration-ref-{name}",
            "POST",
            "/api/v1/plans",
            body=encoded({**plan_request(), "calibrations": [f"nvidia-h200@{version}"]}),
            headers=JSON,
            where=("body", "calibrations", 0),
        )
    for name, version in list(BAD_VERSIONS.items())[:4]:
        ref = f"{BASE}@{version}"
        yield Case(
            f"plans-fleet-ref-{name}",
            "POST",
            "/api/v1/plans",
            body=encoded(plan_request(fleet_=ref)),
            headers=JSON,
            where=("body", "fleet"),
        )
        yield Case(
            f"evaluate-fleet-ref-{name}",
            "POST",
            "/api/v1/plans/{plan}/evaluate",
            body=encoded({"fleet": ref}),
            headers=JSON,
            where=("body", "fleet"),
        )
        yield Case(
            f"port-model-ref-{name}",
            "POST",
            "/api/v1/port",
            body=encoded({"model": ref, "source_fleet": BASE, "target_fleet": BASE}),
            headers=JSON,
            where=("body", "model"),
        )
    for name, ref in [("unknown", "nobody"), ("unknown-version", f"{BASE}@99"), ("unicode-lookalike", "b\u0430se")]:
        status = (422,) if name == "unicode-lookalike" else (404,)
        yield Case(
            f"plans-model-ref-{name}",
            "POST",
            "/api/v1/plans",
            body=encoded(plan_request(ref)),
            headers=JSON,
            status=status,
            where=("body", "model") if status == (422,) else None,
        )
    yield Case(
        "plans-calibration-digest-not-stored",
        "POST",
        "/api/v1/plans",
        body=encoded({**plan_request(), "calibrations": ["0" * 64]}),
        headers=JSON,
        where=("body", "calibrations", 0),
    )
    yield Case(
        "plans-33-calibrations",
        "POST",
        "/api/v1/plans",
        body=encoded({**plan_request(), "calibrations": ["nvidia-h200@1"] * 33}),
        headers=JSON,
        where=("body", "calibrations"),
    )


BAD_NAMES = {
    "nul": "a\x00b",
    "unit-separator": "a\x1fb",
    "newline": "a\nb",
    "slash": "a/b",
    "dot-dot-slash": "../../etc/passwd",
    "dot-dot": "..",
    "dot": ".",
    "cyrillic-a": "b\u0430se",
    "greek-omicron": "m\u03bfdel",
    "fullwidth": "\uff4d\uff4f\uff44\uff45\uff4c",
    "right-to-left-override": "a\u202eb",
    "zero-width-space": "a\u200bb",
    "combining-accent": "e\u0301",
    "emoji": "model-\U0001f600",
    "space": "a b",
    "empty": "",
    "201-characters": "n" * 201,
    "percent-encoded": "a%2Fb",
    "query": "a?b=c",
    "html": "<script>alert(1)</script>",
}


def _name_cases() -> Iterator[Case]:
    for label, name in BAD_NAMES.items():
        # "/", ".." and "." match the inline pattern but cannot be registered: both answer 422 at the name
        yield Case(
            f"models-name-{label}",
            "POST",
            "/api/v1/models",
            body=encoded(small_model(name)),
            headers=JSON,
            where=("body", "name"),
        )
    for label in ("nul", "slash", "dot-dot-slash", "cyrillic-a", "right-to-left-override", "201-characters"):
        yield Case(
            f"fleets-name-{label}",
            "POST",
            "/api/v1/fleets",
            body=encoded(fleet(BAD_NAMES[label])),
            headers=JSON,
            where=("body", "name"),
        )
    for label in ("nul", "cyrillic-a", "emoji", "201-characters", "html"):
        yield Case(
            f"plans-table-name-{label}",
            "POST",
            "/api/v1/plans",
            body=encoded(plan_request(at(small_model("names"), ("embedding_tables", 0, "name"), BAD_NAMES[label]))),
            headers=JSON,
            where=("body", "model", "embedding_tables", 0, "name"),
        )
    for label, name in [
        ("uppercase", "Lab-X"),
        ("slash", "lab/x"),
        ("dot-dot-slash", "../lab"),
        ("65-characters", "l" * 65),
        ("cyrillic-a", "l\u0430b"),
        ("nul", "lab\x00"),
    ]:
        yield Case(
            f"hwprofiles-name-{label}",
            "POST",
            "/api/v1/hwprofiles",
            body=encoded(custom_profile(name)),
            headers=JSON,
            where=("body", "name"),
        )
    yield Case(
        "hwprofiles-catalogue-name",
        "POST",
        "/api/v1/hwprofiles",
        body=encoded(custom_profile("nvidia-h100-sxm")),
        headers=JSON,
        status=(409,),
    )
    for label, gpu in [("8MB", "g" * 8_000_000), ("nul", "h100\x00"), ("unknown", "nvidia-h100-sxm\u200b")]:
        yield Case(
            f"fleets-gpu-{label}",
            "POST",
            "/api/v1/fleets",
            body=encoded({"name": "gpus", "hosts": [{"gpu": gpu}]}),
            headers=JSON,
            where=("body", "hosts", 0, "gpu"),
        )
    yield Case(
        "calibrations-profile-unknown",
        "POST",
        "/api/v1/calibrations",
        body=encoded(calibration("lab-nobody")),
        headers=JSON,
        where=("body", "profile"),
    )
    yield Case(
        "calibrations-unicode-date",
        "POST",
        "/api/v1/calibrations",
        body=encoded(calibration(date="\u0662\u0660\u0662\u0666-\u0661\u0662-\u0660\u0661")),
        headers=JSON,
        where=("body", "date"),
    )


# ------------------------------------------------------------------------------------------------- paths and queries

LONG = "n" * 15_000  # uvicorn refuses a request head over 16 KiB itself (a case below)
ITEM_PATHS = {  # GET routes with a name or an id in the path; the value goes where {x} is
    "plan": "/api/v1/plans/{x}",
    "plan-torchrec": "/api/v1/plans/{x}/torchrec",
    "plan-by-key": "/api/v1/plans/by-key/{x}",
    "job": "/api/v1/jobs/{x}",
    "model": "/api/v1/models/{x}",
    "model-version": "/api/v1/models/base/{x}",
    "fleet": "/api/v1/fleets/{x}",
    "fleet-version": "/api/v1/fleets/{x}/1",
    "hwprofile": "/api/v1/hwprofiles/{x}",
    "calibration-digest": "/api/v1/calibrations/{x}",
    "calibration-version": "/api/v1/calibrations/nvidia-h200/{x}",
}
BAD_SEGMENTS = {  # already percent-encoded: sent as they are
    "nul": ("%00", (422,)),
    "invalid-utf8": ("%FF%FE", (404, 422)),
    "15k-characters": (LONG, (404, 422)),
    "int64-max": ("9223372036854775807", (404, 422)),
    "superscript-two": ("%C2%B2", (404, 422)),
    "encoded-slash": ("..%2F..%2Fetc%2Fpasswd", (404, 422)),
    "sql": ("%27%3B%20DROP%20TABLE%20plans%3B--", (404, 422)),
}


def _path_cases() -> Iterator[Case]:
    for route, template in ITEM_PATHS.items():
        for label, (segment, status) in BAD_SEGMENTS.items():
            if label in {"superscript-two", "sql"} and route not in {"model-version", "plan", "calibration-digest"}:
                continue
            yield Case(f"get-{route}-{label}", "GET", template.replace("{x}", segment), status=status)
    for label, (segment, status) in list(BAD_SEGMENTS.items())[:3]:
        yield Case(f"delete-plan-{label}", "DELETE", f"/api/v1/plans/{segment}", status=status)
        yield Case(
            f"evaluate-plan-{label}",
            "POST",
            f"/api/v1/plans/{segment}/evaluate",
            body=encoded({"fleet": fleet("e")}),
            headers=JSON,
            status=status,
        )
        yield Case(
            f"replan-plan-{label}",
            "POST",
            f"/api/v1/plans/{segment}/replan",
            body=encoded({"fleet": fleet("e")}),
            headers=JSON,
            status=status,
        )
        yield Case(f"ui-plan-{label}", "GET", f"/ui/plans/{segment}", status=status, html=True)
    yield Case("get-model-version-negative", "GET", "/api/v1/models/base/-1", where=("path", "version"))
    yield Case("get-model-version-float", "GET", "/api/v1/models/base/1e3", where=("path", "version"))
    yield Case("get-calibration-digest-uppercase", "GET", "/api/v1/calibrations/" + "A" * 64, where=("path", "digest"))
    yield Case("get-calibration-digest-not-stored", "GET", "/api/v1/calibrations/" + "0" * 64, status=(404,))
    yield Case("get-plan-by-key-not-stored", "GET", "/api/v1/plans/by-key/sha256:" + "0" * 64, status=(404,))
    yield Case("get-plan-by-key-uppercase", "GET", "/api/v1/plans/by-key/sha256:" + "A" * 64, status=(422,))
    yield Case("get-plan-by-key-no-prefix", "GET", "/api/v1/plans/by-key/" + "0" * 64, status=(422,))
    yield Case("get-dot-dot-out-of-the-api", "GET", "/api/v1/models/..%2F..%2F..%2Fhealthz", status=(404,))
    yield Case("get-unknown-api-path", "GET", "/api/v1/nothing", status=(404,))
    yield Case("get-ui-unknown", "GET", "/ui/%00", status=(404, 422), html=True)


def _query_cases() -> Iterator[Case]:
    for route in ("/api/v1/plans", "/api/v1/models", "/api/v1/fleets", "/api/v1/calibrations"):
        short = route.rsplit("/", 1)[1]
        for label, params in [
            ("page-0", [("page", "0")]),
            ("page-1e30", [("page", "1" + "0" * 30)]),
            ("page-nan", [("page", "NaN")]),
            ("limit-minus-one", [("limit", "-1")]),
            ("limit-int64", [("limit", "9223372036854775807")]),
        ]:
            yield Case(f"list-{short}-{label}", "GET", route, params=params, where=("query",))
    for name, label, value in [
        ("model", "nul", "a\x00b"),
        ("fleet", "nul", "a\x00b"),
        ("gpu", "nul", "\x00"),
        ("gpu", "delete", "\x7f"),
        ("model", "201-characters", "m" * 201),
    ]:
        yield Case(
            f"list-plans-filter-{name}-{label}",
            "GET",
            "/api/v1/plans",
            params=[(name, value)],
            where=("query", name),
        )
    for name, value in [
        ("status", "bogus"),
        ("created_after", "not-a-date"),
        ("created_after", "99999-01-01"),
        ("created_before", "2026-13-45T99:99:99"),
    ]:
        yield Case(f"list-plans-{name}-{value}", "GET", "/api/v1/plans", params=[(name, value)], where=("query", name))
    yield Case("list-models-name-nul", "GET", "/api/v1/models", params=[("name", "\x00")], where=("query", "name"))
    yield Case("list-fleets-name-8k", "GET", "/api/v1/fleets", params=[("name", "f" * 8000)], where=("query", "name"))
    yield Case(
        "list-calibrations-profile-nul",
        "GET",
        "/api/v1/calibrations",
        params=[("profile", "a\x00")],
        where=("query", "profile"),
    )
    yield Case("list-plans-query-name-nul", "GET", "/api/v1/plans", params=[("\x00", "1")], where=("query",))
    yield Case(
        "list-plans-page-twice", "GET", "/api/v1/plans", params=[("page", "1"), ("page", "x")], status=(200, 422)
    )
    yield Case(
        "list-plans-gpu-63-characters", "GET", "/api/v1/plans", params=[("gpu", LONG_PROFILES[-1])], status=(200,)
    )
    yield Case(
        "list-plans-unknown-params",
        "GET",
        "/api/v1/plans",
        params=[("x" * 100, "y" * 1000), ("__proto__", "1")],
        status=(200,),
    )
    yield Case(
        "torchrec-module-fqn-empty",
        "GET",
        "/api/v1/plans/{plan}/torchrec",
        params=[("module_fqn", "")],
        where=("query", "module_fqn"),
    )
    yield Case(
        "torchrec-device-type-shell",
        "GET",
        "/api/v1/plans/{plan}/torchrec",
        params=[("device_type", "cuda; rm -rf /")],
        where=("query", "device_type"),
    )
    yield Case(
        "torchrec-module-fqn-nul",
        "GET",
        "/api/v1/plans/{plan}/torchrec",
        params=[("module_fqn", "a\x00")],
        where=("query", "module_fqn"),
    )
    for path in ("/healthz", "/readyz", "/metrics", "/api/v1/hwprofiles", "/api/v1/jobs/{plan}"):
        yield Case(f"get-{path}-nul-in-query", "GET", path, params=[("x", "\x00")], where=("query", "x"))
    for path, status in (("/healthz", 200), ("/readyz", 200), ("/metrics", 200), ("/api/v1/hwprofiles", 200)):
        yield Case(
            f"get-{path}-with-a-body-and-junk",
            "GET",
            path,
            params=[("q" * 50, "v" * 8000)],
            body=encoded({"name": "x" * 100_000}),
            headers=JSON,
            status=(status,),
        )
    for label, params in [
        ("metric-unknown", [("metric", "<script>")]),
        ("metric-8k", [("metric", "m" * 8000)]),
        ("metric-nul", [("metric", "\x00")]),
    ]:
        yield Case(
            f"ui-fleet-{label}", "GET", "/ui/plans/{plan}/fleet", params=params, status=(200, 400, 422), html=True
        )
    yield Case("ui-fleet-unknown-plan", "GET", "/ui/plans/%FF%FE/fleet", status=(404, 422), html=True)
    for label, params in [
        ("same-plan", [("a", "{plan}"), ("b", "{plan}")]),
        ("unknown", [("a", "x" * 5000), ("b", "{plan}")]),
        ("nul", [("a", "{plan}"), ("b", "\x00")]),
    ]:
        yield Case(
            f"ui-compare-port-{label}", "GET", "/ui/compare/port", params=params, status=(200, 404, 422), html=True
        )
    yield Case(
        "ui-plans-page-minus-one", "GET", "/ui/plans", params=[("page", "-1")], status=(200, 400, 422), html=True
    )
    yield Case("ui-plans-gpu-nul", "GET", "/ui/plans", params=[("gpu", "\x00")], status=(200, 400, 422), html=True)
    yield Case(
        "ui-compare-unknown",
        "GET",
        "/ui/compare",
        params=[("a", "x" * 5000), ("b", "\x00")],
        status=(200, 404, 422),
        html=True,
    )


# ------------------------------------------------------------------------------------------------- methods

WRONG_METHODS = [
    ("PUT", "/api/v1/plans"),
    ("PATCH", "/api/v1/plans/{plan}"),
    ("PUT", "/api/v1/plans/{plan}"),
    ("DELETE", "/api/v1/plans"),
    ("POST", "/api/v1/plans/{plan}"),
    ("GET", "/api/v1/plans/{plan}/evaluate"),
    ("DELETE", "/api/v1/plans/{plan}/torchrec"),
    ("DELETE", "/api/v1/jobs/00000000-0000-0000-0000-000000000000"),
    ("POST", "/api/v1/jobs/00000000-0000-0000-0000-000000000000"),
    ("DELETE", "/api/v1/models/base"),
    ("PUT", "/api/v1/models/base/1"),
    ("PATCH", "/api/v1/fleets/base"),
    ("DELETE", "/api/v1/fleets/base/1"),
    ("DELETE", "/api/v1/hwprofiles/lab-base"),
    ("PUT", "/api/v1/hwprofiles/lab-base"),
    ("DELETE", "/api/v1/calibrations/nvidia-h200/1"),
    ("PUT", "/api/v1/calibrations"),
    ("GET", "/api/v1/port"),
    ("POST", "/healthz"),
    ("DELETE", "/readyz"),
    ("POST", "/metrics"),
    ("POST", "/openapi.json"),
    ("TRACE", "/api/v1/plans"),
]


def _method_cases() -> Iterator[Case]:
    for method, path in WRONG_METHODS:
        yield Case(f"{method}-{path}", method, path, body=encoded({"name": "x"}), headers=JSON, status=(405,))
    yield Case("POST-ui-plans", "POST", "/ui/plans", body=encoded({}), headers=JSON, status=(405,), html=True)
    yield Case("OPTIONS-plans", "OPTIONS", "/api/v1/plans", status=(405,))
    yield Case(
        "DELETE-plan-twice-unknown", "DELETE", "/api/v1/plans/00000000-0000-0000-0000-000000000000", status=(404,)
    )


# ------------------------------------------------------------------------------------------------- HTTP itself


def _http(request_line: bytes, headers: list[bytes], body: bytes = b"") -> Callable[[], bytes]:
    return lambda: request_line + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def _protocol_cases() -> Iterator[Case]:
    body = json.dumps(small_model("wire")).encode()
    host = b"Host: 127.0.0.1"
    post = b"POST /api/v1/models HTTP/1.1"
    yield Case(
        "http-content-length-not-a-number",
        "POST",
        "/api/v1/models",
        raw=_http(post, [host, b"Content-Type: application/json", b"Content-Length: abc", b"Connection: close"], body),
        status=(400,),
        by_server=True,
    )
    yield Case(
        "http-content-length-negative",
        "POST",
        "/api/v1/models",
        raw=_http(post, [host, b"Content-Type: application/json", b"Content-Length: -5", b"Connection: close"], body),
        status=(400,),
        by_server=True,
    )
    yield Case(
        "http-content-length-and-chunked",
        "POST",
        "/api/v1/models",
        raw=_http(
            post,
            [
                host,
                b"Content-Type: application/json",
                b"Content-Length: 3",
                b"Transfer-Encoding: chunked",
                b"Connection: close",
            ],
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
        ),
        status=(201, 400),  # RFC 9112: chunked wins over Content-Length (or the server refuses both)
        stores=True,
        by_server=True,
    )
    over = b"[" + b" " * (9 * 1024 * 1024) + b"]"
    yield Case(
        "http-chunked-over-the-cap",
        "POST",
        "/api/v1/models",
        raw=_http(
            post,
            [host, b"Content-Type: application/json", b"Transfer-Encoding: chunked", b"Connection: close"],
            b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (over[i : i + 65536] for i in range(0, len(over), 65536)))
            + b"0\r\n\r\n",
        ),
        status=(413,),
    )
    yield Case(
        "http-header-64KiB",
        "GET",
        "/api/v1/plans",
        raw=_http(b"GET /api/v1/plans HTTP/1.1", [host, b"X-Big: " + b"b" * 65536, b"Connection: close"]),
        status=(200, 400, 413, 431),
        by_server=True,
    )
    yield Case(
        "http-url-60k-characters",
        "GET",
        "/api/v1/plans/n...",
        raw=_http(b"GET /api/v1/plans/" + b"n" * 60_000 + b" HTTP/1.1", [host, b"Connection: close"]),
        status=(404,),  # a small problem: the 60,000 characters are not echoed
    )
    yield Case(
        "http-raw-nul-in-path",
        "GET",
        "/api/v1/models/a\x00b",
        raw=_http(b"GET /api/v1/models/a\x00b HTTP/1.1", [host, b"Connection: close"]),
        status=(400, 422),
        by_server=True,
    )
    yield Case(
        "http-absolute-form-other-host",
        "GET",
        "/api/v1/plans",
        raw=_http(b"GET http://evil.example/api/v1/plans HTTP/1.1", [host, b"Connection: close"]),
        status=(200, 400, 404),
    )
    yield Case(
        "http-utf16-json",
        "POST",
        "/api/v1/models",
        body=lambda: json.dumps(small_model("utf16")).encode("utf-16"),
        headers={"content-type": "application/json; charset=utf-16"},
        status=(201, 422),
        stores=True,
    )
    yield Case(
        "http-gzip-content-encoding",
        "POST",
        "/api/v1/models",
        body=lambda: b"\x1f\x8b\x08\x00" + b"\x00" * 20,
        headers={"content-type": "application/json", "content-encoding": "gzip"},
        where=("body",),
    )
    yield Case(
        "http-content-type-huge-parameter",
        "POST",
        "/api/v1/models",
        body=encoded(small_model("ct")),
        headers={"content-type": "application/json; x=" + "y" * 8000},
        status=(201, 200, 415),
        stores=True,
    )


# ------------------------------------------------------------------------------------------------- accepted


def _accepted_cases() -> Iterator[Case]:
    """Odd but valid: answered 2xx, stored, and what they stored reads back."""
    zoo = {"name": "zoo", "hosts": [{"gpu": n, "count": 1, "gpus_per_host": 1} for n in LONG_PROFILES]}
    yield Case(
        "plans-20-host-groups-of-63-character-profiles",
        "POST",
        "/api/v1/plans",
        body=encoded(plan_request(small_model(tables=2), zoo)),
        headers=JSON,
        status=(200, 201),
        stores=True,
    )
    yield Case(
        "fleets-20-host-groups-of-63-character-profiles",
        "POST",
        "/api/v1/fleets",
        body=encoded(zoo),
        headers=JSON,
        status=(200, 201),
        stores=True,
    )
    yield Case(
        "evaluate-on-20-host-groups",
        "POST",
        "/api/v1/plans/{plan}/evaluate",
        body=encoded({"fleet": zoo}),
        headers=JSON,
        status=(200,),
    )
    yield Case(
        "calibrations-of-a-63-character-profile",
        "POST",
        "/api/v1/calibrations",
        body=encoded(calibration(LONG_PROFILES[3])),
        headers=JSON,
        status=(200, 201),
        stores=True,
    )
    yield Case(
        "models-name-of-200-characters",
        "POST",
        "/api/v1/models",
        body=encoded(small_model("m" * 200)),
        headers=JSON,
        status=(200, 201),
        stores=True,
    )
    yield Case(
        "models-name-with-brackets-and-colons",
        "POST",
        "/api/v1/models",
        body=encoded(small_model("dlrm:v2[a]-_.x")),
        headers=JSON,
        status=(200, 201),
        stores=True,
    )
    yield Case(
        "plans-inline-model-named-dot-dot-slash",
        "POST",
        "/api/v1/plans",
        body=encoded(plan_request(small_model("../../x"))),
        headers=JSON,
        status=(200, 201),
        stores=True,
    )
    big = small_model("big", tables=1)
    big["embedding_tables"][0].update(num_embeddings=10**13, embedding_dim=128, pooling_factor=1e5)
    yield Case(
        "plans-largest-table-in-bounds",
        "POST",
        "/api/v1/plans",
        body=encoded(plan_request(big)),
        headers=JSON,
        status=(201, 422),
        stores=True,
    )
    yield Case(
        "plans-json-with-bom-and-whitespace",
        "POST",
        "/api/v1/plans",
        body=lambda: b"\xef\xbb\xbf \n\t" + json.dumps(plan_request()).encode(),
        headers=JSON,
        status=(200, 201, 422),
        stores=True,
    )
    yield Case(
        "plans-vendor-json-media-type",
        "POST",
        "/api/v1/plans",
        body=encoded(plan_request()),
        headers={"content-type": "application/vnd.shardwise+json; charset=UTF-8"},
        status=(200, 201),
        stores=True,
    )


# ------------------------------------------------------------------------------------------------- the pages' forms

FORM = {"content-type": "application/x-www-form-urlencoded"}


def _form(text: bytes) -> Callable[[], bytes]:
    return lambda: text


def _page_form_cases() -> Iterator[Case]:
    """The pages' POST forms (login, logout, delete) with what a browser would never send. Without a CSRF token a
    form is a 403 page and nothing changes (the plan is not deleted: the row counts say so)."""
    for path in ("/ui/login", "/ui/logout", "/ui/plans/{plan}/delete"):
        short = path.split("/")[-1]
        yield Case(
            f"form-{short}-no-csrf", "POST", path, body=_form(b"token=x"), headers=FORM, status=(403,), html=True
        )
        yield Case(
            f"form-{short}-as-json",
            "POST",
            path,
            body=encoded({"token": "x"}),
            headers=JSON,
            status=(400, 403),
            html=True,
        )
        yield Case(
            f"form-{short}-invalid-utf8",
            "POST",
            path,
            body=_form(b"token=\xff\xfe"),
            headers=FORM,
            status=(400, 403),
            html=True,
        )
        yield Case(
            f"form-{short}-100k-fields",
            "POST",
            path,
            body=_form(b"&".join(b"f%d=1" % i for i in range(100_000))),
            headers=FORM,
            status=(400, 403),
            html=True,
        )
        yield Case(
            f"form-{short}-over-the-cap",
            "POST",
            path,
            body=_form(b"a=" + b"x" * (9 * 1024 * 1024)),
            headers=FORM,
            status=(413,),
        )
    yield Case(
        "form-login-nul-and-8MB-token",
        "POST",
        "/ui/login",
        body=_form(b"token=%00" + b"t" * 8_000_000 + b"&next=%2F%2Fevil.example"),
        headers=FORM,
        status=(400, 403),
        html=True,
    )
    yield Case(
        "form-delete-plan-nul",
        "POST",
        "/ui/plans/%00/delete",
        body=_form(b"x=1"),
        headers=FORM,
        status=(403, 422),
        html=True,
    )
    for label, target in [("other-host", "//evil.example/"), ("javascript", "javascript:alert(1)"), ("nul", "/ui\x00")]:
        yield Case(
            f"get-login-next-{label}", "GET", "/ui/login", params=[("next", target)], status=(200, 422), html=True
        )


def all_cases() -> list[Case]:
    cases = [c for route in JSON_ROUTES for c in (*_json_syntax_cases(route), *_content_type_cases(route))]
    for group in (
        _page_form_cases,
        _number_cases,
        _reference_cases,
        _name_cases,
        _path_cases,
        _query_cases,
        _method_cases,
        _protocol_cases,
        _accepted_cases,
    ):
        cases += group()
    ids = [c.id for c in cases]
    duplicates = {i for i in ids if ids.count(i) > 1}
    assert not duplicates, duplicates
    return cases
