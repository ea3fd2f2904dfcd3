"""How fast the executor's embedding kernels read and write tables that live in host memory, by how that memory is
allocated: an experiment for the ``host`` placement, whose group lost to FBGEMM's on the capped DCNv2 model.

The same tables, ids and kernels as ``fused_kernels.py``'s ``dcnv2-3big-zipf-8k`` case (DCNv2's three largest tables
capped at 4 M rows, fp32, dim 128, log-uniform ids, row-wise Adagrad; ``--case dcnv2-capped-host-zipf1.05-8k``: the
three tables the capped plan of ``vs_fbgemm.py`` puts in host memory, at its sizes and Zipf 1.05 ids), with the weight
and its state in each of:

* ``hbm`` — device memory (the reference);
* ``pinned`` — what a ``host`` group holds today: torch's pinned host memory, mapped for the GPU
  (``runtime/embedding/host_memory.py``);
* ``pinned-wc`` — pinned and mapped, allocated write-combined (``cudaHostAlloc(cudaHostAllocMapped |
  cudaHostAllocWriteCombined)``, FBGEMM's ``new_host_mapped_tensor``): the GPU's reads of it are not snooped by the
  CPU's caches; the CPU's own reads of it are uncached;
* ``managed`` — CUDA managed memory with the CPU its preferred location and the GPU mapped to it
  (``cudaMallocManaged``, ``cudaMemAdvise``: FBGEMM's ``new_managed_tensor``, what TorchRec's ``fused_uvm`` runs).

For each: the grouped forward (``pooled_rows``), the grouped update (``fused_update.launch``), and a gather of the
batch's distinct rows (``index_select``, the link's plain read rate), median of ``--reps`` launches between CUDA
events, ms; beside them the bytes each must move across the link at the measured pinned host-to-device copy rate.
With ``--fbgemm``, FBGEMM's table-batched kernels over the same tables and ids, in HBM and managed (its forward, and
its forward + backward with the fused update).

    python3 benchmarks/host_link.py -o host_link.json     # one CUDA GPU
    python3 benchmarks/host_link.py -o host_link.json --fbgemm     # and FBGEMM's kernels (fbgemm_gpu importable)
    python3 benchmarks/host_link.py -o capped.json --fbgemm --case dcnv2-capped-host-zipf1.05-8k   # the plan's
    python3 benchmarks/host_link.py --report host_link.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import torch

from benchmarks import fused_kernels as fkb
from shardwise.runtime.embedding import host_memory
from shardwise.runtime.embedding.update import segments
from shardwise.runtime.kernels import fused_update as fk

KINDS = ("hbm", "pinned", "pinned-wc", "managed")
#: the cases it can run: fused_kernels.py's (DCNv2's three largest tables capped at 4 M rows, log-uniform ids), and
#: the host group of the capped DCNv2 plan vs_fbgemm.py runs — tables 0, 9 and 10 of DCNv2 (14 M, 14 M and 3.07 M
#: rows; pooling 3, 7 and 3), Zipf 1.05 ids, as that plan offloads them
CASES = {
    "dcnv2-3big-zipf-8k": next(c for c in fkb.CASES if c.name == "dcnv2-3big-zipf-8k"),
    "dcnv2-capped-host-zipf1.05-8k": fkb.Case(
        "dcnv2-capped-host-zipf1.05-8k",
        8192,
        128,
        tuple(fkb._dcn_tables(14_000_000)[i] for i in (0, 9, 10)),
        "fp32",
        "zipf1.05",
    ),
}
DEFAULT_CASE = "dcnv2-3big-zipf-8k"


class _Raw:
    """Memory from the CUDA runtime as a CUDA tensor (``__cuda_array_interface__``), freed with the last view."""

    def __init__(self, pointer: int, nbytes: int, free: Callable[[int], Any]) -> None:
        self.pointer, self.free = pointer, free
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (pointer, False),
            "version": 3,
            "strides": None,
        }

    def __del__(self) -> None:
        self.free(self.pointer)


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed (CUDA error {err})")


def allocate(kind: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` as ``kind`` allocates it, seen from ``device``."""
    if kind == "hbm":
        return torch.empty(shape, dtype=dtype, device=device)
    if kind == "pinned":
        return host_memory.device_view(host_memory.pinned_empty(shape, dtype, device), device)
    lib = host_memory._cudart()
    if lib is None:
        raise RuntimeError("no CUDA runtime library found")
    nbytes = max(1, int(torch.Size(shape).numel()) * dtype.itemsize)
    ptr = ctypes.c_void_p()
    if kind == "pinned-wc":
        _check(lib.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), ctypes.c_uint(2 | 4)), "cudaHostAlloc")
        host = ptr.value
        assert host is not None
        dev = ctypes.c_void_p()
        _check(lib.cudaHostGetDevicePointer(ctypes.byref(dev), ctypes.c_void_p(host), 0), "cudaHostGetDevicePointer")
        assert dev.value is not None

        def free_host(_device_pointer: int, host_pointer: int = host) -> Any:
            return lib.cudaFreeHost(ctypes.c_void_p(host_pointer))

        owner = _Raw(dev.value, nbytes, free_host)
    elif kind == "managed":
        _check(lib.cudaMallocManaged(ctypes.byref(ptr), ctypes.c_size_t(nbytes), ctypes.c_uint(1)), "cudaMallocManaged")
        assert ptr.value is not None
        index = device.index if device.index is not None else torch.cuda.current_device()
        _advise(lib, ptr.value, nbytes, 3, host=True, index=index)  # cudaMemAdviseSetPreferredLocation: the CPU
        _advise(lib, ptr.value, nbytes, 5, host=False, index=index)  # cudaMemAdviseSetAccessedBy: this GPU
        owner = _Raw(ptr.value, nbytes, lambda p: lib.cudaFree(ctypes.c_void_p(p)))
    else:
        raise ValueError(f"unknown memory kind {kind!r}: one of {', '.join(KINDS)}")
    with torch.cuda.device(device):
        raw = torch.as_tensor(owner, device=device)
    return raw[: int(torch.Size(shape).numel()) * dtype.itemsize].view(dtype).view(shape)


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def _advise(lib: Any, pointer: int, nbytes: int, advice: int, *, host: bool, index: int) -> None:
    """``cudaMemAdvise`` for the CPU (``host``) or GPU ``index``: CUDA 13 takes a ``cudaMemLocation`` (host 2, device
    1), CUDA 12 a device ordinal (the CPU -1)."""
    version = ctypes.c_int()
    _check(lib.cudaRuntimeGetVersion(ctypes.byref(version)), "cudaRuntimeGetVersion")
    args: tuple[Any, ...] = (ctypes.c_void_p(pointer), ctypes.c_size_t(nbytes), ctypes.c_int(advice))
    if version.value >= 13000:
        _check(lib.cudaMemAdvise(*args, _Location(2 if host else 1, 0 if host else index)), "cudaMemAdvise")
    else:
        _check(lib.cudaMemAdvise(*args, ctypes.c_int(-1 if host else index)), "cudaMemAdvise")


