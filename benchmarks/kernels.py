"""The kernel model against a real GPU: every configuration of ``config_space()`` timed on GEMMs of real models, and
the kernel model's choice scored against the best one found.

Measure (one NVIDIA GPU; needs torch, Triton, numpy, pydantic and pyyaml — shardwise's wire and solver are
imported for the configuration space)::

    python3 -u benchmarks/kernels.py --out kernels_h200.json            # the sweep (stops after 8 min: --budget-s)
    python3 -u benchmarks/kernels.py --quick --out k.json               # smoke: 10 shapes, 20 configurations
    python3 benchmarks/kernels.py --list                                # the shapes and their origins, no GPU
    TRITON_INTERPRET=1 python3 benchmarks/kernels.py --device cpu --out s.json  # the whole path on the CPU

Report (the CPU, no GPU; the kernel model with the ``nvidia-h200`` catalogue profile)::

    python3 benchmarks/kernels.py --report kernels_h200.json [--plot docs/kernels.png] [--profile nvidia-h200]

The shapes (:func:`shapes`): every linear layer contributes its three GEMMs (``forward`` ``X·Wᵀ``, ``input_grad``
``dY·W``, ``weight_grad`` ``dYᵀ·X``, operands as the executor passes them: ``Wᵀ`` and ``dYᵀ`` are strided views),
each listed with its origin — the examples' MLPs (examples/*.json, examples/train_dlrm.py's benchmark DLRM) at
1K, 4K, 16K and 64K samples per GPU, DCN-v2 cross layers (examples/dlrm_dcnv2.json), a sequence recommender's
transformer block (d = 512 and 1024; QKV d → 3d, attention output d → d, FFN d → 4d → d; 50 and 200 tokens × 64 and
256 sequences) and tensor-parallel slices over 8 GPUs (colwise N/8, rowwise K/8). Identical GEMMs are timed once
with every origin listed. dtypes: bf16, fp16 and fp8 e4m3 (output bf16; a configuration Triton cannot build for
fp8 is recorded with its error); the ragged GEMMs (a size no multiple of 16: 13 dense features in, one logit out)
in bf16 only (:data:`RAGGED_DTYPES`), since each ragged size class costs a compiled kernel per configuration.

Measurement: ``TRITON_CACHE_DIR`` is one directory (a fresh temporary one unless set); first every configuration ×
dtype × operand specialisation (Triton compiles one kernel per layout and per divisibility-by-16 class of the
sizes and strides) is compiled by ``--workers`` processes (default 16), each launching the kernel once on tiny
operands of the same specialisation; compile failures (shared memory, registers) are recorded per configuration.
Then, one GEMM at a time, on operands drawn once per shape and dtype (``randn``, cast): each configuration is
launched once untimed (the kernel loaded), then once between two CUDA events. A configuration that took more than
:data:`ABORT_RATIO` × the best time so far for that GEMM (and over :data:`ABORT_FLOOR_US`) is recorded with that one
launch (``reps`` 1): it is neither the best nor near it. Otherwise: above :data:`LONG_US`, two more single launches
between events; below, ``n`` launches (``n·t ≈`` :data:`TARGET_US`) queued behind ``torch.cuda._sleep`` so that the
GPU runs them back to back (not waiting for the host to launch them), :data:`REPS` times, each between CUDA events;
the figure is the median per launch. No L2 flush: back-to-back launches of one GEMM find its operands in L2 when
they fit (50 MB on an H200), as consecutive layers of a training step partly do. cuBLAS: ``torch.matmul`` on the same
operands (fp8: ``torch._scaled_mm`` with unit scales on row-major A and column-major B copies, the layout it
requires), timed the same way.

The JSON (``--out``): ``machine`` (GPU name, SMs, torch / Triton / CUDA / driver versions), ``timing`` (the method's
constants), ``configs`` (the configurations timed, in ``config_space()`` order, with their index there) and
``results``: per GEMM × dtype its ``origins``, ``phase``, ``m n k``, ``a_t b_t``, ``us`` (µs per configuration,
null where it failed), ``reps``, ``errors`` (configuration index → message), ``cublas_us`` (or ``cublas_error``).
``--budget-s`` stops the sweep early (``complete`` false) with what was measured.

The report (:func:`report`): per dtype and overall — the shapes, the configurations, the geometric mean over
shapes of best measured / chosen configuration's measured time (the target ≥ 95%), the worst shape (≥ 80%), the
median |predicted − measured| / measured of the chosen configuration (≤ 15%), cuBLAS against the best and the chosen
Triton configuration (geomean of cuBLAS µs / Triton µs: above 1, Triton is faster) and the CPU time of one
``choose`` (≤ 1 ms; the arrays the model caches per profile and dtype are built once before the timing, and the
run's JSON objects are frozen out of Python's garbage collector first).
``--split fit|held-out|all``: the GEMMs of one half (:func:`half`, a stable hash of the shape, phase and layouts,
the same in every dtype) — the model's fitted constants learnt from the fit half only; the held-out half checks them.
With a subset of the space timed (``--quick``) the choice is the least predicted time among
the timed configurations. A chosen configuration that failed on the GPU counts as 0% and is listed.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from shardwise.solver.kernels import config_space  # noqa: E402
from shardwise.wire.spec import KernelConfig  # noqa: E402

DTYPES = ("bf16", "fp16", "fp8")
PHASES = ("forward", "input_grad", "weight_grad")
SAMPLES = (1024, 4096, 16384, 65536)  # samples per GPU for the MLPs and DCN layers
TP = 8

#: a configuration slower than this × the best so far (and over ABORT_FLOOR_US) keeps its one timed launch
ABORT_RATIO = 3.0
ABORT_FLOOR_US = 50.0
#: at or above this, single launches between events; below, n back-to-back launches
LONG_US = 200.0
#: GPU time per repetition of back-to-back launches (at most MAX_LAUNCHES launches)
TARGET_US = 60.0
REPS = 3
MAX_LAUNCHES = 16
#: the dtypes that time the ragged GEMMs too (each ragged size class is a kernel of its own per configuration
#: and dtype: compile time; fp8 GEMMs need sizes divisible by 16 in cuBLAS as well)
RAGGED_DTYPES = ("bf16",)
#: configurations per compile task
COMPILE_CHUNK = 12

QUICK_SHAPES = 10
QUICK_CONFIGS = 20


def _now() -> str:
    return time.strftime("%H:%M:%S")


def log(msg: str) -> None:
    print(f"[{_now()}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------------ shapes


@dataclass
class Shape:
    """One GEMM ``C[m, n] = A[m, k]·B[k, n]``; ``a_t``: A is a transposed view (M contiguous), ``b_t``: B is a
    transposed view (K contiguous)."""

    phase: str
    m: int
    n: int
    k: int
    a_t: bool
    b_t: bool
    origins: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, int, int, bool, bool]:
        return (self.m, self.n, self.k, self.a_t, self.b_t)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def ragged(self) -> bool:
        """A size no multiple of 16 (the 13 dense features of a DLRM's first layer, its one-logit last layer)."""
        return any(d % 16 for d in (self.m, self.n, self.k))


def linear_gemms(rows: int, d_in: int, d_out: int) -> list[tuple[str, int, int, int, bool, bool]]:
    """The three GEMMs of ``Y = X·Wᵀ`` over ``rows`` rows, ``W`` stored ``d_out × d_in`` (the executor's operands)."""
    return [
        ("forward", rows, d_out, d_in, False, True),
        ("input_grad", rows, d_in, d_out, False, False),
        ("weight_grad", d_out, d_in, rows, True, False),
    ]


def _example_layers() -> list[tuple[str, int, int]]:
    """(origin, in, out) of every linear layer of examples/*.json and of examples/train_dlrm.py's benchmark DLRM."""
    out: list[tuple[str, int, int]] = []
    for path in sorted((ROOT / "examples").rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for layer in data.get("dense_layers", []):
            if layer.get("kind") == "linear" and layer.get("in_features") and layer.get("out_features"):
                rel = path.relative_to(ROOT)
                out.append((f"{rel}:{layer['name']}", int(layer["in_features"]), int(layer["out_features"])))
    # benchmarks/gpu_step_time.py's DLRM (examples/train_dlrm.py): 13 → 256 → 128, top 1024 → 512 → 256 → 1
    for name, i, o in (("bottom.0", 13, 256), ("bottom.1", 256, 128), ("top.0", 1024, 512), ("top.1", 512, 256)):
        out.append((f"examples/train_dlrm.py (gpu_step_time DLRM):{name}", i, o))
    return out


def _transformer_layers(tp: int = 1) -> list[tuple[str, int, int, int]]:
    """(origin, rows, in, out) of a sequence recommender's transformer block (QKV, attention out, FFN 4×); with
    ``tp`` > 1 its tensor-parallel slices (QKV and FFN up colwise: out/tp; attention out, FFN down rowwise: in/tp)."""
    out: list[tuple[str, int, int, int]] = []
    for d in (512, 1024):
        for seq, seqs in ((50, 64), (50, 256), (200, 64), (200, 256)):
            rows = seq * seqs
            if tp > 1 and (d, seq, seqs) not in ((1024, 200, 64), (1024, 200, 256), (512, 200, 256)):
                continue
            where = f"transformer d={d} seq={seq}×{seqs}"
            layers = [("qkv", d, 3 * d), ("attn_out", d, d), ("ffn_up", d, 4 * d), ("ffn_down", 4 * d, d)]
            for name, i, o in layers:
                if tp > 1:
                    if name in ("qkv", "ffn_up"):
                        o, name = o // tp, f"{name} colwise/{tp}"
                    else:
                        i, name = i // tp, f"{name} rowwise/{tp}"
                out.append((f"{where}:{name}", rows, i, o))
    return out


def shapes() -> list[Shape]:
    """Every GEMM of the sweep, identical ones merged (their origins listed), in a stable order."""
    found: dict[tuple[int, int, int, bool, bool], Shape] = {}

    def add(origin: str, rows: int, d_in: int, d_out: int) -> None:
        for phase, m, n, k, a_t, b_t in linear_gemms(rows, d_in, d_out):
            s = found.setdefault((m, n, k, a_t, b_t), Shape(phase, m, n, k, a_t, b_t))
            s.origins.append(f"{origin} {phase} @{rows}")

    for origin, d_in, d_out in _example_layers():
        for rows in SAMPLES:
            add(origin, rows, d_in, d_out)
    for origin, rows, d_in, d_out in _transformer_layers():
        add(origin, rows, d_in, d_out)
    for origin, rows, d_in, d_out in _transformer_layers(TP):
        add(origin, rows, d_in, d_out)
    # tensor-parallel slices of the DCN-v2 example's widest layers (examples/dlrm_dcnv2.json), 8 GPUs
    for rows in (16384, 65536):
        add(f"examples/dlrm_dcnv2.json:dcn.0.up colwise/{TP}", rows, 512, 3456 // TP)
        add(f"examples/dlrm_dcnv2.json:top_mlp.0 rowwise/{TP}", rows, 3456 // TP, 1024)
    return list(found.values())


def quick_shapes(all_shapes: Sequence[Shape]) -> list[Shape]:
    """:data:`QUICK_SHAPES` spread over the list (every phase, small to large)."""
    step = max(1, len(all_shapes) // QUICK_SHAPES)
    return list(all_shapes[::step][:QUICK_SHAPES])


def spread_configs(count: int = QUICK_CONFIGS) -> list[int]:
    """``count`` indices spread evenly over ``config_space()`` (the first and the last among them)."""
    n = len(config_space())
    if count >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / max(1, count - 1)) for i in range(count)})


# ------------------------------------------------------------------------------------------------ on the GPU


def _canonical(d: int) -> int:
    """A small size in the same Triton specialisation class as ``d`` (== 1, divisible by 16, neither): the
    compile workers build the kernel on operands of these sizes; the launch on the real ones reuses it."""
    if d <= 64:
        return d
    return 64 + d % 16


def spec_key(s: Shape) -> tuple[int, int, int, bool, bool]:
    return (_canonical(s.m), _canonical(s.n), _canonical(s.k), s.a_t, s.b_t)


def _torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}[name]


def operands(
    m: int, n: int, k: int, a_t: bool, b_t: bool, dtype: str, seed: int = 0, device: str = "cuda"
) -> tuple[Any, Any]:
    """A (m × k) and B (k × n) on the GPU in ``dtype``, as views of the layout the executor passes."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    dt = _torch_dtype(dtype)
    a = torch.randn((k, m) if a_t else (m, k), device=device, generator=g).to(dt)
    b = torch.randn((n, k) if b_t else (k, n), device=device, generator=g).to(dt)
    return (a.t() if a_t else a), (b.t() if b_t else b)


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return (text[0] if text else type(err).__name__)[:240]


def _compile_worker(task: tuple[str, tuple[int, int, int, bool, bool], list[int]]) -> dict[int, str]:
    """Compile configurations ``indices`` for one dtype and specialisation (``triton_matmul.warmup`` on tiny
    operands of the same class: no launch, so the GPU stays free for the timing); the failures by index."""
    import torch

    from shardwise.runtime.kernels import matmul as triton_matmul

    dtype, (m, n, k, a_t, b_t), indices = task
    dt = _torch_dtype(dtype)
    a = torch.empty((k, m) if a_t else (m, k), device="cuda", dtype=dt)
    b = torch.empty((n, k) if b_t else (k, n), device="cuda", dtype=dt)
    a, b = (a.t() if a_t else a), (b.t() if b_t else b)
    failures: dict[int, str] = {}
    for index in indices:
        try:
            triton_matmul.warmup(a, b, config_space()[index])
        except Exception as e:
            failures[index] = _short(e)
    return failures


def _worker_init() -> None:
    import torch

    torch.cuda.set_device(0)


class Compiler:
    """The compile workers: every (dtype, specialisation) the sweep will need, in the order it needs them, cut
    into tasks of :data:`COMPILE_CHUNK` configurations; :meth:`wait` blocks until one (dtype, specialisation) is
    compiled and gives its failures. The sweep measures while later ones compile."""

    def __init__(self, order: Sequence[tuple[str, tuple[int, int, int, bool, bool]]], indices: Sequence[int],
                 workers: int) -> None:  # fmt: skip
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        self.futures: dict[tuple[str, tuple[int, int, int, bool, bool]], list[Any]] = {}
        self.total = len(order) * len(indices)
        self.start = time.perf_counter()
        self.pool: Any = None
        if workers < 1:
            log("no compile workers: every kernel compiles on its first launch (slow)")
            return
        self.pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_worker_init)
        for dtype, key in order:
            chunks = [list(indices[i : i + COMPILE_CHUNK]) for i in range(0, len(indices), COMPILE_CHUNK)]
            self.futures[(dtype, key)] = [self.pool.submit(_compile_worker, (dtype, key, c)) for c in chunks]
        log(f"compiling {len(indices)} configurations × {len(order)} (dtype, specialisation) = {self.total} kernels"
            f" with {workers} workers, while measuring")  # fmt: skip

    def wait(self, dtype: str, key: tuple[int, int, int, bool, bool]) -> dict[int, str]:
        t0 = time.perf_counter()
        failures: dict[int, str] = {}
        for fut in self.futures.get((dtype, key), []):
            try:
                failures.update(fut.result())
            except Exception as e:  # a worker died: the sweep compiles what it lacks on its first launch
                log(f"  a compile task for {dtype} {key} failed ({_short(e)}); compiling on first launch instead")
        if time.perf_counter() - t0 > 1.0:
            done = sum(f.done() for fs in self.futures.values() for f in fs)
            total = sum(len(fs) for fs in self.futures.values())
            log(f"  waited {time.perf_counter() - t0:.0f} s for {dtype} {key}: {done}/{total} compile tasks done"
                f" after {time.perf_counter() - self.start:.0f} s")  # fmt: skip
        return failures

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


class Timer:
    """CUDA-event timing of one GEMM launcher (see the module docstring). ``launch_us``: the host's time per
    launch, learnt from every run (the ``_sleep`` in front of a run covers it with a margin); a run whose launches
    took longer to queue than the sleep lasted is run again with a longer sleep (``host_bound`` counts those)."""

    def __init__(self) -> None:
        import torch

        self.torch: Any = torch
        self.launch_us = 30.0
        self.host_bound = 0
        s, e = self._events(2)
        self.torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        s.record()
        self.torch.cuda._sleep(2_000_000)
        e.record()
        e.synchronize()
        self.cycles_per_us = 2_000_000 / (s.elapsed_time(e) * 1e3)

    def _events(self, n: int) -> list[Any]:
        return [self.torch.cuda.Event(enable_timing=True) for _ in range(n)]

    def _run(self, fn: Callable[[], Any], n: int, reps: int) -> list[float]:
        """µs per launch of ``reps`` runs of ``n`` back-to-back launches, queued behind a sleep."""
        for _ in range(3):
            ev = self._events(reps + 1)
            sleep_us = 20.0 + 1.5 * (reps * n + 1) * self.launch_us
            self.torch.cuda._sleep(int(sleep_us * self.cycles_per_us))
            t0 = time.perf_counter()
            ev[0].record()
            for r in range(reps):
                for _ in range(n):
                    fn()
                ev[r + 1].record()
            host_us = (time.perf_counter() - t0) * 1e6
            ev[-1].synchronize()
            self.launch_us = max(5.0, 0.8 * self.launch_us + 0.2 * host_us / (reps * n))
            if host_us < sleep_us:
                break
            self.host_bound += 1
        return [ev[r].elapsed_time(ev[r + 1]) * 1e3 / n for r in range(reps)]

    def time(self, fn: Callable[[], Any], best: float | None) -> tuple[float, int]:
        """(µs per launch, launches behind the figure) of ``fn``; ``best``: the best time so far on this GEMM."""
        fn()  # loads the kernel; untimed
        (t0,) = self._run(fn, 1, 1)
        if best is not None and t0 > ABORT_RATIO * best and t0 > ABORT_FLOOR_US:
            return t0, 1
        if t0 >= LONG_US:
            return statistics.median([t0, *self._run(fn, 1, REPS - 1)]), REPS
        n = max(2, min(MAX_LAUNCHES, math.ceil(TARGET_US / max(t0, 1.0))))
        return statistics.median(self._run(fn, n, REPS)), REPS * n


class HostTimer:
    """``--device cpu`` (a smoke test of the whole path under Triton's interpreter): the host clock around one
    call. Its figures time the interpreter, not a kernel."""

    host_bound = 0

    def time(self, fn: Callable[[], Any], best: float | None) -> tuple[float, int]:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6, 1


def cpu_facts() -> dict[str, Any]:
    import platform

    import torch
    import triton

    return {"gpu": f"cpu ({platform.machine()}, Triton interpreter)", "torch": torch.__version__,
            "triton": triton.__version__}  # fmt: skip


def cpu_shapes() -> list[Shape]:
    """``--device cpu``: the three GEMMs of two small layers (one ragged), cheap under the interpreter."""
    out: list[Shape] = []
    for d_in, d_out in ((32, 48), (13, 16)):
        for phase, m, n, k, a_t, b_t in linear_gemms(48, d_in, d_out):
            out.append(Shape(phase, m, n, k, a_t, b_t, [f"smoke {d_in} → {d_out} {phase} @48"]))
    return out


def _cublas(a: Any, b: Any, dtype: str) -> Callable[[], Any]:
    import torch

    if dtype != "fp8":
        return lambda: torch.matmul(a, b)
    a_rm = a.contiguous()
    b_cm = b.t().contiguous().t()
    one = torch.ones((), device=a.device)
    return lambda: torch._scaled_mm(a_rm, b_cm, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def machine() -> dict[str, Any]:
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    facts: dict[str, Any] = {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import subprocess

        facts["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        facts["driver"] = None
    return facts


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep (see the module docstring); the JSON document. dtype by dtype (a budget that runs out leaves the
    first dtypes whole), GEMMs of one specialisation together (the compile workers finish them in that order)."""
    cpu = args.device == "cpu"
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="shardwise-triton-"))
    import torch

    from shardwise.runtime.kernels import matmul as triton_matmul

    if cpu and not triton_matmul.interpreting():
        raise SystemExit(
            "benchmarks/kernels.py: --device cpu runs the kernel in Triton's interpreter: set TRITON_INTERPRET=1"
        )
    begin = time.perf_counter()
    all_shapes = cpu_shapes() if cpu else shapes()
    todo = quick_shapes(all_shapes) if args.quick else all_shapes
    keys = list(dict.fromkeys(spec_key(s) for s in todo))  # first-seen order: the common ones first
    todo = sorted(todo, key=lambda s: keys.index(spec_key(s)))
    plan = {d: [s for s in todo if d in RAGGED_DTYPES or not s.ragged] for d in args.dtypes.split(",") if d}
    count = args.configs or (QUICK_CONFIGS if args.quick else len(config_space()))
    indices = spread_configs(count)
    dtypes = [d for d in args.dtypes.split(",") if d]
    space = config_space()
    facts = machine() if not cpu else dict.fromkeys(("sms", "cuda", "driver")) | cpu_facts()
    log(f"{facts['gpu']} ({facts['sms']} SMs), torch {facts['torch']}, Triton {facts['triton']}, "
        f"CUDA {facts['cuda']}, driver {facts['driver']}")  # fmt: skip
    counts = ", ".join(f"{len(v)} {d}" for d, v in plan.items())
    log(f"GEMMs: {counts}; {len(indices)} configurations; TRITON_CACHE_DIR={os.environ['TRITON_CACHE_DIR']}")
    needed = [(d, k) for d in dtypes for k in keys if any(spec_key(s) == k for s in plan[d])]
    compiler = Compiler(needed, indices, 0 if cpu else args.workers)
    timer: Any = HostTimer() if cpu else Timer()
    doc: dict[str, Any] = {
        "machine": facts,
        "timing": {
            "abort_ratio": ABORT_RATIO,
            "abort_floor_us": ABORT_FLOOR_US,
            "long_us": LONG_US,
            "target_us": TARGET_US,
            "reps": REPS,
            "max_launches": MAX_LAUNCHES,
            "l2_flush": False,
        },
        "quick": bool(args.quick),
        "complete": False,
        "configs": [{"index": i, **space[i].model_dump()} for i in indices],
        "results": [],
    }
    slow_first = 0
    try:
        for dtype in dtypes:
            for si, s in enumerate(plan[dtype]):
                if time.perf_counter() - begin > args.budget_s:
                    log(f"budget of {args.budget_s:.0f} s spent: stopping with {len(doc['results'])} GEMM × dtype")
                    return doc
                failures = compiler.wait(dtype, spec_key(s))
                rec, slow = _measure_one(
                    s, dtype, si, indices, failures, timer, triton_matmul.matmul, torch, args.device
                )
                slow_first += slow
                doc["results"].append(rec)
                if args.out and len(doc["results"]) % 40 == 0:
                    Path(args.out).write_text(json.dumps(doc))
        doc["complete"] = True
    finally:
        compiler.close()
        doc["timing"]["host_bound_reruns"] = timer.host_bound
        doc["timing"]["slow_first_launches"] = slow_first
        doc["timing"]["wall_s"] = time.perf_counter() - begin
    log(f"done in {time.perf_counter() - begin:.0f} s; {slow_first} first launches over 1 s (compiled outside the"
        f" workers); {timer.host_bound} runs again for a host slower than the sleep")  # fmt: skip
    return doc


