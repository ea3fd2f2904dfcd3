"""``shardwise kernels MODEL FLEET``: the kernel model's choice per linear layer, phase and GPU type, as printed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardwise.clients.cli import app
from shardwise.hwprofiles import get_profile
from shardwise.solver.kernels import choose, gemms_of, pick, vendor_us
from shardwise.wire.spec import DenseStyle, GemmPhase, ModelSpec

EXAMPLES = Path(__file__).parents[2] / "examples"
DLRM = EXAMPLES / "dlrm_dcnv2.json"
MIXED = str(EXAMPLES / "fleet_mixed_b200_mi350x.json")

#: layer, style, phase, gpu, M, N, K, dtype, kernel that runs, predicted µs, TFLOP/s, best Triton config (five words),
#: its µs, the vendor GEMM's µs
LINE = re.compile(
    r"^(\S+) +(\S+) +(forward|input_grad|weight_grad) +(\S+) +(\d+) +(\d+) +(\d+) +(\S+) +(vendor|triton) +"
    r"([\d.]+) +([\d.]+) +(\d+x\d+x\d+ w\d+ s\d+ g\d+ sk\d+) +([\d.]+) +([\d.]+)$"
)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_kernels_prints_each_linear_layers_choice_per_phase_and_gpu_type(runner: CliRunner) -> None:
    result = runner.invoke(app, ["kernels", str(DLRM), MIXED])
    assert result.exit_code == 0, result.output
    model = ModelSpec.model_validate_json(DLRM.read_text(encoding="utf-8"))
    rows = [m for line in result.stdout.splitlines() if (m := LINE.match(line))]
    linear = [d for d in model.dense_layers if d.kind == "linear"]
    assert len(rows) == len(linear) * 3 * 2  # layer × phase × GPU type (B200, MI350X)
    for m in rows:
        layer = next(d for d in linear if d.name == m[1])
        profile = get_profile(m[4])
        gemm = dict(gemms_of(layer, DenseStyle(m[2]), model.batch_size_per_gpu, 8))[GemmPhase(m[3])]  # 8 per host
        assert (int(m[5]), int(m[6]), int(m[7]), m[8]) == (gemm.m, gemm.n, gemm.k, gemm.dtype.value)
        picked = pick(gemm, profile)
        assert m[9] == picked.kernel.value
        assert float(m[10]) == pytest.approx(picked.us, abs=0.05)
        assert float(m[11]) == pytest.approx(gemm.flops / (picked.us * 1e-6) / 1e12, abs=0.05 + 0.001 * float(m[11]))
        config, triton_us = choose(gemm, profile)
        assert (m[12], float(m[13])) == (config.label, pytest.approx(triton_us, abs=0.05))
        assert float(m[14]) == pytest.approx(vendor_us(gemm, profile), abs=0.05)
    totals = [line for line in result.stdout.splitlines() if "µs per step with the chosen kernels" in line]
    assert [t.split(":")[0] for t in totals] == ["nvidia-b200", "amd-mi350x"]
    for line in totals:
        chosen, triton, vendor = (float(x) for x in re.findall(r"([\d.]+)(?: µs per step| with)", line))
        mine = [float(m[10]) for m in rows if m[4] == line.split(":")[0]]
        assert chosen == pytest.approx(sum(mine), abs=0.05 * len(mine))
        # Triton runs a GEMM only where it is predicted clearly faster than the vendor GEMM, which runs the rest
        assert chosen <= vendor + 0.05 * len(mine)
        assert chosen != pytest.approx(triton, abs=0.05 * len(mine))


def test_kernels_for_graphed_steps_pick_on_device_time(runner: CliRunner) -> None:
    """``--graphed-steps``: every row is the pick of a profile whose steps are graphed (no Triton launch host term),
    so the small 13-feature GEMMs that eager steps leave to the vendor run Triton, and only such moves happen."""
    eager = runner.invoke(app, ["kernels", str(DLRM), MIXED])
    graphed = runner.invoke(app, ["kernels", str(DLRM), MIXED, "--graphed-steps"])
    assert eager.exit_code == 0, eager.output
    assert graphed.exit_code == 0, graphed.output
    assert "graphed steps" in graphed.stdout.splitlines()[0]
    assert "eager steps" in eager.stdout.splitlines()[0]
    model = ModelSpec.model_validate_json(DLRM.read_text(encoding="utf-8"))
    before = [m for line in eager.stdout.splitlines() if (m := LINE.match(line))]
    after = [m for line in graphed.stdout.splitlines() if (m := LINE.match(line))]
    assert len(before) == len(after)
    moved = 0
    for e, g in zip(before, after, strict=True):
        assert e.groups()[:8] == g.groups()[:8]  # the same layer, style, phase, GPU and GEMM
        layer = next(d for d in model.dense_layers if d.name == g[1])
        gemm = dict(gemms_of(layer, DenseStyle(g[2]), model.batch_size_per_gpu, 8))[GemmPhase(g[3])]
        profile = get_profile(g[4])
        steps = profile.overheads.model_copy(update={"graphed_steps": True})
        replayed = profile.model_copy(update={"overheads": steps})
        assert g[9] == pick(gemm, replayed).kernel.value
        if e[9] != g[9]:
            assert (e[9], g[9]) == ("vendor", "triton")
            assert float(g[10]) < float(e[10])
            moved += 1
    assert moved >= 4  # the 13-feature layer's forward and input gradient on both GPU types at least


def test_kernels_takes_the_style_and_batch_asked_for(runner: CliRunner) -> None:
    result = runner.invoke(app, ["kernels", str(DLRM), MIXED, "--style", "colwise", "--batch", "1024"])
    assert result.exit_code == 0, result.output
    assert "1,024 samples per GPU" in result.stdout
    rows = [m for line in result.stdout.splitlines() if (m := LINE.match(line))]
    top = [m for m in rows if m[1] == "top_mlp.0" and m[3] == "forward"]
    # colwise over the 8 GPUs of a host: the host's 8·1,024 rows, out/8 = 128 outputs, in = 3,456
    assert {(int(m[5]), int(m[6]), int(m[7])) for m in top} == {(8192, 128, 3456)}
    assert {m[2] for m in rows} == {"colwise"}


def test_kernels_names_unclassified_layers(runner: CliRunner, tmp_path: Path) -> None:
    model = json.loads(DLRM.read_text(encoding="utf-8"))
    model["dense_layers"].append(
        {
            "name": "interaction",
            "kind": "unclassified",
            "flops_per_sample": 1000,
            "activation_bytes_per_sample": 64,
            "param_count": 0,
        }
    )
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model), encoding="utf-8")
    result = runner.invoke(app, ["kernels", str(path), MIXED])
    assert result.exit_code == 0, result.output
    assert "unclassified layers" in result.stdout
    assert "interaction" in result.stdout.splitlines()[-1]


def test_a_fleet_without_microarchitecture_is_one_line_and_exit_2(runner: CliRunner, tmp_path: Path) -> None:
    gpu = get_profile("nvidia-h100-sxm").model_dump()
    gpu.update(name="bare-gpu", sources={}, microarch=None)
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"name": "bare", "hosts": [{"gpu": gpu, "count": 1}]}), encoding="utf-8")
    result = runner.invoke(app, ["kernels", str(DLRM), str(fleet)])
    assert result.exit_code == 2
    assert "no GPU of fleet bare has a microarchitecture" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_bad_style_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["kernels", str(DLRM), MIXED, "--style", "diagonal"])
    assert result.exit_code == 2
