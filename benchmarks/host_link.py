"""How fast the executor's embedding kernels read and write tables that live in host memory, by how that memory is
allocated: an experiment for the ``host`` placement, whose group lost to FBGEMM's on the capped DCNv2 model.

The same tables, ids and kernels as ``fused_kernels.py``'s ``dcnv2-3big-zipf-8k`` case (DCNv2's three largest tables
capped at 4 M rows, fp32, dim 128, log-uniform ids, row-wise Adagrad; ``--case dcnv2-capped-host-zipf1.05-8k``: the
three tables the capped plan of ``vs_fbgemm.py`` puts in host memory, at its sizes and Zipf 1.05 ids), with the weight
and its state in each of:

* ``hbm`` — device memory (the reference);
* ``pinned`` — torch's pinned host memory, mapped for the GPU (what a ``host`` group held until this experiment
  showed ``managed`` faster);
* ``pinned-wc`` — pinned and mapped, allocated write-combined (``cudaHostAlloc(cudaHostAllocMapped |
  cudaHostAllocWriteCombined)``, FBGEMM's ``new_host_mapped_tensor``): the GPU's reads of it are not snooped by the
  CPU's caches; the CPU's own reads of it are uncached;
* ``managed`` — CUDA managed memory with the CPU its preferred location and the GPU mapped to it
  (``cudaMallocManaged``, ``cudaMemAdvise``: FBGEMM's ``new_managed_tensor``, what TorchRec's ``fused_uvm`` runs),
  what a ``host`` group holds (``runtime/embedding/host_memory.py``'s ``managed_empty``).

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
from collections.abc import Sequence
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


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed (CUDA error {err})")


def allocate(kind: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` as ``kind`` allocates it, seen from ``device``."""
    if kind == "hbm":
        return torch.empty(shape, dtype=dtype, device=device)
    if kind == "pinned":
        return host_memory.device_view(host_memory.pinned_empty(shape, dtype, device), device)
    if kind == "managed":  # what a host group holds
        return host_memory.managed_empty(shape, dtype, device)
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

        owner = host_memory.RawMemory(dev.value, nbytes, free_host)
    else:
        raise ValueError(f"unknown memory kind {kind!r}: one of {', '.join(KINDS)}")
    with torch.cuda.device(device):
        raw = torch.as_tensor(owner, device=device)
    return raw[: int(torch.Size(shape).numel()) * dtype.itemsize].view(dtype).view(shape)


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
    gen = torch.Generator().manual_seed(7)
    ids, _, _ = fkb.batch(case, device, gen)
    specs = [(rows, location == "MANAGED") for rows, _ in case.tables]
    return {
        "kind": f"fbgemm-{location.lower()}",
        "ids": ids.numel(),
        **_fbgemm_tables(specs, _local(case, ids), case.batch, device, reps, dim=case.dim),
    }


#: the tables of the capped DCNv2 plan vs_fbgemm.py runs that it puts in host memory (its model order)
CAPPED_HOST = (0, 9, 10)


def _local(case: fkb.Case, ids: torch.Tensor) -> list[torch.Tensor]:
    """``fkb.batch``'s group-row ids split back into each table's own row numbers, table by table."""
    out, at, first = [], 0, 0
    for rows, pool in case.tables:
        n = case.batch * max(1, round(pool))
        out.append(ids[first : first + n] - at)
        first, at = first + n, at + rows
    return out