def _measure_one(
    s: Shape,
    dtype: str,
    si: int,
    indices: Sequence[int],
    failures: dict[int, str],
    timer: Any,
    matmul: Callable[..., Any],
    torch: Any,
    device: str = "cuda",
) -> tuple[dict[str, Any], int]:
    """Every configuration and cuBLAS on one GEMM × dtype; (the record, first launches over 1 s). ``timer``: a
    :class:`Timer`; ``failures``: configurations that did not compile, by index."""
    rec: dict[str, Any] = {"origins": s.origins, "phase": s.phase, "m": s.m, "n": s.n, "k": s.k, "a_t": s.a_t,
                           "b_t": s.b_t, "dtype": dtype, "us": [], "reps": [], "errors": {}}  # fmt: skip
    space = config_space()
    try:
        a, b = operands(s.m, s.n, s.k, s.a_t, s.b_t, dtype, seed=si, device=device)
    except Exception as e:
        rec["operand_error"] = _short(e)
        return rec, 0
    best: float | None = None
    slow = 0
    for i in indices:
        us: float | None = None
        reps = 0
        if i in failures:
            rec["errors"][str(i)] = failures[i]
        else:
            cfg = space[i]
            t_first = time.perf_counter()
            try:
                us, reps = timer.time(lambda cfg=cfg: matmul(a, b, cfg), best)
            except Exception as e:  # out of resources at load, ...: recorded
                rec["errors"][str(i)] = _short(e)
                if device == "cuda":
                    try:
                        torch.cuda.synchronize()
                    except Exception as sticky:  # a CUDA error poisons the context: say so and stop
                        raise RuntimeError(f"configuration {i}: {_short(e)}; the CUDA context is lost") from sticky
            slow += time.perf_counter() - t_first > 1.0
        rec["us"].append(us)
        rec["reps"].append(reps)
        if us is not None:
            best = us if best is None else min(best, us)
    try:
        rec["cublas_us"], _ = timer.time(_cublas(a, b, dtype), None)
    except Exception as e:
        rec["cublas_us"] = None
        rec["cublas_error"] = _short(e)
    tflops = s.flops / (best * 1e-6) / 1e12 if best else 0.0
    cublas = f"{rec['cublas_us']:.1f} µs" if rec["cublas_us"] else "failed"
    log(f"{dtype} {s.phase} M={s.m} N={s.n} K={s.k}: best {best or float('nan'):.1f} µs ({tflops:.0f} TFLOP/s), "
        f"cuBLAS {cublas}, {len(rec['errors'])} configurations failed")  # fmt: skip
    return rec, slow


