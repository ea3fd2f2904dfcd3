"""The README, run as a user would after the quick start: its shell and Python blocks, in order, against a live server.

Every ```` ```bash ```` and ```` ```python ```` block of README.md carries a marker on the line before it:

* ``<!-- readme: run -->`` — run here;
* ``<!-- readme: run, needs torch -->`` — run here when torch is installed (``make install-torch``; ``make test``
  installs it), skipped with that reason otherwise;
* ``<!-- readme: skip (REASON) -->`` — not run, and the README says why (it needs GPUs, it is the test suite itself...).

A block without a marker fails ``test_every_block_says_whether_it_runs``, so a new example is run unless its author
says why not. The blocks run in a copy of the checkout (the tracked tree: no ``.venv`` of its own, no database, no
``.env``) whose ``.venv`` is a link to the environment running the tests, against ``shardwise serve`` started there
as ``make run`` starts it (SQLite ``./shardwise.db``, migrated on start), on a free loopback port instead of 8000:
``http://127.0.0.1:8000`` in a block is replaced by that address, and ``SHARDWISE_URL`` names it for the CLI and the
client. The shell blocks run under ``bash -euo pipefail`` with the ``PATH`` a user has before activating anything (the
virtual environment's ``bin`` taken out), so a block that assumes ``shardwise`` on the ``PATH`` fails here as it would
for them. The Python blocks run one by one, each a script of its own, with ``.venv/bin/python``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from server_support import free_port, stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_URL = "http://127.0.0.1:8000"
BLOCK_TIMEOUT_S = 300
MARKER = re.compile(r"^<!-- readme: (run|run, needs torch|skip \((?P<reason>.+)\)) -->$")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # run, "run, needs torch", skip (...) or None
    reason: str | None = None

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang}"


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block, with the marker on the line before it (if any)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        previous = lines[start - 1].strip() if start else ""
        marker = MARKER.match(previous)
        blocks.append(
            Block(
                line=start + 1,
                lang=fence.group(1),
                code="\n".join(lines[start + 1 : end]) + "\n",
                marker=None if marker is None else marker.group(1),
                reason=None if marker is None else marker.group("reason"),
            )
        )
        i = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
RUNNABLE = [b for b in BLOCKS if b.lang in ("bash", "python") and b.marker and b.marker.startswith("run")]


def test_every_block_says_whether_it_runs() -> None:
    unmarked = [b.id for b in BLOCKS if b.lang in ("bash", "python") and b.marker is None]
    assert not unmarked, f"README blocks with no <!-- readme: run|skip (reason) --> marker: {unmarked}"
    assert len(RUNNABLE) >= 5, [b.id for b in RUNNABLE]


def copy_checkout(dest: Path) -> None:
    """What a fresh clone holds: the files git tracks (and new ones it does not ignore), links kept as links."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet committed
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def user_path() -> str:
    """The ``PATH`` before ``source .venv/bin/activate``: without the test environment's ``bin``."""
    venv_bin = str(Path(sys.prefix) / "bin")
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)


@dataclass(frozen=True)
class Checkout:
    path: Path
    base_url: str
    env: dict[str, str]
    log: Path


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkout]:
    """A copy of the checkout with ``.venv`` linked in, ``shardwise serve`` running in it (as ``make run`` runs it)."""
    path = tmp_path_factory.mktemp("readme") / "shardwise"
    copy_checkout(path)
    (path / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SHARDWISE_") and k not in ("VIRTUAL_ENV", "PYTHONHOME")
    }
    # an editable install points at the original checkout: the copy's sources come first
    env.update({"PATH": user_path(), "PYTHONPATH": str(path), "SHARDWISE_URL": base, "SHARDWISE_LOG_JSON": "false"})
    log = path.parent / "server.log"
    with log.open("ab") as out:
        server = subprocess.Popen(
            [str(path / ".venv" / "bin" / "shardwise"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        try:
            wait_ready(server, base, timeout_s=120, log=log)
        except RuntimeError as exc:
            pytest.fail(f"shardwise serve: {exc}")
        yield Checkout(path, base, env, log)
    finally:
        stop(server, timeout_s=30)


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_readme_block_runs(block: Block, checkout: Checkout) -> None:
    if block.marker == "run, needs torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (make install-torch)")
    code = block.code.replace(README_URL, checkout.base_url)
    if block.lang == "bash":
        command = ["bash", "-euo", "pipefail", "-c", code]
    else:
        script = checkout.path.parent / f"readme_{block.id}.py"
        script.write_text(code, encoding="utf-8")
        command = [str(checkout.path / ".venv" / "bin" / "python"), str(script)]
    try:
        done = subprocess.run(
            command, cwd=checkout.path, env=checkout.env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"README block at line {block.line} ran past {BLOCK_TIMEOUT_S} s: {exc.stdout!r} {exc.stderr!r}")
    server_log = checkout.log.read_text(errors="replace").splitlines()[-30:]
    assert done.returncode == 0, (
        f"README block at line {block.line} exited {done.returncode}\n--- block\n{code}--- stdout\n{done.stdout}"
        f"--- stderr\n{done.stderr}--- server log (tail)\n" + "\n".join(server_log)
    )


def test_the_install_section_installs_a_cpu_torch_before_the_torch_extra() -> None:
    """``pip install '.[torch]'`` alone takes the package index's default torch, the CUDA build (5 GB): the install
    section puts torch's CPU build first, which the extra then keeps."""
    (block,) = [b for b in BLOCKS if "pip install '.[torch]'" in b.code]
    lines = [line.split("#")[0].strip() for line in block.code.splitlines()]
    cpu = [i for i, line in enumerate(lines) if line.startswith("pip install torch") and "whl/cpu" in line]
    extra = lines.index("pip install '.[torch]'")
    assert cpu, block.code
    assert cpu[0] < extra, block.code