def measure(case: fkb.Case, kind: str, device: torch.device, reps: int, link: float) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(7)
    ids, bags, offsets = fkb.batch(case, device, gen)
    rows = sum(r for r, _ in case.tables)
    weight = allocate(kind, (rows, case.dim), torch.float32, device)
    state = allocate(kind, (rows,), torch.float32, device)
    weight.copy_(torch.randn(rows, case.dim, device=device))  # the GPU writes them: no CPU read of the memory
    state.zero_()
    grad = torch.randn(offsets.numel(), case.dim, device=device)
    n = ids.numel()
    s_ids, s_bags, _, starts = segments(ids, bags, narrow=True)
    unique = int((starts[:n] < n).sum())
    distinct = s_ids.index_select(0, starts[:unique]).long()
    row = case.dim * 4
    out = {
        "kind": kind,
        "ids": n,
        "distinct_rows": unique,
        "forward_ms": fkb.timed(lambda: fk.pooled_rows(weight, ids, offsets), reps, device),
        "update_ms": fkb.timed(
            lambda: fk.launch(
                weight,
                state,
                None,
                s_ids,
                s_bags,
                starts,
                grad,
                opt=fk.ROWWISE_ADAGRAD,
                lr=1e-4,
                eps=1e-8,
                beta1=0.9,
                beta2=0.999,
                step_size=0.0,
            ),
            reps,
            device,
        ),
        "gather_ms": fkb.timed(lambda: weight.index_select(0, distinct), reps, device),
        "link_read_floor_ms": unique * row / link * 1e3,
    }
    torch.cuda.synchronize(device)
    return out