# ------------------------------------------------------------------------------------------------ the report


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs and all(x > 0 for x in xs) else 0.0


SPLITS = ("fit", "held-out", "all")


def half(phase: str, m: int, n: int, k: int, a_t: bool, b_t: bool) -> str:
    """The half a GEMM belongs to, ``"fit"`` or ``"held-out"``: the low bit of the first byte of the SHA-256 of
    ``"{m}x{n}x{k}|{phase}|{a_t}|{b_t}"`` (0: fit). Stable across runs, machines and Python versions, and blind to
    the dtype: a shape lands in the same half in bf16, fp16 and fp8. Only the fit half may guide the model's
    constants; the held-out half says whether what they learnt holds on shapes they never saw."""
    digest = hashlib.sha256(f"{m}x{n}x{k}|{phase}|{a_t}|{b_t}".encode()).digest()
    return "held-out" if digest[0] & 1 else "fit"


@dataclass
class Row:
    """One GEMM × dtype of a measured run, scored."""

    label: str
    dtype: str
    chosen: int  # index into the run's configs
    predicted_us: float
    chosen_us: float | None
    best_us: float
    cublas_us: float | None
    select_us: float
    half: str = "fit"  # :func:`half`
    vendor_chosen: bool = False  # the kernel model picks the vendor GEMM (cuBLAS) over the Triton configuration
    vendor_predicted_us: float = math.inf  # the vendor GEMM's predicted µs, as timed (8-bit: on K-major copies)
    # pick()'s own rule, which also charges the Triton launch's extra host time (TRITON_HOST_S): what a plan runs
    host_vendor_chosen: bool = False

    @property
    def efficiency(self) -> float:
        return self.best_us / self.chosen_us if self.chosen_us else 0.0

    @property
    def error(self) -> float | None:
        return abs(self.predicted_us - self.chosen_us) / self.chosen_us if self.chosen_us else None

    @property
    def picked_us(self) -> float | None:
        """Measured µs of the kernel the model picks among all candidates (the vendor GEMM included)."""
        return self.cublas_us if self.vendor_chosen else self.chosen_us

    @property
    def efficiency_all(self) -> float:
        """Best measured of all candidates (every configuration and the vendor) ÷ the picked kernel's measured."""
        best = min(self.best_us, self.cublas_us) if self.cublas_us else self.best_us
        return best / self.picked_us if self.picked_us else 0.0

    @property
    def efficiency_host(self) -> float:
        """As :attr:`efficiency_all`, for the kernel pick()'s own rule picks (the host term included): device time
        still, so it shows what the host term costs the device where it keeps a GEMM on the vendor."""
        best = min(self.best_us, self.cublas_us) if self.cublas_us else self.best_us
        picked = self.cublas_us if self.host_vendor_chosen else self.chosen_us
        return best / picked if picked else 0.0

    @property
    def vendor_error(self) -> float | None:
        return abs(self.vendor_predicted_us - self.cublas_us) / self.cublas_us if self.cublas_us else None

    @property
    def over_vendor(self) -> float | None:
        """Where the Triton configuration is picked against the vendor: its measured µs ÷ the vendor's."""
        if self.vendor_chosen or not self.cublas_us or not self.chosen_us:
            return None
        return self.chosen_us / self.cublas_us


