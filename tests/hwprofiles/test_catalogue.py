"""The accelerator catalogue: every YAML file validates, carries a source per figure, and holds the figures of
``docs/hardware_sources.md`` (measured bytes, per-direction bandwidths, per-peer vs all-peer links)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from shardwise.hwprofiles import HardwareProfile, ProfileError, catalogue, get_profile, load_profile_file, parse_profile
from shardwise.hwprofiles.loader import PROFILE_DIR

PROFILE_FILES = sorted(PROFILE_DIR.glob("*.yaml"))

REQUIRED_NAMES = {
    "nvidia-a100",
    "nvidia-h100-sxm",
    "nvidia-h200",
    "nvidia-b200",
    "nvidia-b300",
    "nvidia-gb200",
    "amd-mi300x",
    "amd-mi325x",
    "amd-mi350x",
    "amd-mi355x",
}

#: vendor capacity labels (the number printed on the box), to check that no profile stores label × 1e9.
LABEL_GB = {
    "nvidia-a100": 80,
    "nvidia-h100-sxm": 80,
    "nvidia-h200": 141,
    "nvidia-b200": 180,
    "nvidia-b300": 288,
    "nvidia-gb200": 186,
    "amd-mi300x": 192,
    "amd-mi325x": 256,
    "amd-mi350x": 288,
    "amd-mi355x": 288,
}

#: measured visible capacities from the reference's "Planner-ready summary" column.
MEASURED_HBM_BYTES = {
    "nvidia-a100": 85_056_798_720,
    "nvidia-h100-sxm": 85_520_809_984,
    "nvidia-h200": 150_754_820_096,
    "nvidia-b200": 192_265_846_784,
    "nvidia-b300": 288_400_343_040,
    "nvidia-gb200": 189_471 * 1_048_576,
    "amd-mi300x": 206_141_652_992,
    "amd-mi350x": 309_220_868_096,
    "amd-mi355x": 309_220_868_096,
}

GB = 10**9


def _profile_dict(name: str = "nvidia-h100-sxm") -> dict[str, Any]:
    """A fresh, mutable copy of a catalogue profile as plain data."""
    return copy.deepcopy(get_profile(name).model_dump())


# --------------------------------------------------------------------------------------------- every file


def test_profile_dir_is_not_empty() -> None:
    assert PROFILE_FILES, f"no profiles found in {PROFILE_DIR}"


@pytest.mark.parametrize("path", PROFILE_FILES, ids=[p.stem for p in PROFILE_FILES])
def test_profile_file_loads_with_a_source_per_figure(path: Path) -> None:
    profile = load_profile_file(path)
    assert profile.name == path.stem
    assert profile.unsourced() == []
    # every figure has its own, non-empty source, and no source names a figure the profile does not have
    assert set(profile.figure_paths()) <= set(profile.sources)
    assert set(profile.sources) <= set(profile.figure_paths())
    assert all(text.strip() for text in profile.sources.values())


def test_catalogue_holds_the_required_profiles() -> None:
    names = set(catalogue())
    assert names >= REQUIRED_NAMES
    assert names == {p.stem for p in PROFILE_FILES}


@pytest.mark.parametrize("name", sorted(REQUIRED_NAMES))
def test_assumed_figures_say_so(name: str) -> None:
    """Latencies have no measured figure in the reference: their source must say it is an assumption."""
    profile = get_profile(name)
    for path in ("intra_host_latency_us", "inter_host_latency_us", "achieved.inter_host_collective"):
        assert "assumption" in profile.sources[path]


# ---------------------------------------------------------------------------------------------- capacities


@pytest.mark.parametrize("name", sorted(LABEL_GB))
def test_hbm_bytes_is_not_label_times_1e9(name: str) -> None:
    assert get_profile(name).hbm_bytes != LABEL_GB[name] * GB


@pytest.mark.parametrize(("name", "expected"), sorted(MEASURED_HBM_BYTES.items()))
def test_hbm_bytes_is_the_measured_visible_capacity(name: str, expected: int) -> None:
    assert get_profile(name).hbm_bytes == expected


def test_unverified_capacity_is_marked() -> None:
    profile = get_profile("amd-mi325x")
    assert "unverified" in profile.sources["hbm_bytes"]
    assert 274 * GB < profile.hbm_bytes < 275 * GB  # the reference suggests ≈274.9e9


# ------------------------------------------------------------------------------------------------- links


@pytest.mark.parametrize("name", sorted(REQUIRED_NAMES))
def test_scale_up_topology_by_vendor(name: str) -> None:
    profile = get_profile(name)
    if profile.vendor == "amd":
        assert profile.scale_up_topology == "full_mesh"
        assert profile.scale_up_per_peer_bytes_per_s < profile.scale_up_bytes_per_s
    else:
        assert profile.vendor == "nvidia"
        assert profile.scale_up_topology == "switched"
        assert profile.scale_up_per_peer_bytes_per_s == profile.scale_up_bytes_per_s


@pytest.mark.parametrize(
    ("name", "all_peers", "one_peer"),
    [
        ("amd-mi300x", 448 * GB, 64 * GB),
        ("amd-mi325x", 448 * GB, 64 * GB),
        ("amd-mi350x", 537_600_000_000, 76_800_000_000),
        ("amd-mi355x", 537_600_000_000, 76_800_000_000),
        ("nvidia-a100", 300 * GB, 300 * GB),
        ("nvidia-h100-sxm", 450 * GB, 450 * GB),
        ("nvidia-b200", 900 * GB, 900 * GB),
    ],
)
def test_scale_up_is_per_direction(name: str, all_peers: int, one_peer: int) -> None:
    profile = get_profile(name)
    assert profile.scale_up_bytes_per_s == all_peers
    assert profile.scale_up_per_peer_bytes_per_s == one_peer


def test_gb200_is_one_gpu_of_an_nvl72() -> None:
    profile = get_profile("nvidia-gb200")
    assert profile.scale_up_domain_size == 72
    assert profile.gpus_per_host == 4
    assert profile.host_link_bytes_per_s == 225 * GB  # 450 GB/s per dir per Grace, shared by 2 GPUs


def test_nic_and_hbm_bandwidths_in_bytes_per_second() -> None:
    assert get_profile("nvidia-h100-sxm").scale_out_bytes_per_s == 50 * GB  # 400 Gb/s
    assert get_profile("nvidia-b300").scale_out_bytes_per_s == 100 * GB  # 800 Gb/s
    assert get_profile("nvidia-b200").hbm_bandwidth_bytes_per_s == 7_700 * GB  # N-2, conservative


def test_dense_rates() -> None:
    a100 = get_profile("nvidia-a100")
    assert "fp8" not in a100.peak_flops_per_s
    assert a100.peak_flops("fp8") == a100.peak_flops_per_s["fp16"] == 312 * 10**12
    assert get_profile("nvidia-h100-sxm").peak_flops("bf16") == 989_400 * GB  # dense, not the sparse 1,979
    b300 = get_profile("nvidia-b300")
    assert b300.peak_flops("int8") < b300.peak_flops("bf16")  # INT8 cut on Blackwell Ultra, no FP8 fallback


# ------------------------------------------------------------------------------------------------ errors


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError) as info:
        get_profile("nope")
    message = str(info.value)
    assert "'nope'" in message
    for name in catalogue():
        assert name in message


def test_missing_field_is_named() -> None:
    data = _profile_dict()
    del data["hbm_bytes"]
    with pytest.raises(ProfileError, match=r"hbm_bytes"):
        parse_profile(data)


@pytest.mark.parametrize("field", ["scale_out_bytes_per_s", "hbm_bandwidth_bytes_per_s", "host_link_bytes_per_s"])
def test_negative_bandwidth_is_refused_naming_the_field(field: str) -> None:
    data = _profile_dict()
    data[field] = -1
    with pytest.raises(ProfileError, match=rf"inline profile: {field}:"):
        parse_profile(data)


def test_nested_field_path_is_named() -> None:
    data = _profile_dict()
    data["achieved"]["gemm"] = 0
    with pytest.raises(ProfileError, match=r"achieved\.gemm"):
        parse_profile(data)


def test_per_peer_above_all_peers_is_refused() -> None:
    data = _profile_dict("amd-mi300x")
    data["scale_up_per_peer_bytes_per_s"] = data["scale_up_bytes_per_s"] + 1
    with pytest.raises(ProfileError, match=r"scale_up_per_peer_bytes_per_s"):
        parse_profile(data)


def test_missing_source_is_named_when_sources_are_required() -> None:
    data = _profile_dict()
    del data["sources"]["peak_flops_per_s.bf16"]
    assert isinstance(parse_profile(data), HardwareProfile)  # inline profiles need no sources
    with pytest.raises(ProfileError, match=r"without a source: peak_flops_per_s\.bf16$"):
        parse_profile(data, require_sources=True)


def test_file_name_must_match_profile_name(tmp_path: Path) -> None:
    src = PROFILE_DIR / "nvidia-h200.yaml"
    wrong = tmp_path / "nvidia-h200-copy.yaml"
    wrong.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(ProfileError, match=r"does not match the file name"):
        load_profile_file(wrong)


def test_invalid_yaml_is_a_profile_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(ProfileError, match=r"not valid YAML"):
        load_profile_file(bad)


HARDWARE_SOURCES = Path(__file__).resolve().parents[2] / "docs" / "hardware_sources.md"


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_every_cited_source_and_note_is_defined_in_the_docs(path: Path) -> None:
    """A profile's ``[N13]`` or ``N-4`` must be findable in docs/hardware_sources.md, in the repository."""
    page = HARDWARE_SOURCES.read_text(encoding="utf-8")
    defined_keys = set(re.findall(r"^\* (\[[A-Z]\d+\])", page, flags=re.MULTILINE))
    defined_notes = set(re.findall(r"\*\*(N-\d+)", page)) | set(re.findall(r"^#+ .*?(N-\d+)", page, flags=re.M))
    text = path.read_text(encoding="utf-8")
    cited_keys = set(re.findall(r"\[[A-Z]\d+\]", text))
    cited_notes = set(re.findall(r"\bN-\d+\b", text))
    assert cited_keys, f"{path.name} cites no source"
    assert cited_keys <= defined_keys, sorted(cited_keys - defined_keys)
    assert cited_notes <= defined_notes, sorted(cited_notes - defined_notes)