def _rig_batch(case: fkb.Case, index: Sequence[int], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``fkb.batch`` with the ids ``vs_fbgemm.py``'s capped rig draws: table ``index[k]`` of the model by its Zipf
    sampler seeded ``100 + index[k]`` (its ranks mapped to rows by a seeded permutation: the hot rows anywhere in the
    table, not its first rows)."""
    from shardwise.calibrate.cache_fetch import ZipfIds

    skew = float(case.ids[4:])

    def draw(t: int, rows: int, n: int) -> torch.Tensor:
        return ZipfIds(rows, skew, seed=100 + index[t]).draw(n)

    return fkb.batch(case, device, torch.Generator(), draw)


def measure_split(
    device: torch.device, reps: int, fbgemm: bool, *, rig_ids: bool = False, kinds: Sequence[str] = ("pinned",)
) -> dict[str, Any]:
    """The capped DCNv2 plan's 26 tables (14 M rows at most, fp32, dim 128, Zipf 1.05 ids, 8,192 samples), 23 in HBM
    and 3 (:data:`CAPPED_HOST`) in pinned host memory, as the plan places them: our forward and update per memory, one
    after the other (two launches each, what a step runs today), and the forward over both memories in one launch
    (``pooled_rows(..., far=...)``), the host tables' bags first or last in its grid; with ``fbgemm``, FBGEMM's
    table-batched kernels over the same 26 tables in the plan's order (device and managed tables in one launch, as
    ``fused`` / ``fused_uvm`` export them), and over each memory's tables alone. ``rig_ids``: the ids the rig draws
    (:func:`_rig_batch`: the hot rows scattered over the table) instead of ``fkb.batch``'s (the hot rows first);
    ``kinds``: the host tables' memory, each measured in turn (:func:`allocate`)."""
    tables = fkb._dcn_tables(14_000_000)
    near_case = fkb.Case(
        "capped-hbm", 8192, 128, tuple(t for i, t in enumerate(tables) if i not in CAPPED_HOST), "fp32", "zipf1.05"
    )
    far_case = fkb.Case("capped-host", 8192, 128, tuple(tables[i] for i in CAPPED_HOST), "fp32", "zipf1.05")
    hbm = [i for i in range(len(tables)) if i not in CAPPED_HOST]
    if rig_ids:
        near_batch, far_batch = _rig_batch(near_case, hbm, device), _rig_batch(far_case, CAPPED_HOST, device)
    else:
        gen = torch.Generator().manual_seed(7)
        near_batch, far_batch = fkb.batch(near_case, device, gen), fkb.batch(far_case, device, gen)
    out: dict[str, Any] = {"ids": "rig" if rig_ids else "first rows hot", "kinds": {}}
    for kind in kinds:
        try:
            out["kinds"][kind] = _ours_split(near_case, far_case, near_batch, far_batch, device, reps, kind)
        except Exception as e:  # a kind this machine's runtime refuses: recorded, the others still run
            out["kinds"][kind] = {"error": f"{type(e).__name__}: {e}"}
        torch.cuda.empty_cache()
    if fbgemm:
        per = dict(zip(hbm, _local(near_case, near_batch[0]), strict=True))
        per.update(zip(CAPPED_HOST, _local(far_case, far_batch[0]), strict=True))
        for label, keep in (("all", range(len(tables))), ("hbm", hbm), ("host", CAPPED_HOST)):
            try:
                out[f"fbgemm_{label}"] = _fbgemm_tables(
                    [(tables[i][0], i in CAPPED_HOST) for i in keep], [per[i] for i in keep], 8192, device, reps
                )
            except Exception as e:  # FBGEMM absent or refusing: recorded
                out[f"fbgemm_{label}"] = {"error": f"{type(e).__name__}: {e}"}
            torch.cuda.empty_cache()
    return out