def score(data: dict[str, Any], profile: Any) -> list[Row]:
    """Each measured GEMM × dtype with the kernel model's choice: ``choose`` when the run timed the whole space,
    else the least ``predict_us`` among the configurations it timed."""
    from shardwise.solver.kernels import Gemm, choose
    from shardwise.wire.spec import Dtype

    space = config_space()
    timed = [int(c["index"]) for c in data["configs"]]
    for c in data["configs"]:
        if KernelConfig.model_validate({k: v for k, v in c.items() if k != "index"}) != space[int(c["index"])]:
            raise ValueError(f"configuration {c['index']} of the run is not config_space()'s: another space")
    whole = timed == list(range(len(space)))
    for dt in sorted({r["dtype"] for r in data["results"]}):  # the per-(profile, dtype) cache, built once, untimed
        choose(Gemm(1024, 1024, 1024, Dtype(dt)), profile)
    # the run's JSON is millions of objects: a collection pass over them is not choose()'s time. Frozen without a
    # collection first: a full pass costs as much as what it keeps out (0.9 s a call under the test suite's heap)
    gc.freeze()
    try:
        return _score(data, profile, space, timed, whole)
    finally:
        gc.unfreeze()


def _score(
    data: dict[str, Any], profile: Any, space: Sequence[KernelConfig], timed: list[int], whole: bool
) -> list[Row]:
    from shardwise.solver.kernels import TRITON_HOST_S, TRITON_MARGIN, US, Gemm, choose, predict_us, vendor_us
    from shardwise.wire.spec import Dtype

    rows: list[Row] = []
    for r in data["results"]:
        us = r.get("us") or []
        ok = [u for u in us if u is not None]
        if not ok:
            continue
        gemm = Gemm(r["m"], r["n"], r["k"], Dtype(r["dtype"]), a_t=r["a_t"], b_t=r["b_t"])
        t0 = time.perf_counter()
        config, predicted = choose(gemm, profile)
        select_us = (time.perf_counter() - t0) * 1e6
        if whole:
            chosen = timed.index(space.index(config))
        else:
            pred = predict_us(gemm, profile)
            chosen = min(range(len(timed)), key=lambda j: pred[timed[j]])
            predicted = float(pred[timed[chosen]])
        # pick()'s rule on what was timed (the 8-bit vendor GEMM was timed on K-major copies, so without copies):
        # vendor_chosen on device time alone, the 0.8 margin; host_vendor_chosen as pick() decides, the Triton
        # launch's extra host time added to its side
        vendor = vendor_us(gemm, profile, copies=False)
        label = f"{r['phase']} {r['m']}×{r['n']}×{r['k']}"
        where = half(r["phase"], r["m"], r["n"], r["k"], r["a_t"], r["b_t"])
        rows.append(
            Row(
                label, r["dtype"], chosen, predicted, us[chosen], min(ok), r.get("cublas_us"), select_us, where,
                vendor_chosen=predicted > TRITON_MARGIN * vendor, vendor_predicted_us=vendor,
                host_vendor_chosen=predicted + TRITON_HOST_S * US > TRITON_MARGIN * vendor,
            )
        )  # fmt: skip
    return rows


