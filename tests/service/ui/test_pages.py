"""The web pages at the HTML level, in process: plans made by the real API, pages parsed with selectolax.

One migrated SQLite database for the module and real solver processes; isolation is by emptying every table after
each test (as in ``tests/service``), since solves run in separate processes that must see committed rows. Only
SQLite: the pages read through the same repository functions the API tests run on PostgreSQL too.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from selectolax.lexbor import LexborHTMLParser, LexborNode

import shardwise
from service_support import SLOW, empty_tables, slow_model
from shardwise.service.app import create_app
from shardwise.service.routers.ui.formatting import rate
from shardwise.service.routers.ui.plan import kernels_view
from shardwise.service.runners import LocalRunner
from shardwise.service.settings import Settings
from shardwise.solver.build import build_plan
from shardwise.solver.planner import make_plan
from shardwise.solver.port import port_analysis
from shardwise.solver.topology import Topology
from shardwise.wire.resources import StoredPlan
from shardwise.wire.spec import (
    DensePlan,
    FleetSpec,
    GemmPhase,
    KernelChoice,
    KernelConfig,
    ModelSpec,
    SolveParams,
)
from ui_support import (
    GREEDY,
    big_fleet,
    fleet,
    hot_model,
    mixed_fleet,
    module_database,
    post_plan,
    small_model,
    solver_pool,
    store_plan_directly,
)

BAR_UNITS = 1000.0


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return module_database(tmp_path_factory, "ui-db")


@pytest.fixture(scope="module")
def runner(database_url: str) -> Iterator[LocalRunner]:
    yield from solver_pool(database_url)


@pytest.fixture
def clean_db(database_url: str) -> Iterator[str]:
    yield database_url
    empty_tables(database_url)


@pytest.fixture
def client(clean_db: str, runner: LocalRunner) -> Iterator[TestClient]:
    settings = Settings(database_url=clean_db, log_json=True, log_level="WARNING", wait_s=30.0)
    with TestClient(create_app(settings, runner=runner)) as c:
        yield c


def page(client: TestClient, url: str, status: int = 200, **kwargs: Any) -> LexborHTMLParser:
    response = client.get(url, **kwargs)
    assert response.status_code == status, response.text[:2000]
    assert response.headers["content-type"].startswith("text/html")
    return LexborHTMLParser(response.text)


def attr(node: LexborNode | None, name: str) -> str:
    assert node is not None
    value = node.attributes.get(name)
    assert value is not None, f"{node.tag} has no {name}"
    return value


def text(node: LexborNode | None) -> str:
    assert node is not None
    return " ".join(node.text(deep=True, separator=" ").split())


def history_ids(doc: LexborHTMLParser) -> list[str]:
    return [attr(tr, "data-plan-id") for tr in doc.css("#plan-rows tr.plan-row")]


def fills(plan: dict[str, Any]) -> dict[int, float]:
    return {r["rank"]: r["hbm_used_bytes"] / r["hbm_capacity_bytes"] for r in plan["ranks"]}


# ------------------------------------------------------------------------------------------------- history


def test_root_redirects_to_the_history(client: TestClient) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 302
    assert response.headers["location"] == "/ui/plans"


def test_history_lists_plans_newest_first(client: TestClient) -> None:
    made = [
        post_plan(client, small_model("alpha"), fleet("h100x2")),
        post_plan(client, small_model("beta"), fleet("h200x4", gpu="nvidia-h200", gpus=4)),
        post_plan(client, hot_model(), mixed_fleet()),
    ]
    api = client.get("/api/v1/plans").json()["items"]
    doc = page(client, "/ui/plans")
    assert history_ids(doc) == [p["id"] for p in api]  # the API's order: newest first
    assert set(history_ids(doc)) == {p["id"] for p in made}

    rows = {attr(tr, "data-plan-id"): tr for tr in doc.css("#plan-rows tr.plan-row")}
    for item in api:
        tr = rows[item["id"]]
        assert text(tr.css_first("td.model")) == item["model"]
        assert item["fleet"] in text(tr.css_first("td.fleet"))
        assert {a.attributes["href"] for a in tr.css("a")} == {f"/ui/plans/{item['id']}"}
        assert f"{item['predicted_step_ms']:.3f} ms" in text(tr)
        assert text(tr.css_first(".status")) == "best found"  # greedy: a feasible plan, not proved optimal
        assert f"{item['peak_hbm_fill'] * 100:.1f}%" in text(tr.css_first("td.fill"))
    assert "2× nvidia-h100-sxm" in text(rows[made[0]["id"]].css_first("td.fleet"))
    assert "4× nvidia-h200" in text(rows[made[1]["id"]].css_first("td.fleet"))
    mixed = text(rows[made[2]["id"]].css_first("td.fleet"))
    assert "2× nvidia-h100-sxm" in mixed
    assert "2× nvidia-h200" in mixed
    hot_cells = [attr(tr, "data-plan-id") for tr in doc.css("#plan-rows tr.plan-row") if tr.css_first("td.fill.hot")]
    assert hot_cells == [made[2]["id"]]  # only the plan with a GPU over 90% has its mini bar flagged
    # the filter menus offer what the store holds
    assert [o.attributes["value"] for o in doc.css("select[name=model] option")] == ["", "alpha", "beta", "hot-dlrm"]
    gpus = [o.attributes["value"] for o in doc.css("select[name=gpu] option")]
    assert gpus == ["", "nvidia-h100-sxm", "nvidia-h200"]
    form = doc.css_first("form#filters")
    assert form is not None
    assert form.attributes["hx-get"] == "/ui/plans"
    assert form.attributes["hx-target"] == "#plan-results"
    assert form.attributes["hx-push-url"] == "true"


def test_history_filters(client: TestClient) -> None:
    a = post_plan(client, small_model("alpha"), fleet("h100x2"))
    b = post_plan(client, small_model("beta"), fleet("h200x4", gpu="nvidia-h200", gpus=4))
    c = post_plan(client, small_model("alpha", tables=2), fleet("h200x2", gpu="nvidia-h200"))
    too_big = small_model("huge", tables=1, rows=2_000_000_000, dim=512)
    response = client.post("/api/v1/plans", json={"model": too_big, "fleet": fleet(), "options": {"solver": "greedy"}})
    assert response.status_code == 422
    infeasible_id = response.json()["plan_id"]

    assert set(history_ids(page(client, "/ui/plans?model=alpha"))) == {a["id"], c["id"]}
    assert set(history_ids(page(client, "/ui/plans?gpu=nvidia-h200"))) == {b["id"], c["id"]}
    assert set(history_ids(page(client, "/ui/plans?fleet=h100x2"))) == {a["id"], infeasible_id}
    assert set(history_ids(page(client, "/ui/plans?model=alpha&gpu=nvidia-h200"))) == {c["id"]}
    only_bad = page(client, "/ui/plans?status=infeasible")
    assert history_ids(only_bad) == [infeasible_id]
    assert text(only_bad.css_first("#plan-rows .status")) == "infeasible"
    assert set(history_ids(page(client, "/ui/plans?status=feasible&model="))) == {a["id"], b["id"], c["id"]}

    none = page(client, "/ui/plans?model=nobody")
    assert history_ids(none) == []
    assert "No plan matches these filters" in text(none.css_first("#plan-rows"))
    assert attr(none.css_first("select[name=model] option[selected]"), "value") == "nobody"
    past = page(client, "/ui/plans?model=alpha&page=9")
    assert history_ids(past) == []
    assert "past the last one" in text(past.css_first("#plan-rows"))
    assert attr(past.css_first("#plan-rows a"), "href") == "/ui/plans?model=alpha"
    # the chosen values stay selected in the menus
    chosen = page(client, "/ui/plans?model=alpha&status=feasible")
    assert attr(chosen.css_first("select[name=model] option[selected]"), "value") == "alpha"
    assert attr(chosen.css_first("select[name=status] option[selected]"), "value") == "feasible"

    bad = page(client, "/ui/plans?status=done", status=400)
    assert "status must be one of" in text(bad.css_first(".detail"))
    page(client, "/ui/plans?page=0", status=400)
    page(client, "/ui/plans?limit=abc", status=400)


def test_history_paging_swaps_a_fragment(client: TestClient) -> None:
    made = [post_plan(client, small_model(f"m{i}"), fleet()) for i in range(3)]
    newest_first = [p["id"] for p in reversed(made)]

    response = client.get("/ui/plans?limit=2", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert "HX-Request" in response.headers["vary"]
    assert response.headers["hx-push-url"] == "/ui/plans?limit=2"  # canonical: no empty fields, no page=1
    assert "<html" not in response.text  # a fragment, not a page
    frag = LexborHTMLParser(response.text)
    results = frag.css("div#plan-results")
    assert len(results) == 1
    assert history_ids(frag) == newest_first[:2]
    assert frag.css_first("form#filters") is None
    nxt = frag.css_first(".pager a.next")
    assert nxt is not None
    assert attr(nxt, "hx-get") == "/ui/plans?limit=2&page=2"
    assert attr(nxt, "href") == attr(nxt, "hx-get")  # works without JavaScript too
    assert attr(nxt, "hx-target") == "#plan-results"
    assert attr(nxt, "hx-swap") == "outerHTML"
    assert attr(nxt, "hx-push-url") == "true"
    assert frag.css_first(".pager a.prev") is None
    assert "page 1 of 2" in text(frag.css_first(".pager .count"))

    response = client.get("/ui/plans?model=&limit=2&page=2&gpu=", headers={"HX-Request": "true"})
    assert response.headers["hx-push-url"] == "/ui/plans?limit=2&page=2"
    second = LexborHTMLParser(response.text)
    assert history_ids(second) == newest_first[2:]
    prev = second.css_first(".pager a.prev")
    assert prev is not None
    assert attr(prev, "hx-get") == "/ui/plans?limit=2"
    assert second.css_first(".pager a.next") is None

    # the same URL without htmx (a reload, a bookmark) is the whole page; so is htmx's history restore
    full = page(client, "/ui/plans?limit=2&page=2")
    assert full.css_first("form#filters") is not None
    assert history_ids(full) == newest_first[2:]
    restore = client.get("/ui/plans?limit=2", headers={"HX-Request": "true", "HX-History-Restore-Request": "true"})
    assert "<html" in restore.text


# ------------------------------------------------------------------------------------------------- one plan


def test_plan_page_one_bar_per_gpu_with_widths_proportional_to_bytes(client: TestClient) -> None:
    plan = post_plan(client, hot_model(), mixed_fleet())
    doc = page(client, f"/ui/plans/{plan['id']}")
    bars = doc.css("svg.hbm-bar")
    assert len(bars) == len(plan["ranks"]) == 4
    assert doc.css_first(".hbm-heatmap") is None

    scale = BAR_UNITS / max(r["hbm_capacity_bytes"] for r in plan["ranks"])
    for bar, rank in zip(bars, plan["ranks"], strict=True):
        assert int(attr(bar, "data-rank")) == rank["rank"]
        segments = bar.css("rect.seg")
        assert segments, "every rank stores something (dense layers at least)"
        by_kind = {attr(s, "class").split()[1].removeprefix("seg-"): int(attr(s, "data-bytes")) for s in segments}
        assert by_kind == {k: v for k, v in rank["hbm_breakdown"].items() if v}
        assert sum(by_kind.values()) == rank["hbm_used_bytes"]
        x = 0.0
        for s in segments:  # stacked left to right, each as long as its bytes on the plan's one scale
            width = float(attr(s, "width"))
            assert width == pytest.approx(int(attr(s, "data-bytes")) * scale, abs=2e-3)
            assert float(attr(s, "x")) == pytest.approx(x, abs=2e-3)
            x += width
        cap = bar.css_first("rect.cap")
        assert cap is not None
        assert float(attr(cap, "width")) == pytest.approx(rank["hbm_capacity_bytes"] * scale, abs=2e-3)
        limit = bar.css_first("line.limit")
        assert limit is not None
        assert float(attr(limit, "x1")) == pytest.approx(
            math.floor(rank["hbm_capacity_bytes"] * 0.95) * scale, abs=2e-3
        )
        assert bar.css_first("rect.reserve") is not None
    # the H200s are longer bars than the H100s: one scale for the fleet
    widths = [float(attr(b.css_first("rect.cap"), "width")) for b in bars]
    assert widths[0] < widths[2] == BAR_UNITS

    # per-rank time split compute / comm, on one scale too
    time_bars = doc.css("svg.time-bar")
    assert len(time_bars) == 4
    tscale = BAR_UNITS / max(r["predicted_ms"]["compute"] + r["predicted_ms"]["comm"] for r in plan["ranks"])
    for bar, rank in zip(time_bars, plan["ranks"], strict=True):
        compute, comm = bar.css_first("rect.t-compute"), bar.css_first("rect.t-comm")
        assert compute is not None
        assert comm is not None
        assert float(attr(compute, "width")) == pytest.approx(rank["predicted_ms"]["compute"] * tscale, abs=2e-3)
        assert float(attr(comm, "width")) == pytest.approx(rank["predicted_ms"]["comm"] * tscale, abs=2e-3)
        row = doc.css_first(f"tr.rank[data-rank='{rank['rank']}']")
        assert f"{rank['predicted_ms']['compute']:.3f} ms" in text(row)
        assert f"{rank['predicted_ms']['comm']:.3f} ms" in text(row)
        assert f"{rank['hbm_used_bytes'] / 1e9:.1f} GB" in text(row)


def test_plan_page_flags_ranks_over_90_percent(client: TestClient) -> None:
    plan = post_plan(client, hot_model(), mixed_fleet())
    expected = {r for r, f in fills(plan).items() if f > 0.9}
    assert expected, "the fixture must fill a GPU past 90%"
    assert len(expected) < len(plan["ranks"]), "and leave another below it"
    doc = page(client, f"/ui/plans/{plan['id']}")
    flagged = {int(attr(tr, "data-rank")) for tr in doc.css("tr.rank.hot")}
    assert flagged == expected
    assert {int(attr(b, "data-rank")) for b in doc.css("svg.hbm-bar.hot")} == expected
    for r in expected:
        assert "over 90%" in text(doc.css_first(f"tr.rank[data-rank='{r}'] .flag"))
    assert "over 90% of HBM" in text(doc.css_first(".alert.hot-ranks"))

    calm = post_plan(client, small_model(), fleet())
    calm_doc = page(client, f"/ui/plans/{calm['id']}")
    assert calm_doc.css("tr.rank.hot") == []
    assert calm_doc.css_first(".alert.hot-ranks") is None


def test_plan_page_tables_explanation_links_and_snippet(client: TestClient) -> None:
    plan = post_plan(client, hot_model(), mixed_fleet())
    doc = page(client, f"/ui/plans/{plan['id']}")
    head = text(doc.css_first(".plan-head"))
    assert "hot-dlrm" in head
    assert "best found" in head
    assert f"{plan['predicted_step_ms']:.3f} ms" in head

    rows = {attr(tr, "data-table"): tr for tr in doc.css("#table-rows tr")}
    assert set(rows) == {t["name"] for t in plan["tables"]}
    for t in plan["tables"]:
        cells = text(rows[t["name"]])
        assert t["sharding_type"] in cells
        assert {s["placement"] for s in t["shards"]} <= set(cells.split())
        ranks = sorted({s["rank"] for s in t["shards"]})
        shown = text(rows[t["name"]].css_first(".ranks-cell"))
        # runs of consecutive ranks as a–b, the runs apart by commas ([0, 1, 2, 5] → "0–2, 5")
        runs: list[list[int]] = []
        for r in ranks:
            if runs and r == runs[-1][-1] + 1:
                runs[-1].append(r)
            else:
                runs.append([r])
        assert shown == ", ".join(str(x[0]) if len(x) == 1 else f"{x[0]}–{x[-1]}" for x in runs)
    big = text(rows["big"])
    assert "270,000,000 × 128 fp32" in big
    assert "138.2 GB" in big
    search = doc.css_first("input#table-search")
    assert search is not None
    assert attr(search, "data-filter") == "#table-rows"

    assert [text(li) for li in doc.css(".explanation li")] == plan["explanation"]
    links = {attr(a, "href") for a in doc.css(".links a")}
    own, torchrec = f"/api/v1/plans/{plan['id']}", f"/api/v1/plans/{plan['id']}/torchrec"
    assert own in links
    assert client.get(own).status_code == 200
    # the TorchRec export is linked exactly where the route exports it (this plan's table_row_wise t0 on two of a
    # host's four GPUs has no TorchRec form: a 422, and no link)
    assert (torchrec in links) == (client.get(torchrec).status_code == 200)

    snippet = doc.css_first("code#snippet")
    assert snippet is not None
    # how to install it says what works: the checkout or the built wheel (shardwise is on no package index)
    install = text(doc.css_first(".apply p"))
    assert "pip install '.[torch]'" in install
    assert "make dist" in install
    assert "pip install shardwise[" not in install
    code = snippet.text()
    tree = ast.parse(code)  # valid Python
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert {("shardwise", "ShardwiseClient"), ("shardwise", "apply_plan")} <= imported  # the public API
    assert {name for module, name in imported if module == "shardwise"} <= set(shardwise.__all__)
    assert f'.get_plan("{plan["id"]}")' in code
    assert 'ShardwiseClient("http://testserver")' in code
    # the model the plan was made for goes with it (an inline model: the file it was planned from)
    assert "model_spec=spec" in code
    assert 'ModelSpec.model_validate_json(Path("model.json")' in code
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "apply_plan"]
    assert len(calls) == 1
    pytest.importorskip("torch")
    from shardwise import apply_plan

    inspect.signature(apply_plan).bind(*["arg"] * len(calls[0].args), **{k.arg: 0 for k in calls[0].keywords if k.arg})


@pytest.mark.parametrize(
    ("solver", "words"),
    [
        ("greedy", "no verdict: the greedy planner proves nothing of its plan"),
        ("cpsat", "no search ran: the answer came before it (the explanation says why)"),
    ],
)
def test_infeasible_plan_page_shows_why_first_and_no_layout(client: TestClient, solver: str, words: str) -> None:
    too_big = small_model("huge", tables=1, rows=2_000_000_000, dim=512)
    response = client.post("/api/v1/plans", json={"model": too_big, "fleet": fleet(), "options": {"solver": solver}})
    assert response.status_code == 422
    body = response.json()
    doc = page(client, f"/ui/plans/{body['plan_id']}")
    assert text(doc.css_first(".plan-head .status")) == "infeasible"
    assert [text(li) for li in doc.css(".explanation li")] == body["explanation"]
    # the reason comes first, right under the head (above the fleet, where a plan's layout would be), once
    sections = [attr(s, "class") for s in doc.css("main section")]
    assert sections.count("explanation") == 1
    assert sections.index("explanation") == sections.index("plan-head") + 1
    assert text(doc.css_first(".explanation h2")) == "Why no layout fits"
    # the solver's own status in words, not its raw code
    assert text(doc.css_first("dd.solver-status")) == words
    assert "HEURISTIC" not in text(doc.body)
    assert doc.css("svg.hbm-bar") == []
    assert doc.css_first("#snippet") is None  # nothing to apply
    assert all(not attr(a, "href").endswith("/torchrec") for a in doc.css(".links a"))


def legend(doc: LexborHTMLParser | LexborNode, side: str = "") -> tuple[float, float]:
    root = doc.css_first(f"#fleet{side}")
    assert root is not None
    return float(attr(root.css_first(".legend-min"), "data-value")), float(
        attr(root.css_first(".legend-max"), "data-value")
    )


METRIC_OF = {
    "fill": lambda r: r["hbm_used_bytes"] / r["hbm_capacity_bytes"],
    "step": lambda r: r["predicted_ms"]["total"],
    "compute": lambda r: r["predicted_ms"]["compute"],
    "comm": lambda r: r["predicted_ms"]["comm"],
}


def test_plan_page_draws_the_fleet_one_row_per_host_at_512_gpus(client: TestClient) -> None:
    plan = post_plan(client, small_model("wide", tables=6, rows=1_000_000), big_fleet())
    assert len(plan["ranks"]) == 512
    response = client.get(f"/ui/plans/{plan['id']}")
    assert response.status_code == 200
    assert len(response.content) < 150_000  # compact: one small cell per GPU, no per-rank bars
    assert response.headers["server-timing"].startswith("app;dur=")
    doc = LexborHTMLParser(response.text)
    assert doc.css("svg.hbm-bar") == []
    assert doc.css("tr.rank") == []
    fleet_map = doc.css_first("svg.fleet-map")
    assert attr(fleet_map, "role") == "img"
    assert text(fleet_map.css_first("title")).startswith("GPUs by host and local rank: HBM fill")
    assert "512 GPUs on 64 hosts" in text(fleet_map.css_first("desc"))
    hosts = fleet_map.css("g.host")
    assert len(hosts) == 64  # one row per host, never wrapped
    by_rank = {r["rank"]: r for r in plan["ranks"]}
    for i, g in enumerate(hosts):
        assert attr(g, "data-host") == str(i)
        assert attr(g, "data-gpu") == "nvidia-h100-sxm"
        assert text(g.css_first("text.host-label")).startswith(f"host {i} · nvidia-h100-sxm")
        cells = g.css("rect.gpu")
        assert [by_rank[int(attr(c, "data-rank"))]["host"] for c in cells] == [i] * 8
        assert [int(attr(c, "data-rank")) for c in cells] == list(range(8 * i, 8 * i + 8))  # local ranks in order
    assert [text(t) for t in fleet_map.css("text.col")] == [str(c) for c in range(8)]  # local-rank columns
    # the colour scale runs from the data's minimum to its maximum, and the legend says so
    values = [METRIC_OF["fill"](r) for r in plan["ranks"]]
    assert legend(doc) == (pytest.approx(min(values)), pytest.approx(max(values)))
    colours = {int(attr(c, "data-rank")): attr(c, "fill") for c in fleet_map.css("rect.gpu")}
    stops = [attr(s, "stop-color") for s in doc.css("#fleet linearGradient stop")]
    if max(values) > min(values):
        assert colours[values.index(min(values))] == stops[0]
        assert colours[values.index(max(values))] == stops[-1]
    # the extremes, ties collapsed: every rank in one group at most, the groups' counts are the ranks tied
    groups = doc.css("#fleet table.ties")[0].css("tr")
    top = max(values)
    assert int(attr(groups[0], "data-count")) == sum(1 for v in values if abs(v - top) < 1e-9)
    if int(attr(groups[0], "data-count")) > 1:
        assert text(groups[0]).startswith(f"{attr(groups[0], 'data-count')} ranks at ")


def test_the_page_draws_each_gpu_types_own_reserve(client: TestClient) -> None:
    """A fleet keeping back 6 GiB on its B300s and 10 % on its H200s: the head says both, and each rank's bar keeps
    its own type's reserve free."""
    fleet_ = {
        "name": "h200-b300",
        "hosts": [
            {"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 2},
            {"gpu": "nvidia-b300", "count": 1, "gpus_per_host": 2},
        ],
        "hbm_reserve_bytes": {"nvidia-b300": 6 * 2**30},
        "hbm_reserve_fraction": 0.1,
    }
    plan = post_plan(client, small_model("reserved"), fleet_)
    doc = page(client, f"/ui/plans/{plan['id']}")
    assert "HBM reserve 10%; nvidia-b300 6.44 GB" in text(doc.css_first(".plan-head"))
    kept = {}
    for rank in plan["ranks"]:
        bar = doc.css_first(f"svg.hbm-bar[data-rank='{rank['rank']}'] rect.reserve title")
        kept[rank["gpu"]] = text(bar)
    cap = {r["gpu"]: r["hbm_capacity_bytes"] for r in plan["ranks"]}
    assert kept["nvidia-b300"] == f"reserve: 6.4 GB kept free (limit {(cap['nvidia-b300'] - 6 * 2**30) / 1e9:.1f} GB)"
    h200_limit = math.floor(cap["nvidia-h200"] * 0.9)
    assert kept["nvidia-h200"] == (
        f"reserve: {(cap['nvidia-h200'] - h200_limit) / 1e9:.1f} GB kept free (limit {h200_limit / 1e9:.1f} GB)"
    )


def test_a_fleet_without_a_fraction_draws_each_types_runtime_reserve(client: TestClient) -> None:
    """No fraction set: both types keep back their profile's absolute runtime reserve (the catalogue's), the head
    names no percentage, and the H200's and the B300's bars keep the same bytes free."""
    fleet_ = {
        "name": "h200-b300-runtime",
        "hosts": [
            {"gpu": "nvidia-h200", "count": 1, "gpus_per_host": 2},
            {"gpu": "nvidia-b300", "count": 1, "gpus_per_host": 2},
        ],
    }
    plan = post_plan(client, small_model("runtime-reserved"), fleet_)
    doc = page(client, f"/ui/plans/{plan['id']}")
    head = text(doc.css_first(".plan-head"))
    assert "HBM reserve nvidia-b300 7.04 GB; nvidia-h200 7.04 GB" in head
    assert "%" not in head.split("HBM reserve")[1]
    kept = {
        r["gpu"]: text(doc.css_first(f"svg.hbm-bar[data-rank='{r['rank']}'] rect.reserve title")) for r in plan["ranks"]
    }
    cap = {r["gpu"]: r["hbm_capacity_bytes"] for r in plan["ranks"]}
    for gpu in ("nvidia-h200", "nvidia-b300"):
        assert kept[gpu] == f"reserve: 7.0 GB kept free (limit {(cap[gpu] - 7_037_879_808) / 1e9:.1f} GB)"


def test_a_dlrmv3_scale_sequence_plan_reads_on_one_page(client: TestClient) -> None:
    """The benchmark's DLRMv3-scale model (a 1 B-row fp16 item table, unpooled, on 256 B200 + MI350X GPUs): the page
    stays compact, says what each table looks up a sample — a row per id for the sequence tables — and shows both GPU
    types, one row per host."""
    from benchmarks.instances import get

    model, fleet_ = get("dlrmv3-g256-mixed")
    plan = post_plan(client, model.model_dump(mode="json"), fleet_.model_dump(mode="json"))
    response = client.get(f"/ui/plans/{plan['id']}")
    assert response.status_code == 200
    assert len(response.content) < 150_000
    doc = LexborHTMLParser(response.text)
    rows = {attr(tr, "data-table"): tr for tr in doc.css("#table-rows tr")}
    item = text(rows["item"])
    assert "1,000,000,000 × 512 fp16" in item
    assert text(rows["item"].css_first(".lookups")) == "unpooled: 544 ids (p99 4,096) × 2 features"
    assert text(rows["user"].css_first(".lookups")) == "unpooled: 1 id"
    shards = {t["name"]: len(t["shards"]) for t in plan["tables"]}
    assert item.split()[-1] == str(shards["item"])  # the shard count, last
    hosts = doc.css("svg.fleet-map g.host")
    assert len(hosts) == 32
    assert {attr(g, "data-gpu") for g in hosts} == {"nvidia-b200", "amd-mi350x"}
    assert "Lower bound (any plan)" in text(doc.css_first(".plan-head"))


def test_a_grid_plan_reads_on_its_page_and_exports_to_torchrec(client: TestClient) -> None:
    """Four small hot tables on 8 hosts of 8 H100s (1D): each is a grid — column bands, one to a host, each band cut
    into a row block per GPU of its host. The page names the layout, its GPUs and shards; the TorchRec export linked
    from it is TorchRec's grid_shard."""
    tables = [
        {"name": f"t{i}", "num_embeddings": 200_000, "embedding_dim": 256, "pooling_factor": 20.0} for i in range(4)
    ]
    model = {"name": "hot-grid", "batch_size_per_gpu": 8192, "embedding_tables": tables}
    options = {"solver": "greedy", "sparse_2d": False}
    response = client.post(
        "/api/v1/plans", json={"model": model, "fleet": fleet("h100-8x8", gpus=8, hosts=8), "options": options}
    )
    assert response.status_code == 201, response.text
    plan = response.json()
    assert {t["sharding_type"] for t in plan["tables"]} == {"grid_shard"}
    doc = page(client, f"/ui/plans/{plan['id']}")
    rows = {attr(tr, "data-table"): tr for tr in doc.css("#table-rows tr")}
    for t in plan["tables"]:
        hosts: dict[int, set[int]] = {}
        for sh in t["shards"]:
            hosts.setdefault(sh["col_offset"], set()).add(sh["rank"] // 8)
        assert len(hosts) >= 2
        assert all(len(h) == 1 for h in hosts.values())  # a band per host
        cells = text(rows[t["name"]])
        assert "grid_shard" in cells
        assert cells.split()[-1] == str(len(t["shards"]))  # the shard count, last
        ranks = sorted(sh["rank"] for sh in t["shards"])
        assert text(rows[t["name"]].css_first(".ranks-cell")) == f"{ranks[0]}–{ranks[-1]}"  # whole hosts, in a run
    export = f"/api/v1/plans/{plan['id']}/torchrec"
    assert export in {attr(a, "href") for a in doc.css(".links a")}
    exported = client.get(export)
    assert exported.status_code == 200, exported.text
    entry = exported.json()["plan"]["sparse.ebc"]["t0"]
    assert entry["sharding_type"] == "grid_shard"
    assert len(entry["shards"]) == len(next(t for t in plan["tables"] if t["name"] == "t0")["shards"])


@pytest.mark.parametrize("metric", ["step", "compute", "comm", "fill"])
def test_the_metric_switch_recolours_the_fleet(client: TestClient, metric: str) -> None:
    plan = post_plan(client, small_model("switch", tables=6, rows=1_000_000), fleet("h100x4x4", gpus=4, hosts=4))
    values = [METRIC_OF[metric](r) for r in plan["ranks"]]
    # the switch's links: htmx fetches the fragment, a plain click reloads the page with ?metric=
    doc = page(client, f"/ui/plans/{plan['id']}")
    links = {attr(a, "data-metric"): a for a in doc.css("#fleet .metric-switch a")}
    assert set(links) == {"fill", "step", "compute", "comm"}
    assert attr(links[metric], "hx-get") == f"/ui/plans/{plan['id']}/fleet?metric={metric}"
    assert attr(links[metric], "href") == f"/ui/plans/{plan['id']}?metric={metric}#fleet"
    for url in (attr(links[metric], "hx-get"), attr(links[metric], "href").split("#")[0]):
        got = page(client, url)
        assert legend(got) == (pytest.approx(min(values)), pytest.approx(max(values)))
        on = got.css_first("#fleet .metric-switch a.on")
        assert attr(on, "data-metric") == metric
        assert attr(got.css_first("svg.fleet-map"), "data-metric") == metric
    fragment = client.get(attr(links[metric], "hx-get")).text
    assert "<html" not in fragment  # the fragment alone, for htmx to swap in
    # an unknown metric is no error: the default
    assert (
        attr(page(client, f"/ui/plans/{plan['id']}/fleet?metric=<b>").css_first("svg.fleet-map"), "data-metric")
        == "fill"
    )


def mixed_128() -> dict[str, Any]:
    return {
        "name": "h100-h200-128",
        "hosts": [
            {"gpu": "nvidia-h100-sxm", "count": 8, "gpus_per_host": 8},
            {"gpu": "nvidia-h200", "count": 8, "gpus_per_host": 8},
        ],
    }


def test_a_mixed_fleet_labels_every_host_with_its_gpu_type(client: TestClient) -> None:
    plan = post_plan(client, small_model("mixed", tables=8, rows=2_000_000), mixed_128())
    doc = page(client, f"/ui/plans/{plan['id']}")
    hosts = doc.css("svg.fleet-map g.host")
    assert len(hosts) == 16
    expected = {r["host"]: r["gpu"] for r in plan["ranks"]}
    assert {int(attr(g, "data-host")): attr(g, "data-gpu") for g in hosts} == expected
    assert {attr(g, "data-gpu") for g in hosts} == {"nvidia-h100-sxm", "nvidia-h200"}
    for g in hosts:
        node = g.css_first("text.host-label")
        assert node is not None
        label = node.text(deep=False).strip()  # the label itself, not its tooltip
        assert label == f"host {attr(g, 'data-host')} · {attr(g, 'data-gpu')}"


def test_a_graphed_plans_breakdown_is_priced_for_graphed_steps(client: TestClient) -> None:
    """A plan made for graphed steps is broken down as it was priced (the graphed executor profile: the floor adds to
    the device's time), not as an eager step: the slowest rank's bar is the plan's step."""
    model = small_model("graphed", tables=4, rows=2_000_000)
    response = client.post(
        "/api/v1/plans", json={"model": model, "fleet": fleet(), "options": {**GREEDY, "graphed_steps": True}}
    )
    assert response.status_code in (200, 201), response.text
    plan = response.json()
    eager = post_plan(client, model, fleet())
    assert plan["predicted_step_ms"] < eager["predicted_step_ms"]  # the eager host floor is not in it
    section = page(client, f"/ui/plans/{plan['id']}").css_first("section.time")
    assert section is not None
    slowest = section.css_first("svg.slowest-bar")
    assert float(attr(slowest, "data-total")) == pytest.approx(plan["predicted_step_ms"], rel=0.01)


def test_where_the_time_goes_sums_to_each_ranks_step(client: TestClient) -> None:
    plan = post_plan(client, small_model("split", tables=8, rows=2_000_000), mixed_128())
    by_rank = {r["rank"]: r["predicted_ms"]["total"] for r in plan["ranks"]}
    doc = page(client, f"/ui/plans/{plan['id']}")
    section = doc.css_first("section.time")
    assert section is not None
    bars = section.css("tr.rank-group svg.rank-bar")
    assert bars
    covered: list[int] = []
    for bar in bars:
        total = float(attr(bar, "data-total"))
        parts = [float(attr(r, "data-ms")) for r in bar.css("rect.term")]
        assert sum(parts) == pytest.approx(total, rel=0.01)  # the stack is the step, within 1 %
        ranks = [r for part in attr(bar, "data-ranks").split(", ") for r in _expand(part.replace("–", "-"))]
        assert len(ranks) == int(attr(bar, "data-count"))
        for r in ranks:
            assert by_rank[r] == pytest.approx(total, rel=0.01)  # and each rank's predicted step
        covered += ranks
        assert attr(bar, "role") == "img"
        assert attr(bar, "aria-label")
        assert bar.css_first("title") is not None
    if "more groups" not in text(section):
        assert sorted(covered) == sorted(by_rank)
    slowest = section.css_first("svg.slowest-bar")
    assert float(attr(slowest, "data-total")) == pytest.approx(plan["predicted_step_ms"], rel=0.01)
    fleet_bar = section.css_first("svg.fleet-bar")
    mean = sum(by_rank.values()) / len(by_rank)
    assert float(attr(fleet_bar, "data-total")) == pytest.approx(mean, rel=0.01)
    assert sum(float(attr(r, "data-ms")) for r in fleet_bar.css("rect.term")) == pytest.approx(mean, rel=0.01)
    # inside hosts and across them: the mean rank again, by link
    links = {attr(r, "class").split()[1]: float(attr(r, "data-ms")) for r in section.css("svg.link-bar rect.link")}
    assert sum(links.values()) == pytest.approx(mean, rel=0.01)
    assert links.get("link-inter", 0) > 0  # 16 hosts: something crosses them
    # the most expensive tables, each with a reason
    rows = section.css("table.table-costs tbody tr")
    assert rows
    names = {t["name"] for t in plan["tables"]}
    for tr in rows:
        assert attr(tr, "data-table") in names
        assert text(tr.css_first("td.why"))


def _expand(part: str) -> list[int]:
    lo, _, hi = part.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _kernel_rows(doc: LexborHTMLParser) -> list[list[str]]:
    return [[text(td) for td in tr.css("td")] for tr in doc.css("table.kernels tbody tr")]


def _kernels_open(doc: LexborHTMLParser) -> bool:
    details = doc.css_first("details.kernels")
    assert details is not None
    return "open" in details.attributes


def test_plan_page_lists_each_dense_gemms_kernel_per_gpu_type(client: TestClient) -> None:
    model = small_model("kernels", tables=4)
    model["dense_layers"].append({"name": "top.1", "in_features": 256, "out_features": 64, "dtype": "bf16"})
    plan = post_plan(client, model, mixed_fleet())
    doc = page(client, f"/ui/plans/{plan['id']}")
    rows = _kernel_rows(doc)
    want = [(d["name"], k) for d in plan["dense"] for k in d["kernels"]]
    assert len(rows) == len(want) == 2 * 2 * 3  # two linear layers × two GPU types × three phases
    for row, (layer, k) in zip(rows, want, strict=True):
        c = k["config"]
        label = f"{c['block_m']}x{c['block_n']}x{c['block_k']} w{c['num_warps']} s{c['num_stages']} g{c['group_m']}"
        assert row[:6] == [layer, k["phase"], k["gpu"], f"{k['m']} × {k['n']} × {k['k']}", k["dtype"], k["kernel"]]
        assert float(row[6]) == pytest.approx(k["predicted_us"], abs=0.05)
        tflops = 2 * k["m"] * k["n"] * k["k"] / (k["predicted_us"] * 1e6)
        assert float(row[7]) == pytest.approx(tflops, rel=0.05)
        # both candidates: the best Triton configuration and its price, the vendor GEMM's price; the one that runs
        assert row[8] == f"{label} sk{c['split_k']}"
        assert (float(row[9]), float(row[10])) == (
            pytest.approx(k["triton_us"], abs=0.05),
            pytest.approx(k["vendor_us"], abs=0.05),
        )
        assert k["predicted_us"] == (k["vendor_us"] if k["kernel"] == "vendor" else k["triton_us"])
    assert {r[4] for r in rows} == {"fp32", "bf16"}
    assert {r[2] for r in rows} == {"nvidia-h100-sxm", "nvidia-h200"}
    assert {r[5] for r in rows} <= {"vendor", "triton"}
    # twelve rows: the table is open; the line above it sums each GPU type's GEMMs
    assert _kernels_open(doc)
    summary = text(doc.css_first("p.kernels-summary"))
    for gpu in ("nvidia-h100-sxm", "nvidia-h200"):
        total = sum(k["predicted_us"] for _, k in want if k["gpu"] == gpu)
        assert f"{total:.1f} µs a step on {gpu}" in summary


def test_plan_page_collapses_a_long_kernels_table_and_omits_it_without_kernels(client: TestClient) -> None:
    model = small_model("many-layers", tables=2)
    model["dense_layers"] = [{"name": f"mlp.{i}", "in_features": 128, "out_features": 128} for i in range(5)]
    plan = post_plan(client, model, mixed_fleet())  # 5 layers × 2 GPU types × 3 phases = 30 rows
    doc = page(client, f"/ui/plans/{plan['id']}")
    assert len(_kernel_rows(doc)) == 30
    assert not _kernels_open(doc)
    # a model whose dense part is unclassified has no GEMMs to choose kernels for: no section
    model["dense_layers"] = [
        {
            "name": "cross",
            "kind": "unclassified",
            "param_count": 1000,
            "activation_bytes_per_sample": 400,
            "flops_per_sample": 6000,
        }
    ]
    model["name"] = "unclassified-only"
    plan = post_plan(client, model, mixed_fleet())
    doc = page(client, f"/ui/plans/{plan['id']}")
    assert all(d["kernels"] == [] for d in plan["dense"])
    assert doc.css_first("#kernels") is None
    assert not _kernel_rows(doc)


def test_kernels_summary_takes_the_slower_host_size_of_a_gpu_type() -> None:
    # a colwise layer on H200 hosts of 2 and of 4 GPUs: two forward GEMMs for one GPU type; the sum per step takes
    # the slower (the pace of the slowest host), every choice stays a row
    config = KernelConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)

    def choice(phase: GemmPhase, m: int, n: int, us: float) -> KernelChoice:
        return KernelChoice(
            gpu="nvidia-h200", phase=phase, m=m, n=n, k=256, dtype="bf16", config=config, predicted_us=us
        )

    kernels = [
        choice(GemmPhase.forward, 2048, 128, 10.0),
        choice(GemmPhase.forward, 4096, 64, 14.0),
        choice(GemmPhase.input_grad, 2048, 256, 7.0),
    ]
    view = kernels_view([DensePlan(name="fc", style="colwise", ranks=[0, 1], kernels=kernels)])
    assert view is not None
    assert len(view.rows) == 3
    assert view.per_gpu_us == [("nvidia-h200", 14.0 + 7.0)]
    assert view.rows[1].config == "128x128x64 w8 s3 g8 sk1"
    assert view.rows[1].tflops == pytest.approx(2 * 4096 * 64 * 256 / 14e-6 / 1e12)
    assert kernels_view([DensePlan(name="fc", style="replicate", ranks=[0])]) is None


def test_throughput_wherever_the_step_time_is(client: TestClient) -> None:
    model = small_model("tput")
    a = post_plan(client, model, fleet("h100x2"))
    b = post_plan(client, model, fleet("h100x4", gpus=4))
    batch = model["batch_size_per_gpu"]

    def rates(plan: dict[str, Any]) -> tuple[str, str]:
        per_gpu = batch * 1000 / plan["predicted_step_ms"]
        return rate(per_gpu * len(plan["ranks"])), rate(per_gpu)

    doc = page(client, f"/ui/plans/{a['id']}")
    fleet_rate, gpu_rate = rates(a)
    shown = text(doc.css_first(".plan-head dd.throughput"))
    assert fleet_rate in shown
    assert f"{gpu_rate} per GPU" in shown
    history = {attr(tr, "data-plan-id"): tr for tr in page(client, "/ui/plans").css("#plan-rows tr.plan-row")}
    for plan in (a, b):
        assert rates(plan)[0] in text(history[plan["id"]].css_first("td.throughput"))
    cmp = page(client, f"/ui/compare?a={a['id']}&b={b['id']}")
    assert [text(dd).split(" samples/s")[0] + " samples/s" for dd in cmp.css(".side dd.throughput")] == [
        rates(a)[0],
        rates(b)[0],
    ]
    ratio = (batch * 4 / b["predicted_step_ms"]) / (batch * 2 / a["predicted_step_ms"])
    assert text(cmp.css_first(".verdict .tp-ratio")) == f"{ratio:.3f}"


def test_a_cpsat_plan_shows_how_the_solver_got_there(client: TestClient) -> None:
    body = {"model": slow_model("conv"), "fleet": fleet("h100x8", gpus=8)}
    body["options"] = {**SLOW, "time_limit_s": 3, "random_seed": 7}
    response = client.post("/api/v1/plans", json=body)
    assert response.status_code in (200, 201), response.text
    plan = response.json()
    doc = page(client, f"/ui/plans/{plan['id']}")
    section = doc.css_first("section.convergence-section")
    chart = section.css_first("svg.convergence")
    assert chart is not None
    assert attr(chart, "role") == "img"
    assert text(chart.css_first("title")) == "Best plan and bound over time"
    assert text(chart.css_first("desc"))
    best = chart.css("circle.best")
    assert len(best) >= 2  # the start and at least the answer
    assert len(best) == len([p for p in plan["solver"]["progress"] if p["best_ms"] is not None])
    assert f"{plan['predicted_step_ms']:.3f} ms" in text(best[-1].css_first("title"))
    xs = [float(attr(c, "cx")) for c in best]
    assert xs == sorted(xs)  # over time
    assert text(section.css_first("dd.phase")) == plan["solver"]["phase"]
    assert text(section.css_first("dd.limit")) == "3 s"
    assert text(section.css_first("dd.seed")) == "7"
    assert text(section.css_first("dd.solver-name")) == "cpsat"
    table_rows = section.css("details.progress-table tbody tr")
    assert len(table_rows) == len(plan["solver"]["progress"])  # the chart's text alternative
    n = len(table_rows)
    assert (
        text(section.css_first("details.progress-table summary")) == f"As a table ({n} report{'' if n == 1 else 's'})"
    )
    assert text(section.css_first("dd.solver-status")) in {
        "CP-SAT proved no layout of its search beats it",
        "CP-SAT stopped at its limit, with no proof of optimality",
    }


def test_every_figure_has_a_title_and_a_text_alternative(client: TestClient) -> None:
    small = post_plan(client, hot_model(), mixed_fleet())
    large = post_plan(client, small_model("figs", tables=6, rows=1_000_000), mixed_128())
    for url in (
        f"/ui/plans/{small['id']}",
        f"/ui/plans/{large['id']}",
        f"/ui/compare?a={small['id']}&b={large['id']}",
        f"/ui/compare?a={large['id']}&b={large['id']}",
    ):
        doc = page(client, url)
        figures = [svg for svg in doc.css("svg") if attr(svg, "class") != "defs"]
        assert figures, url
        for svg in figures:
            assert attr(svg, "role") == "img", (url, svg.attributes)
            assert svg.attributes.get("aria-label") or svg.attributes.get("aria-labelledby"), (url, svg.attributes)
            title = svg.css_first("title")
            assert title is not None, (url, svg.attributes)
            assert text(title), (url, svg.attributes)


# ------------------------------------------------------------------------------------------------- compare


def layout(t: dict[str, Any]) -> tuple[str, list[int], list[str]]:
    return t["sharding_type"], sorted({s["rank"] for s in t["shards"]}), sorted(s["placement"] for s in t["shards"])


def test_compare_shows_step_times_fills_and_moved_tables(client: TestClient) -> None:
    model = small_model("cmp", tables=6, rows=2_000_000)
    a = post_plan(client, model, fleet("h100x2"))
    b = post_plan(client, model, fleet("h100x4", gpus=4))
    expected = {
        t["name"] for t in a["tables"] if layout(t) != layout(next(u for u in b["tables"] if u["name"] == t["name"]))
    }
    assert expected, "going from 2 to 4 GPUs must move some table"

    doc = page(client, f"/ui/compare?a={a['id']}&b={b['id']}")
    moved = {attr(tr, "data-table"): tr for tr in doc.css("table.moved tr.move")}
    assert set(moved) == expected
    for name, tr in moved.items():
        ta = next(t for t in a["tables"] if t["name"] == name)
        tb = next(t for t in b["tables"] if t["name"] == name)
        cells = tr.css("td")
        assert cells[1].text().startswith(ta["sharding_type"])
        assert cells[2].text().startswith(tb["sharding_type"])
        assert text(cells[3])
    assert {attr(tr, "data-table") for tr in doc.css("table.unmoved tr")} == {t["name"] for t in a["tables"]} - expected

    verdict = text(doc.css_first(".verdict"))
    # both plans sit at the eager executor's host floor, the same for every plan of this model whatever the fleet:
    # the page says the steps are the same and compares throughput, twice the GPUs at the same step
    assert a["predicted_step_ms"] == b["predicted_step_ms"]
    assert f"Same predicted step time: {a['predicted_step_ms']:.3f} ms" in verdict
    assert "B / A throughput = 2.000" in verdict
    steps = [text(dd) for dd in doc.css(".side dd.step-ms")]
    assert steps == [f"{a['predicted_step_ms']:.3f} ms", f"{b['predicted_step_ms']:.3f} ms"]

    rows = doc.css("table.rank-pairs tbody tr")
    assert len(rows) == 4  # ranks 0-3: B has four GPUs, A two
    slowest = max(r["predicted_ms"]["total"] for plan in (a, b) for r in plan["ranks"])
    for tr in rows:
        r = int(attr(tr, "data-rank"))
        for side, plan in (("a", a), ("b", b)):
            cell = text(tr.css_first(f"td.{side}"))
            step = text(tr.css_first(f"td.step-{side}"))
            bar = tr.css_first(f"svg.pair-bars rect.step-{side}")
            if r < len(plan["ranks"]):
                assert f"{fills(plan)[r] * 100:.1f}%" in cell
                total = plan["ranks"][r]["predicted_ms"]["total"]
                assert step == f"{total:.3f} ms"  # step time rank for rank, side by side
                assert float(attr(bar, "width")) == pytest.approx(total / slowest * BAR_UNITS, abs=2e-3)
            else:
                assert cell == "—"
                assert step == "—"
                assert bar is None

    same = page(client, f"/ui/compare?a={a['id']}&b={a['id']}")
    assert same.css("table.moved tr.move") == []
    assert "Same predicted step time" in text(same.css_first(".verdict"))


def test_compare_of_one_model_on_two_fleets_shows_the_port_analysis(client: TestClient) -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "port_b200_to_mi350x"
    model, b200, mi350x = (
        json.loads((example / f).read_text()) for f in ("model.json", "fleet_b200.json", "fleet_mi350x.json")
    )
    a = post_plan(client, model, b200)
    b = post_plan(client, model, mi350x)
    doc = page(client, f"/ui/compare?a={a['id']}&b={b['id']}")
    section = doc.css_first("section.port")
    assert section is not None
    report = port_analysis(
        ModelSpec.model_validate(model),
        FleetSpec.model_validate(b200),
        FleetSpec.model_validate(mi350x),
        SolveParams(solver="greedy"),
        source_plan=StoredPlan.model_validate(a),
        target_plan=StoredPlan.model_validate(b),
    )
    assert report.speedup is not None
    assert text(section.css_first("dd.speedup")) == f"{report.speedup:.2f}×"
    assert text(section.css_first("dd.direct-ms")) == f"{report.direct_port.predicted_step_ms:.3f} ms"
    assert [text(li) for li in section.css("ul.hints li")] == report.hints
    assert {attr(tr, "data-table") for tr in section.css("table.port-changes tbody tr")} == {
        c.table for c in report.table_changes
    }
    # two plans of different models are no port: no section
    other = post_plan(client, small_model("other"), b200)
    assert page(client, f"/ui/compare?a={other['id']}&b={b['id']}").css_first("section.port") is None


def test_compare_needs_two_known_plans(client: TestClient) -> None:
    a = post_plan(client, small_model(), fleet())
    missing = page(client, f"/ui/compare?a={a['id']}", status=400)
    assert "b is missing" in text(missing.css_first(".detail"))
    options = [attr(o, "value") for o in missing.css("select[name=b] option") if attr(o, "value")]
    assert options == [a["id"]]  # a friendly way on: pick from the recent plans
    assert attr(missing.css_first("select[name=a] option[selected]"), "value") == a["id"]
    picker = page(client, "/ui/compare")  # the bare page (the nav link): a picker, not an error
    assert [attr(o, "value") for o in picker.css("select[name=a] option") if attr(o, "value")] == [a["id"]]

    unknown = page(client, f"/ui/compare?a={a['id']}&b=00000000-0000-0000-0000-000000000000", status=404)
    assert "00000000-0000-0000-0000-000000000000" in text(unknown.css_first(".detail"))


# ------------------------------------------------------------------------------------------ errors, escaping, assets


def test_pages_say_which_calibration_priced_a_plan(client: TestClient) -> None:
    calibration = {
        "profile": "nvidia-h200",
        "device": "NVIDIA H200",
        "torch": "2.13.0",
        "date": "2026-12-01",
        "figures": {"achieved.embedding_gather": {"value": 0.7, "source": "test", "samples": 3, "fit_error": 0.05}},
    }
    stored = client.post("/api/v1/calibrations", json=calibration)
    assert stored.status_code == 201, stored.text
    label = stored.json()["label"]
    h200 = fleet("h200x2", gpu="nvidia-h200")
    plain = post_plan(client, small_model(), h200)
    priced = client.post(
        "/api/v1/plans",
        json={"model": small_model(), "fleet": h200, "options": GREEDY, "calibrations": ["nvidia-h200@1"]},
    )
    assert priced.status_code == 201, priced.text
    calibrated = priced.json()

    doc = page(client, f"/ui/plans/{calibrated['id']}")
    assert [text(p) for p in doc.css(".plan-head .priced-with")] == [f"Priced with: {label}"]
    assert text(doc.css_first(".plan-head .priced-with .calibration")) == label
    doc = page(client, f"/ui/plans/{plain['id']}")
    assert [text(p) for p in doc.css(".plan-head .priced-with")] == [
        "Priced with: catalogue figures, executor profile shardwise-eager (uncalibrated)"
    ]

    doc = page(client, f"/ui/compare?a={plain['id']}&b={calibrated['id']}")
    assert (
        text(doc.css_first(".side-a .priced-with"))
        == "Priced with: catalogue figures, executor profile shardwise-eager (uncalibrated)"
    )
    assert text(doc.css_first(".side-b .priced-with")) == f"Priced with: {label}"


def test_a_calibration_label_holding_markup_is_escaped(client: TestClient, clean_db: str) -> None:
    evil = "<script>alert('pwned')</script>"
    plan_id = store_plan_directly(clean_db, small_model(), fleet(), calibrations=[f"{evil} calibration", "second"])
    for url in (f"/ui/plans/{plan_id}", f"/ui/compare?a={plan_id}&b={plan_id}"):
        body = client.get(url).text
        assert evil not in body
        assert "&lt;script&gt;alert(" in body
        doc = LexborHTMLParser(body)
        assert all("pwned" not in s.text() for s in doc.css("script"))
        assert [text(n) for n in doc.css(".priced-with .calibration")][:2] == [f"{evil} calibration", "second"]


def test_trailing_slash_redirects(client: TestClient) -> None:
    response = client.get("/ui/plans/?model=x", follow_redirects=False)
    assert response.status_code == 307
    assert response.headers["location"] == "/ui/plans?model=x"


@pytest.mark.parametrize(
    "url", ["/ui/plans/00000000-0000-0000-0000-000000000000", "/ui/plans/not-a-uuid", "/ui/nothing"]
)
def test_unknown_pages_are_html_404s(client: TestClient, url: str) -> None:
    doc = page(client, url, status=404)
    assert text(doc.css_first("h1")).startswith("404")
    assert doc.css_first("a[href='/ui/plans']") is not None


def test_markup_in_stored_names_is_escaped(client: TestClient, clean_db: str) -> None:
    evil = "<script>alert('pwned')</script>"
    plan_id = store_plan_directly(
        clean_db, small_model(), fleet(), model=evil, explanation=[f"table {evil} & friends <b>bold</b>"]
    )
    for url in ("/ui/plans", f"/ui/plans/{plan_id}", f"/ui/compare?a={plan_id}&b={plan_id}"):
        body = client.get(url).text
        assert evil not in body
        assert "<b>bold</b>" not in body
        assert "&lt;script&gt;alert(" in body
        doc = LexborHTMLParser(body)
        assert all("pwned" not in s.text() for s in doc.css("script"))
    doc = page(client, f"/ui/plans/{plan_id}")
    assert text(doc.css_first(".explanation li")) == f"table {evil} & friends <b>bold</b>"  # shown as text


def test_static_assets_are_served(client: TestClient) -> None:
    doc = page(client, "/ui/plans")
    scripts = [attr(s, "src") for s in doc.css("script[src]")]
    assert any(s.startswith("/static/htmx.min.js") for s in scripts)
    for src in [*scripts, attr(doc.css_first("link[rel=stylesheet]"), "href")]:
        response = client.get(src)
        assert response.status_code == 200, src
    htmx = client.get("/static/htmx.min.js").text
    assert htmx.startswith("/*! htmx 2.")
    assert "0BSD" in htmx.splitlines()[0]


def test_every_page_needs_a_token_when_reads_do(clean_db: str, runner: LocalRunner) -> None:
    """The read-token rule sits on the pages' router and reaches each page module's routes, the catch-all too: a
    browser without a login is sent to the login form (HTML, not the API's JSON 401), back to the page it asked
    for afterwards; a bearer token still reads them."""
    settings = Settings(database_url=clean_db, log_level="WARNING", api_tokens="s3cret", auth_reads=True)
    with TestClient(create_app(settings, runner=runner)) as c:
        for url in ("/", "/ui", "/ui/plans", "/ui/plans/nope", "/ui/compare?a=x", "/ui/nope"):
            answer = c.get(url, follow_redirects=False)
            assert answer.status_code == 303, url
            assert answer.headers["location"] == "/ui/login?" + urlencode({"next": url}), url
            answer = c.get(url, follow_redirects=False, headers={"Authorization": "Bearer s3cret"})
            assert answer.status_code in (200, 302, 400, 404), url
            assert answer.status_code == 302 or answer.headers["content-type"].startswith("text/html"), url
        assert c.get("/static/ui.css").status_code == 200  # the assets stay open
        assert c.get("/ui/login").status_code == 200  # and so does the login form


# ------------------------------------------------------------------ the verdict: optimal against every plan, or not


def _as_solved(clean_db: str, *, bound_share: float, tag: str) -> str:
    """The small model's plan stored as CP-SAT labels one it proved optimal over the layouts it searched
    (``build_plan``): the bound over every plan at ``bound_share`` of the step. The small model at 1,048,576 samples
    per GPU, so that its device time (about 14 ms) sets the step rather than the executor's host floor (3.8 ms),
    which no plan goes below and which would make any bound meet the step."""
    doc = {**small_model(), "batch_size_per_gpu": 1_048_576}
    model, fleet_ = ModelSpec.model_validate(doc), FleetSpec.model_validate(fleet())
    greedy = make_plan(model, fleet_, SolveParams(solver="greedy"))
    step = greedy.predicted_step_ms
    assert step is not None
    solved = build_plan(
        Topology(fleet_),
        model,
        greedy.tables,
        greedy.dense,
        SolveParams(),
        solver_name="cpsat",
        solver_status="OPTIMAL",
        seconds=1.0,
        proved_optimal=True,
        bound_ms=bound_share * step,
        searched_bound_ms=step,
    )
    changes = {k: getattr(solved, k) for k in ("status", "lower_bound_ms", "solver", "explanation")}
    return store_plan_directly(clean_db, doc, fleet(), request_hash=f"sha256:{tag}", **changes)


def test_a_plan_proved_only_over_the_layouts_searched_is_not_called_optimal(client: TestClient, clean_db: str) -> None:
    plan_id = _as_solved(clean_db, bound_share=0.5, tag="searched")
    stored = StoredPlan.model_validate(client.get(f"/api/v1/plans/{plan_id}").json())
    step, bound = stored.predicted_step_ms, stored.lower_bound_ms
    assert step is not None
    assert bound is not None
    doc = page(client, f"/ui/plans/{plan_id}")
    head = text(doc.css_first(".plan-head"))
    assert text(doc.css_first(".plan-head .status")) == "optimal among the layouts searched"
    assert text(doc.css_first(".verdict-detail")) == (
        f"optimal among the layouts searched; at most 50.0% from any plan (bound {bound:.3f} ms)"
    )
    assert text(doc.css_first(".lower-bound")) == f"{bound:.3f} ms"  # the bound over every plan, not the searched
    assert text(doc.css_first(".searched-bound")) == f"{step:.3f} ms (gap 0.0%)"
    assert "proved optimal" not in head
    body = text(doc.body)
    assert f"no plan can beat {step:.3f}" not in body
    assert f"no plan beats {step:.3f}" not in body
    # one vocabulary: CP-SAT's own OPTIMAL (about the layouts it searched) is not shown as a status, only named
    assert "OPTIMAL" not in text(doc.css_first(".solver"))
    assert attr(doc.css_first(".solver"), "title") == (
        "the solver's own status: OPTIMAL (CP-SAT proved no layout of its search beats it)"
    )

    rows = {attr(tr, "data-plan-id"): tr for tr in page(client, "/ui/plans").css("#plan-rows tr.plan-row")}
    assert text(rows[plan_id].css_first(".status")) == "optimal among the layouts searched"
    compare = page(client, f"/ui/compare?a={plan_id}&b={plan_id}")
    assert {text(n) for n in compare.css(".sides .status")} == {"optimal among the layouts searched"}


def test_a_plan_meeting_the_bound_over_every_plan_is_optimal(client: TestClient, clean_db: str) -> None:
    plan_id = _as_solved(clean_db, bound_share=1.0, tag="optimal")
    doc = page(client, f"/ui/plans/{plan_id}")
    step = text(doc.css_first(".step-ms"))
    assert text(doc.css_first(".plan-head .status")) == "optimal"
    assert text(doc.css_first(".verdict-detail")) == f"optimal; no plan beats {step}"
    rows = {attr(tr, "data-plan-id"): tr for tr in page(client, "/ui/plans").css("#plan-rows tr.plan-row")}
    assert text(rows[plan_id].css_first(".status")) == "optimal"
    options = {attr(o, "value"): text(o) for o in page(client, "/ui/plans").css("select[name=status] option")}
    assert options.get("optimal") == "optimal"


@pytest.mark.parametrize("url", ["/docs", "/redoc"])
def test_api_docs_load_only_this_servers_files(client: TestClient, url: str) -> None:
    """The browser test (test_playwright) proves it in Chromium; this holds where no browser is installed."""
    response = client.get(url)
    assert response.status_code == 200
    assert "img-src 'self' data:" in response.headers["content-security-policy"]
    doc = LexborHTMLParser(response.text)
    refs = [attr(n, "src") for n in doc.css("script[src]")] + [attr(n, "href") for n in doc.css("link[href]")]
    assert refs
    for ref in refs:
        assert ref.startswith("/static/"), ref
        assert client.get(ref).status_code == 200, ref
    assert "googleapis" not in response.text
    assert "cdn." not in response.text
    # the vendored distributions keep their licenses beside them
    for name in ("swagger-ui.LICENSE", "swagger-ui.NOTICE", "redoc.LICENSE"):
        assert client.get(f"/static/{name}").status_code == 200


def test_a_two_d_plan_page_shows_its_groups_and_the_sync(client: TestClient) -> None:
    """Small hot tables on 8 hosts: the planner splits the fleet into replica groups (solver/plan2d.py); the page
    names G, the number of groups and the sync, and the time it spends keeping them in sync is a term of its own."""
    hot = {"num_embeddings": 200_000, "embedding_dim": 256, "pooling_factor": 20.0}  # wide: device-bound
    model = {
        "name": "hot-2d",
        "batch_size_per_gpu": 8192,
        "embedding_tables": [{"name": f"t{i}", **hot} for i in range(4)],
    }
    plan = post_plan(client, model, fleet("h100-8x8", gpus=8, hosts=8))
    sg = plan["sparse_groups"]
    assert sg is not None
    doc = page(client, f"/ui/plans/{plan['id']}")
    fact = text(doc.css_first("dd.sparse-groups"))
    assert f"{len(sg['groups'])} × G={len(sg['groups'][0])}" in fact
    assert sg["sync"] in fact
    section = doc.css_first("section.time")
    assert section is not None
    assert section.css("rect.term-replica_sync")
    for bar in section.css("tr.rank-group svg.rank-bar"):
        parts = [float(attr(r, "data-ms")) for r in bar.css("rect.term")]
        assert sum(parts) == pytest.approx(float(attr(bar, "data-total")), rel=0.01)


# ------------------------------------------------------------------------------------------------- engines


def deepfm() -> dict[str, Any]:
    """A DeepFM-style model (26 Criteo-shaped features of 100,000 ids × 16, one id each): on 2 hosts × 8 H100 the
    greedy plans it 2D with allreduce_rows, which TorchRec has no form of (``tests/service/test_engines.py``)."""
    return {
        "name": "deepfm",
        "batch_size_per_gpu": 4096,
        "embedding_tables": [{"name": f"c{i}", "num_embeddings": 100_000, "embedding_dim": 16} for i in range(26)],
        "dense_layers": [{"name": "deep.0", "kind": "linear", "in_features": 416, "out_features": 400}],
    }


def post_for(client: TestClient, model: dict[str, Any], fleet_: dict[str, Any], **options: Any) -> dict[str, Any]:
    response = client.post("/api/v1/plans", json={"model": model, "fleet": fleet_, "options": {**GREEDY, **options}})
    assert response.status_code in (200, 201), response.text
    body: dict[str, Any] = response.json()
    return body


def export_links(doc: LexborHTMLParser) -> list[str]:
    return [attr(a, "href") for a in doc.css(".links a") if attr(a, "href").endswith("/torchrec")]


def test_the_plan_page_says_which_engine_the_plan_is_priced_for(client: TestClient) -> None:
    ours = post_for(client, small_model(), fleet())
    theirs = post_for(client, small_model(), fleet(), executor="torchrec")
    for plan, words in ((ours, "priced for shardwise's executor"), (theirs, "priced for TorchRec + FBGEMM")):
        doc = page(client, f"/ui/plans/{plan['id']}")
        heading = doc.css_first(".plan-head h1")
        engine = heading.css_first(".engine") if heading is not None else None
        assert text(engine) == words
        assert "engine-" + plan["executor"] in attr(engine, "class")
        # next to the verdict: the status badge, then the engine
        assert text(heading).endswith(f"best found {words}")  # greedy: best found

    history = page(client, "/ui/plans")
    rows = {attr(tr, "data-plan-id"): tr for tr in history.css("#plan-rows tr.plan-row")}
    assert attr(rows[ours["id"]].css_first(".engine-name"), "data-engine") == "shardwise"
    assert text(rows[theirs["id"]].css_first(".engine-name")) == "TorchRec + FBGEMM"


def test_the_plan_page_links_the_torchrec_export_only_where_it_exports(client: TestClient) -> None:
    two_d = post_for(client, deepfm(), fleet("h100-2x8", gpus=8, hosts=2))
    assert two_d["sparse_groups"]["sync"] == "allreduce_rows"  # the precondition: TorchRec cannot run it
    doc = page(client, f"/ui/plans/{two_d['id']}")
    assert export_links(doc) == []
    refused = client.get(f"/api/v1/plans/{two_d['id']}/torchrec")
    assert refused.status_code == 422
    (line,) = doc.css(".plan-head .no-export")
    assert text(line).startswith("TorchRec cannot run this layout:")
    assert refused.json()["detail"] in text(line)  # the reason the export answers with
    assert "allreduce_rows" in text(line)

    twin = post_for(client, deepfm(), fleet("h100-2x8", gpus=8, hosts=2), executor="torchrec")
    doc = page(client, f"/ui/plans/{twin['id']}")
    assert export_links(doc) == [f"/api/v1/plans/{twin['id']}/torchrec"]
    assert doc.css(".no-export") == []
    assert client.get(export_links(doc)[0]).status_code == 200


def test_the_apply_snippet_fetches_a_registered_model_it_was_made_for(client: TestClient) -> None:
    model = small_model("registered")
    assert client.post("/api/v1/models", json=model).status_code in (200, 201)
    answer = client.post(
        "/api/v1/plans", json={"model": "registered@1", "fleet": fleet(), "options": {"solver": "greedy"}}
    )
    assert answer.status_code in (200, 201), answer.text
    plan = answer.json()
    code = page(client, f"/ui/plans/{plan['id']}").css_first("code#snippet").text()
    tree = ast.parse(code)
    assert 'spec = client.get_model("registered@1").spec' in code
    assert "model_spec=spec" in code
    assert "Path(" not in code
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert {name for module, name in imported if module == "shardwise"} <= set(shardwise.__all__)


# ------------------------------------------------------------------------------------------------- the re-plan page


def test_the_replan_page_shows_the_moves_the_api_reports_and_stores_nothing(client: TestClient) -> None:
    model = small_model("elastic", tables=6)
    three = {"name": "three", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 3, "gpus_per_host": 2}]}
    two = {"name": "two", "hosts": [{"gpu": "nvidia-h100-sxm", "count": 2, "gpus_per_host": 2}]}
    a, b = post_plan(client, model, three), post_plan(client, model, two)
    other = post_plan(client, small_model("another"), two)  # another model: not offered
    plan_doc = page(client, f"/ui/plans/{a['id']}")
    assert attr(plan_doc.css_first("a.replan-link"), "href") == f"/ui/plans/{a['id']}/replan"

    picker = page(client, f"/ui/plans/{a['id']}/replan")
    offered = [attr(o, "value") for o in picker.css("form.replan-pick select[name=to] option") if attr(o, "value")]
    assert offered == [b["id"]]
    assert other["id"] not in offered

    doc = page(client, f"/ui/plans/{a['id']}/replan?to={b['id']}&max_slowdown=0.2")
    api = client.post(f"/api/v1/plans/{a['id']}/replan", json={"fleet": two, "budget": {"max_slowdown": 0.2}})
    assert api.status_code == 200, api.text
    report = api.json()
    assert report["fresh"]["id"] == b["id"]  # the API found B stored: the page and the API weigh the same plans
    assert text(doc.css_first(".replan-summary .budget")).startswith("Budget: at most 20.0% slower")
    replan_row = [text(td) for td in doc.css(".replan-table tr.replan td")]
    assert replan_row[0] == f"{report['replan']['predicted_step_ms']:.3f} ms"
    assert replan_row[-1] == f"{report['kept_tables']} of {report['kept_tables'] + report['moved_tables']}"
    rows = doc.css("table.moves tbody tr")
    assert len(rows) == len(report["moves"]) > 0
    biggest = max(report["moves"], key=lambda m: m["bytes"])
    assert text(rows[0].css("td")[0]) == biggest["table"]
    assert [text(td) for td in doc.css("table.links tbody td")][::3] == sorted({m["link"] for m in report["moves"]})
    assert len(client.get("/api/v1/plans").json()["items"]) == 3  # the page solved and stored nothing


def test_the_replan_page_refuses_what_is_not_a_re_plan(client: TestClient) -> None:
    model = small_model("elastic", tables=2)
    a = post_plan(client, model, fleet("one"))
    b = post_plan(client, model, fleet("two", gpus=4))
    assert "Plan not found" in text(page(client, f"/ui/plans/{a['id']}/replan?to=nope", 404).css_first("h1"))
    assert "Plan not found" in text(page(client, f"/ui/plans/nope/replan?to={b['id']}", 404).css_first("h1"))
    bad = page(client, f"/ui/plans/{a['id']}/replan?to={b['id']}&max_slowdown=lots", 400)
    assert "max_slowdown must be a number" in text(bad.css_first("p.detail"))
    both = page(client, f"/ui/plans/{a['id']}/replan?to={b['id']}&max_slowdown=0.1&ms_per_gb=2", 400)
    assert "exactly one of max_slowdown" in text(both.css_first("p.detail"))
    alone = page(client, f"/ui/plans/{a['id']}/replan")
    assert alone.css_first("p.no-picks") is None  # b is a plan of the same model on another fleet