def measure_fbgemm(case: fkb.Case, location: str, device: torch.device, reps: int) -> dict[str, Any]:
    """FBGEMM's table-batched kernels (``SplitTableBatchedEmbeddingBagsCodegen``, EXACT_ROWWISE_ADAGRAD, fp32) over
    the same tables and ids, the tables in ``location`` (``DEVICE``: HBM; ``MANAGED``: FBGEMM's UVM): its forward alone
    (no autograd) and its forward + backward with the fused update (its backward sorts the ids itself)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    gen = torch.Generator().manual_seed(7)
    ids, _, offsets = fkb.batch(case, device, gen)
    bases, at = [], 0
    for rows, pool in case.tables:  # fkb.batch's ids are group rows: each table's own rows for FBGEMM
        bases.append(torch.full((case.batch * max(1, round(pool)),), at, dtype=torch.int64))
        at += rows
    local = ids - torch.cat(bases).to(device)
    offs = torch.cat([offsets, offsets.new_full((1,), ids.numel())])
    where = getattr(EmbeddingLocation, location)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(rows, case.dim, where, ComputeDevice.CUDA) for rows, _ in case.tables],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=1e-4,
        eps=1e-8,
        weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32,
        pooling_mode=PoolingMode.SUM,
        device=device,
    )
    grad = torch.randn(case.batch, case.dim * len(case.tables), device=device)

    def forward() -> Any:
        with torch.no_grad():
            return tbe(local, offs)

    def train() -> None:
        tbe(local, offs).backward(grad)

    return {
        "kind": f"fbgemm-{location.lower()}",
        "ids": ids.numel(),
        "forward_ms": fkb.timed(forward, reps, device),
        "forward_backward_ms": fkb.timed(train, reps, device),
    }


def table(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"{doc['machine']}; {doc['case']}; median of {doc['reps']} launches, ms; link floor = the distinct rows read "
        f"at {doc['link_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (pinned host to device copy)",
        "",
        "| memory | forward (grouped) | update (grouped) | gather of the distinct rows | link read floor |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["kinds"]:
        if "error" in r:
            lines.append(f"| {r['kind']} | error: {r['error']} | | | |")
            continue
        lines.append(
            f"| {r['kind']} | {r['forward_ms']:.3f} | {r['update_ms']:.3f} | {r['gather_ms']:.3f} | "
            f"{r['link_read_floor_ms']:.3f} |"
        )
    if doc.get("fbgemm"):
        lines += [
            "",
            "FBGEMM's table-batched kernels on the same tables and ids (ms; forward + backward includes its sort):",
            "",
            "| tables in | forward | forward + backward (fused update) |",
            "| --- | ---: | ---: |",
        ]
        for r in doc["fbgemm"]:
            if "error" in r:
                lines.append(f"| {r['kind']} | error: {r['error']} | |")
            else:
                lines.append(f"| {r['kind']} | {r['forward_ms']:.3f} | {r['forward_backward_ms']:.3f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--report", type=Path)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--fbgemm", action="store_true", help="FBGEMM's kernels on the same tables too (fbgemm_gpu)")
    p.add_argument("--case", default=DEFAULT_CASE, choices=sorted(CASES), help="the tables and ids")
    args = p.parse_args(argv)
    case = CASES[args.case]
    if args.report:
        print("\n".join(table(json.loads(args.report.read_text(encoding="utf-8")))))
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("host_link.py measures the host link: it needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    import triton

    doc: dict[str, Any] = {
        "kind": "host_link",
        "machine": f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, Triton {triton.__version__}",
        "case": case.name,
        "reps": args.reps,
        "link_bandwidth_bytes_per_s": fkb.link_bandwidth(device),
        "kinds": [],
    }
    for kind in KINDS:
        try:
            doc["kinds"].append(measure(case, kind, device, args.reps, doc["link_bandwidth_bytes_per_s"]))
        except Exception as e:  # a kind this machine's runtime refuses: recorded, the others still run
            doc["kinds"].append({"kind": kind, "error": f"{type(e).__name__}: {e}"})
        print(f"{kind}: done", flush=True)
        if args.output:
            args.output.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    if args.fbgemm:
        doc["fbgemm"] = []
        for location in ("DEVICE", "MANAGED"):
            try:
                doc["fbgemm"].append(measure_fbgemm(case, location, device, args.reps))
            except Exception as e:  # FBGEMM absent or refusing: recorded
                doc["fbgemm"].append({"kind": f"fbgemm-{location.lower()}", "error": f"{type(e).__name__}: {e}"})
            torch.cuda.empty_cache()
            if args.output:
                args.output.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print("\n".join(table(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