def summarise(rows: Sequence[Row]) -> dict[str, Any]:
    """The report's figures for ``rows`` (see the module docstring)."""
    ran = [r for r in rows if r.chosen_us]
    worst = min(rows, key=lambda r: r.efficiency)
    errors = [e for r in rows if (e := r.error) is not None]
    with_cublas = [r for r in rows if r.cublas_us]
    return {
        "shapes": len(rows),
        "geomean_efficiency": _geomean([r.efficiency for r in ran]),
        "chosen_failed": [f"{r.label} {r.dtype}" for r in rows if not r.chosen_us],
        "worst_efficiency": worst.efficiency,
        "worst_shape": f"{worst.label} {worst.dtype}",
        "median_error": statistics.median(errors) if errors else float("nan"),
        "cublas_over_best": _geomean([r.cublas_us / r.best_us for r in with_cublas if r.cublas_us]),
        "cublas_over_chosen": _geomean([r.cublas_us / r.chosen_us for r in with_cublas if r.cublas_us and r.chosen_us]),
        "select_us_max": max(r.select_us for r in rows),
        "select_us_median": statistics.median(r.select_us for r in rows),
        **_summarise_all(rows),
    }


def _summarise_all(rows: Sequence[Row]) -> dict[str, Any]:
    """The figures of the choice among all candidates, the vendor GEMM included, over the GEMMs whose vendor GEMM
    was timed: geomean and worst of best-of-all ÷ picked, the share the vendor runs, the vendor model's median
    error, and where Triton is picked against the vendor, how much slower than it it measured (at most 1.05 is the
    target; ``against_vendor_over`` lists those above)."""
    timed = [r for r in rows if r.cublas_us]
    if not timed:
        return {"all_shapes": 0}
    worst = min(timed, key=lambda r: r.efficiency_all)
    host_worst = min(timed, key=lambda r: r.efficiency_host)
    against = [(r, x) for r in timed if (x := r.over_vendor) is not None]
    vendor_errors = [e for r in timed if (e := r.vendor_error) is not None]
    return {
        "all_shapes": len(timed),
        "all_geomean_efficiency": _geomean([r.efficiency_all for r in timed if r.picked_us]),
        "all_worst_efficiency": worst.efficiency_all,
        "all_worst_shape": f"{worst.label} {worst.dtype}",
        "vendor_share": sum(r.vendor_chosen for r in timed) / len(timed),
        "vendor_median_error": statistics.median(vendor_errors) if vendor_errors else float("nan"),
        "against_vendor": len(against),
        "against_vendor_worst": max((x for _, x in against), default=float("nan")),
        "against_vendor_over": [f"{r.label} {r.dtype}: {x:.2f}" for r, x in against if x > 1.05],
        # the same on device time for pick()'s own choice (the host term included): what a plan runs
        "host_geomean_efficiency": _geomean([e for r in timed if (e := r.efficiency_host) > 0]),
        "host_worst_efficiency": host_worst.efficiency_host,
        "host_worst_shape": f"{host_worst.label} {host_worst.dtype}",
        "host_vendor_share": sum(r.host_vendor_chosen for r in timed) / len(timed),
    }