# ------------------------------------------------------------------------------------------ microarchitecture


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_every_catalogue_profile_has_a_sourced_microarchitecture(path: Path) -> None:
    profile = load_profile_file(path)
    assert profile.microarch is not None
    paths = [p for p in profile.figure_paths() if p.startswith("microarch.")]
    assert "microarch.sm_count" in paths
    assert "microarch.l2_bandwidth_bytes_per_s" in paths
    assert all(profile.sources[p].strip() for p in paths)
    assert profile.microarch.warp_size == (32 if profile.vendor == "nvidia" else 64)


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_sms_times_rate_per_clock_times_clock_is_the_peak(path: Path) -> None:
    """``sm_count × matrix_flops_per_clock_per_sm[dt] × clock`` agrees with ``peak_flops_per_s[dt]`` within 1 % for
    every dtype the microarchitecture gives (the vector clock for fp32): the per-SM figures and the peaks of Table B
    tell one story."""
    profile = load_profile_file(path)
    micro = profile.microarch
    assert micro is not None
    given = micro.matrix_flops_per_clock_per_sm
    assert {"fp32", "bf16", "fp16"} <= set(given)
    for dt in given:
        rate = micro.sm_flops_per_s(dt)
        assert rate is not None
        assert micro.sm_count * rate == pytest.approx(profile.peak_flops_per_s[dt], rel=0.01), dt


def test_a_microarchitecture_figure_without_a_source_is_named() -> None:
    data = _profile_dict("nvidia-h200")
    del data["sources"]["microarch.l2_bytes"]
    assert parse_profile(data).unsourced() == ["microarch.l2_bytes"]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("smem_bytes_per_block", 10**6, "cannot exceed smem_bytes_per_sm"),
        ("warp_size", 48, "warp_size"),
        ("matrix_flops_per_clock_per_sm", {"fp4": 1}, "unknown dtype"),
        ("matrix_flops_per_clock_per_sm", {"bf16": 0}, "FLOPs per clock"),
        ("sm_count", 0, "sm_count"),
    ],
)
def test_an_impossible_microarchitecture_is_refused(field: str, value: Any, match: str) -> None:
    data = _profile_dict("nvidia-h200")
    data["microarch"][field] = value
    with pytest.raises((ProfileError, ValueError), match=match):
        parse_profile(data)
