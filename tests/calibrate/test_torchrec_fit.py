"""The TorchRec engine's fits (``shardwise.calibrate.torchrec_fit``) recover known figures from samples priced with
them, and refuse what cannot be fitted."""

from __future__ import annotations

from typing import Any

import pytest

from shardwise.calibrate.torchrec_fit import fit_dmp_steps, fit_tbe, sample_bytes
from shardwise.hwprofiles import get_profile

PROFILE = get_profile("nvidia-h200")
GATHER, SORT_NS, FIXED_MS, LINK, FETCH_US, FETCH_NS = 0.62, 0.9, 0.05, 0.41, 150.0, 0.4


def _time(sample: dict[str, Any]) -> float:
    """The sample's time as the module docstring's model gives it at the figures above."""
    b = sample_bytes(sample, PROFILE)
    hbm, link = PROFILE.hbm_bandwidth_bytes_per_s, PROFILE.host_link_bytes_per_s
    return (
        FIXED_MS
        + b.gathered / (hbm * GATHER) * 1e3
        + b.stream / (hbm * PROFILE.achieved.memory_bound) * 1e3
        + b.sorted_ids * SORT_NS * 1e-6
        + b.linked / (link * LINK) * 1e3
        + ((FETCH_US / 1e3 + b.moved_rows * FETCH_NS * 1e-6) if sample["placement"] == "uvm_cache" else 0.0)
    )


def _samples() -> list[dict[str, Any]]:
    base = {"rows": 1_000_000, "dim": 128, "dtype": "fp32", "pooling": 8, "batch": 8192, "optimizer": "rowwise_adagrad"}
    out = []
    for change in ({}, {"dim": 16}, {"dim": 256, "batch": 4096}, {"pooling": 1}, {"pooling": 32}, {"dtype": "fp16"},
                   {"optimizer": "adam"}, {"optimizer": "sgd"}, {"rows": 100_000}):  # fmt: skip
        out.append(base | change | {"placement": "hbm", "cache_fraction": None, "skew": 0.0})
    out += [
        base | {"placement": "host", "cache_fraction": None, "skew": 0.0},
        base | {"placement": "host", "cache_fraction": None, "skew": 0.0, "dim": 64},
        base | {"placement": "uvm_cache", "cache_fraction": 0.1, "skew": 1.05},
        base | {"placement": "uvm_cache", "cache_fraction": 0.5, "skew": 0.0},
        base | {"placement": "uvm_cache", "cache_fraction": 0.1, "skew": 0.0, "pooling": 32},
    ]
    for s in out:
        s["step_ms"] = _time(s)
    return out


def test_fit_tbe_recovers_the_figures_the_samples_were_priced_with() -> None:
    fit = fit_tbe(_samples(), PROFILE)
    assert fit.gather == pytest.approx(GATHER, rel=1e-6)
    assert fit.sort_ns == pytest.approx(SORT_NS, rel=1e-4)
    assert fit.fixed_ms == pytest.approx(FIXED_MS, rel=1e-4)
    assert fit.link == pytest.approx(LINK, rel=1e-6)
    assert fit.fetch is not None
    assert fit.fetch[0] == pytest.approx(FETCH_US, rel=1e-4)
    assert fit.fetch[1] == pytest.approx(FETCH_NS, rel=1e-4)
    assert fit.errors["gather"][0] < 1e-9


def test_fit_tbe_leaves_out_skipped_samples_and_needs_three_in_hbm() -> None:
    samples = _samples()
    for s in samples[1:]:
        if s["placement"] == "hbm":
            s["status"] = "skipped"
    with pytest.raises(ValueError, match="too few"):
        fit_tbe(samples, PROFILE)


def test_fit_dmp_steps_is_a_line_in_the_tables() -> None:
    samples = [{"tables": t, "pipelined_ms": 2.0 + 0.05 * t} for t in (1, 4, 16, 64)]
    fixed_us, per_table_us, err = fit_dmp_steps(samples)
    assert fixed_us == pytest.approx(2000.0, rel=1e-6)
    assert per_table_us == pytest.approx(50.0, rel=1e-6)
    assert err < 1e-9
    with pytest.raises(ValueError, match="too few"):
        fit_dmp_steps(samples[:1])