def report(data: dict[str, Any], profile: Any, split: str = "all") -> tuple[dict[str, dict[str, Any]], list[Row]]:
    """Per dtype and ``"all"``: :func:`summarise`; and the rows. ``split``: the GEMMs of one :func:`half`
    (``"fit"``, ``"held-out"``) or ``"all"``."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is none of {', '.join(SPLITS)}")
    rows = [r for r in score(data, profile) if split == "all" or r.half == split]
    if not rows:
        raise ValueError(f"the run holds no measured GEMM{'' if split == 'all' else ' in the ' + split + ' half'}")
    out = {dt: summarise([r for r in rows if r.dtype == dt]) for dt in sorted({r.dtype for r in rows})}
    out["all"] = summarise(rows)
    return out, rows


def format_report(
    data: dict[str, Any], summary: dict[str, dict[str, Any]], profile_name: str, split: str = "all"
) -> str:
    m = data.get("machine", {})
    which = "" if split == "all" else f"; the {split} half of the GEMMs"
    lines = [
        f"Measured on {m.get('gpu', '?')} ({m.get('sms', '?')} SMs; torch {m.get('torch', '?')}, Triton "
        f"{m.get('triton', '?')}, CUDA {m.get('cuda', '?')}, driver {m.get('driver', '?')}); predicted with the "
        f"{profile_name} profile; {len(data['configs'])} configurations timed per GEMM{which}"
        + ("" if data.get("complete", True) else " (run stopped early: incomplete)"),
        "",
        "| dtype | GEMMs | chosen / best (geomean) | worst shape | median pred. error | cuBLAS / best Triton "
        "| cuBLAS / chosen | choose() CPU µs (median / max) |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for dt, s in summary.items():
        failed = f", {len(s['chosen_failed'])} chosen failed" if s["chosen_failed"] else ""
        lines.append(
            f"| {dt} | {s['shapes']} | {s['geomean_efficiency']:.1%}{failed} | {s['worst_efficiency']:.1%} "
            f"({s['worst_shape']}) | {s['median_error']:.1%} | {s['cublas_over_best']:.2f} | "
            f"{s['cublas_over_chosen']:.2f} | {s['select_us_median']:.0f} / {s['select_us_max']:.0f} |"
        )
    lines += ["", "targets: geomean ≥ 95%, worst ≥ 80%, median error ≤ 15%, choose() ≤ 1,000 µs; cuBLAS / Triton > 1: "
              "Triton faster"]  # fmt: skip
    lines += [
        "",
        "All candidates, the vendor GEMM (cuBLAS) included — the kernel model's pick:",
        "",
        "| dtype | GEMMs | picked / best of all (geomean) | worst shape | vendor picked | vendor median pred. error "
        "| Triton picked against the vendor | its worst measured / vendor |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for dt, s in summary.items():
        if not s.get("all_shapes"):
            continue
        over = f" ({len(s['against_vendor_over'])} over 1.05)" if s["against_vendor_over"] else ""
        lines.append(
            f"| {dt} | {s['all_shapes']} | {s['all_geomean_efficiency']:.1%} | {s['all_worst_efficiency']:.1%} "
            f"({s['all_worst_shape']}) | {s['vendor_share']:.0%} | {s['vendor_median_error']:.1%} | "
            f"{s['against_vendor']} | {s['against_vendor_worst']:.2f}{over} |"
        )
    lines += ["", "targets: geomean ≥ 95%, worst ≥ 80%, Triton picked against the vendor never over 1.05 × its time"]
    lines += [
        "",
        "The same on device time for the kernel pick() runs on eager steps (a plan's choice there: Triton only where "
        "it also saves its launch's extra host time, TRITON_HOST_S; on graphed steps pick() is the device-time rule "
        "above):",
        "",
        "| dtype | GEMMs | picked / best of all (geomean) | worst shape | vendor picked |",
        "|---|---:|---:|---|---:|",
    ]
    for dt, s in summary.items():
        if s.get("all_shapes"):
            lines.append(
                f"| {dt} | {s['all_shapes']} | {s['host_geomean_efficiency']:.1%} | {s['host_worst_efficiency']:.1%} "
                f"({s['host_worst_shape']}) | {s['host_vendor_share']:.0%} |"
            )
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: str) -> bool:
    """Predicted vs measured µs of the chosen configurations, log-log, one colour per dtype (dots: the fit half,
    crosses: held-out), the ±15% band dotted; False without matplotlib."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 6.5))
    ran = [r for r in rows if r.chosen_us]
    colours = dict(zip(DTYPES, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for dt in sorted({r.dtype for r in ran}):
        for where, marker in (("fit", "o"), ("held-out", "x")):
            pts = [(r.chosen_us or 0.0, r.predicted_us) for r in ran if r.dtype == dt and r.half == where]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, alpha=0.7, marker=marker,
                           color=colours.get(dt), label=f"{dt} ({where})")  # fmt: skip
    lo = min(min(r.chosen_us or 1, r.predicted_us) for r in ran) / 1.5
    hi = max(max(r.chosen_us or 1, r.predicted_us) for r in ran) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    for f in (0.85, 1.15):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured µs (chosen configuration)",
           ylabel="predicted µs", title="Kernel model: chosen configuration, predicted vs measured")  # fmt: skip
    ax.legend(fontsize=8)
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


