"""examples/train_dlrm.py where only torch is installed: without ``--url`` it says in one line that planning here
needs the planner extra (or a service), instead of a traceback on every rank.

A torch-only install is stood in for by a child that imports torch, then makes ``numpy`` and ``ortools`` fail to
import as they do where they are not installed (``None`` in ``sys.modules``), and runs the example as torchrun would
start rank 0 of a world of one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

TORCH_ONLY = """
import runpy, sys
import torch  # torch works without numpy
for name in [m for m in sys.modules if m.split('.')[0] in ('numpy', 'ortools')]:
    del sys.modules[name]
sys.modules['numpy'] = sys.modules['ortools'] = None  # import fails as where they are not installed
sys.argv = ['examples/train_dlrm.py', *sys.argv[1:]]
runpy.run_path('examples/train_dlrm.py', run_name='__main__')
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.dist
def test_planning_without_the_planner_extra_says_so_in_one_line() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", TORCH_ONLY, "--device", "cpu", "--steps", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith("error: planning here needs shardwise's planner extra (numpy is missing)")
    assert "--url" in line


@pytest.mark.dist
def test_the_sequence_example_plans_a_mixed_fleet_exports_and_trains(tmp_path: Path) -> None:
    """examples/train_hstu.py under torchrun, 2 ranks on 2 hosts (an H100 and an H200): its unpooled tables are
    planned, exported as TorchRec's plan for an EmbeddingCollection, and trained (a finite loss each step)."""
    import json
    import math

    torchrun = Path(sys.executable).parent / "torchrun"
    out = tmp_path / "tr.json"
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2", "examples/train_hstu.py", "--steps", "2"]
    done = subprocess.run(
        [*command, "--export", str(out)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fleet 1x1xnvidia-h100-sxm_1x1xnvidia-h200" in done.stdout
    losses = [float(line.split("loss ")[1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 2, done.stdout
    assert all(math.isfinite(x) for x in losses), done.stdout
    exported = json.loads(out.read_text())["plan"]["sparse"]
    assert set(exported) == {"sparse.item", "sparse.user"}
    assert all(
        e["sharding_type"] in ("table_wise", "row_wise", "column_wise", "data_parallel") for e in exported.values()
    )