def _ours_split(
    near_case: fkb.Case,
    far_case: fkb.Case,
    near_batch: Sequence[torch.Tensor],
    far_batch: Sequence[torch.Tensor],
    device: torch.device,
    reps: int,
    kind: str,
) -> dict[str, Any]:
    n_ids, n_bags, n_offs = near_batch
    f_ids, f_bags, f_offs = far_batch
    near_t, far_t = near_case.tables, far_case.tables
    split = sum(r for r, _ in near_t)
    near = torch.empty((split, 128), device=device).normal_()
    far = allocate(kind, (sum(r for r, _ in far_t), 128), torch.float32, device).normal_()
    near_state = torch.zeros(split, device=device)
    far_state = torch.zeros(far.shape[0], device=device)
    # one launch: the host tables' ids numbered after the hbm rows; their bags first or last in the grid
    last = (torch.cat([n_ids, f_ids + split]), torch.cat([n_offs, f_offs + n_ids.numel()]))
    first = (torch.cat([f_ids + split, n_ids]), torch.cat([f_offs, n_offs + f_ids.numel()]))

    def pool(w: torch.Tensor, ids: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return fk.pooled_rows(w, ids, offs)

    def both() -> None:
        pool(near, n_ids, n_offs)
        pool(far, f_ids, f_offs)

    updates = []
    for w, st, ids, bags in ((near, near_state, n_ids, n_bags), (far, far_state, f_ids, f_bags)):
        s_ids, s_bags, _, starts = segments(ids, bags, narrow=True)
        grad = torch.randn(int(bags.max()) + 1, 128, device=device)
        updates.append((w, st, s_ids, s_bags, starts, grad))

    def update(k: int) -> None:
        w, st, s_ids, s_bags, starts, grad = updates[k]
        fk.launch(
            w, st, None, s_ids, s_bags, starts, grad, opt=fk.ROWWISE_ADAGRAD, lr=1e-4, eps=1e-8, beta1=0.9,
            beta2=0.999, step_size=0.0,
        )  # fmt: skip

    one_last = fk.pooled_rows(near, *last, far=(split, far))
    two = torch.cat([pool(near, n_ids, n_offs), pool(far, f_ids, f_offs)])
    return {
        "hbm_ids": n_ids.numel(),
        "host_ids": f_ids.numel(),
        "one_launch_equal": bool(torch.equal(one_last, two)),
        "forward_hbm_ms": fkb.timed(lambda: pool(near, n_ids, n_offs), reps, device),
        "forward_host_ms": fkb.timed(lambda: pool(far, f_ids, f_offs), reps, device),
        "forward_both_ms": fkb.timed(both, reps, device),
        "forward_one_launch_host_last_ms": fkb.timed(
            lambda: fk.pooled_rows(near, *last, far=(split, far)), reps, device
        ),
        "forward_one_launch_host_first_ms": fkb.timed(
            lambda: fk.pooled_rows(near, *first, far=(split, far)), reps, device
        ),
        "update_hbm_ms": fkb.timed(lambda: update(0), reps, device),
        "update_host_ms": fkb.timed(lambda: update(1), reps, device),
        "update_both_ms": fkb.timed(lambda: (update(0), update(1)), reps, device),
    }


def _fbgemm_tables(
    specs: Sequence[tuple[int, bool]],
    ids: Sequence[torch.Tensor],
    batch: int,
    device: torch.device,
    reps: int,
    *,
    dim: int = 128,
) -> dict[str, Any]:
    """FBGEMM's TBE over tables ``(rows, managed)`` (``dim`` columns, fp32, EXACT_ROWWISE_ADAGRAD; managed: FBGEMM's
    UVM, else HBM) and each table's ids (``batch`` bags of equal length each): its forward alone (no autograd) and its
    forward + backward with the fused update (its backward sorts the ids itself)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    where = {False: EmbeddingLocation.DEVICE, True: EmbeddingLocation.MANAGED}
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(rows, dim, where[managed], ComputeDevice.CUDA) for rows, managed in specs],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=1e-4,
        eps=1e-8,
        weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32,
        pooling_mode=PoolingMode.SUM,
        device=device,
    )
    local = torch.cat(list(ids))
    lengths = torch.cat([torch.full((batch,), x.numel() // batch, device=device) for x in ids])
    offs = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    grad = torch.randn(batch, dim * len(specs), device=device)

    def forward() -> Any:
        with torch.no_grad():
            return tbe(local, offs)

    out = {
        "tables": len(specs),
        "forward_ms": fkb.timed(forward, reps, device),
        "forward_backward_ms": fkb.timed(lambda: tbe(local, offs).backward(grad), reps, device),
    }
    return out


def split_table(split: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"The capped plan's tables, 23 in HBM and 3 in host memory (ids: {split.get('ids', 'first rows hot')}), ms:",
        "",
        "| host memory | kernels | forward | update (sort apart) / forward + backward |",
        "| --- | --- | ---: | ---: |",
    ]
    for kind, r in split.get("kinds", {"pinned": split}).items():
        if "error" in r:
            lines.append(f"| {kind} | error: {r['error']} | | |")
            continue
        lines += [
            f"| {kind} | ours, hbm group | {r['forward_hbm_ms']:.3f} | {r['update_hbm_ms']:.3f} |",
            f"| {kind} | ours, host group | {r['forward_host_ms']:.3f} | {r['update_host_ms']:.3f} |",
            f"| {kind} | ours, both (two launches each) | {r['forward_both_ms']:.3f} | {r['update_both_ms']:.3f} |",
            f"| {kind} | ours, one launch, host bags last | {r['forward_one_launch_host_last_ms']:.3f} | |",
            f"| {kind} | ours, one launch, host bags first | {r['forward_one_launch_host_first_ms']:.3f} | |",
        ]
        if not r["one_launch_equal"]:
            lines.append(f"| {kind} | one launch's rows differ from the two launches' | | |")
    for label, memory in (("all", "managed"), ("hbm", "—"), ("host", "managed")):
        f = split.get(f"fbgemm_{label}")
        if f is None:
            continue
        if "error" in f:
            lines.append(f"| {memory} | FBGEMM, {label} | error: {f['error']} | |")
        else:
            lines.append(
                f"| {memory} | FBGEMM, {label} ({f['tables']} tables) | {f['forward_ms']:.3f} | "
                f"{f['forward_backward_ms']:.3f} |"
            )
    return lines


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
    if doc.get("split"):
        lines += split_table(doc["split"])
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--report", type=Path)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--fbgemm", action="store_true", help="FBGEMM's kernels on the same tables too (fbgemm_gpu)")
    p.add_argument("--case", default=DEFAULT_CASE, choices=sorted(CASES), help="the tables and ids")
    p.add_argument("--rig-ids", action="store_true", help="--split with the ids vs_fbgemm.py's rig draws")
    p.add_argument(
        "--split",
        action="store_true",
        help="the capped plan's 26 tables split over HBM and host memory instead (measure_split; 38 GB)",
    )
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
    if args.split:
        doc["case"] = "dcnv2-capped-split-zipf1.05-8k"
        doc["split"] = measure_split(
            device, args.reps, args.fbgemm, rig_ids=args.rig_ids, kinds=("pinned", "managed", "pinned-wc")
        )
        if args.output:
            args.output.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        print("\n".join(split_table(doc["split"])))
        return 0
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