# ------------------------------------------------------------------------------------------------ entry point


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", help="write the measured JSON here")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SHAPES} GEMMs, {QUICK_CONFIGS} configurations")
    p.add_argument("--configs", type=int, default=0, help="time this many configurations, spread over the space")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of bf16, fp16, fp8")
    p.add_argument("--workers", type=int, default=15, help="compile processes (0: on first launch)")
    p.add_argument("--budget-s", type=float, default=480.0, help="stop measuring after this many seconds")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: a smoke test of the whole path on small GEMMs in Triton's interpreter "
                   "(TRITON_INTERPRET=1), timed by the host clock")  # fmt: skip
    p.add_argument("--list", action="store_true", help="print the GEMMs and their origins (no GPU)")
    p.add_argument("--report", metavar="FILE", nargs="+", help="score measured JSONs with the kernel model (no GPU):"
                   " a table per file, one plot of them all")  # fmt: skip
    p.add_argument("--plot", metavar="PNG", help="with --report: the predicted-vs-measured scatter plot")
    p.add_argument("--profile", default="nvidia-h200", help="with --report: the catalogue profile")
    p.add_argument("--split", choices=SPLITS, default="all", help="with --report: the GEMMs of one half (fit: the"
                   " half the model's constants may learn from; held-out: the rest) or all")  # fmt: skip
    args = p.parse_args(argv)
    if args.list:
        all_shapes = shapes()
        for s in all_shapes:
            print(f"{s.phase:12} M={s.m:6} N={s.n:6} K={s.k:6}  {'; '.join(s.origins)}")
        tflop = sum(s.flops for s in all_shapes) / 1e12
        ragged = sum(s.ragged for s in all_shapes)
        print(f"{len(all_shapes)} GEMMs ({ragged} ragged: {', '.join(RAGGED_DTYPES)} only), {tflop:.1f} TFLOP")
        return 0
    if args.report:
        from shardwise.hwprofiles import get_profile

        rows = []
        for i, name in enumerate(args.report):
            data = json.loads(Path(name).read_text())
            summary, some = report(data, get_profile(args.profile), args.split)
            print(("\n" if i else "") + f"{name}:\n" + format_report(data, summary, args.profile, args.split))
            rows += some
        if args.plot:
            if plot(rows, args.plot):
                print(f"plot: {args.plot}")
            else:
                print("no plot: matplotlib does not import (pip install matplotlib)")
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/kernels.py: measuring needs a CUDA GPU (--report and --list run anywhere)")
        return 2
    doc = measure(args)
    if args.out:
        Path(args.out).write_text(json.dumps(doc))
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
