"""The executor's embedding kernels alone on one GPU: the fused backward + optimizer update and the pooled forward, each
kernel layout timed on the same ids, beside the bytes they must move.

For each case (:data:`CASES`: a group of tables as the one-lookup path builds it — the tables' rows concatenated, every
table's ids offset into the group, fixed pooling per table, row-wise Adagrad) the script builds one batch of ids and
their bags, sorts them into segments once (``segments``, int64 and int32 keys: both timed, and the Triton backend's
int32 sort with ``fused_update.segment_starts``), and times:

* ``update``: ``fused_kernel.launch`` with one program per possible segment (``per_segment``, the layout before the
  grouped kernels) and with the grouped kernels under each of :data:`VARIANTS` (``UPDATE_ELEMENTS``, ``GROUP_IDS``,
  ``UPDATE_WARPS``, ``LONG_SEGMENT``: the module's tuning constants, set for the call);
* ``forward``: ``pooled_rows`` with one program per bag (``per_bag``, the layout before) and grouped (each variant's
  elements, ids and warps as ``POOL_ELEMENTS``, ``GROUP_IDS``, ``POOL_WARPS``).

A case whose ``memory`` is ``host`` keeps its weight and state in the host memory a ``host`` group holds (managed
memory kept in host DRAM and mapped for the device, ``runtime/embedding/host_memory.py``): every row read or written
crosses the host link. Its floor beside the HBM one: each distinct row across the link once (forward: read; update:
read and write, with its state), at the measured pinned host-to-device copy bandwidth; the report prints such cases
in a table of their own, beside the same case in HBM.

The grouped update's result is checked against the per-segment one's from the same weights and state (the touched
rows after one update each: relative difference), and the grouped forward's against the per-bag one's.

Each figure is the median of ``--reps`` launches between CUDA events after a warm-up (the weights and state are updated
in place each time: the timing does not depend on their values). The byte floor: the update reads each id's bag and
gradient row and reads and writes each distinct row and its state once; the forward reads each id and its row and
writes each bag's row — at the device's measured copy bandwidth (a device-to-device copy of 2 GiB, read + write).

    python3 benchmarks/fused_kernels.py -o fused.json            # one CUDA GPU (torch, Triton)
    python3 benchmarks/fused_kernels.py --report fused.json      # the table again
    TRITON_INTERPRET=1 python3 benchmarks/fused_kernels.py --device cpu --small -o s.json   # the code path on the CPU
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import torch

from shardwise.runtime.embedding import one_group
from shardwise.runtime.embedding.update import segments, sort_by_id
from shardwise.runtime.kernels import fused_update as fk


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    dim: int
    tables: tuple[tuple[int, float], ...]  # (rows, ids per sample)
    dtype: str
    ids: str  # uniform | loguniform (about Zipf 1: a few hot rows) | zipf<s>, e.g. zipf1.05: P(r) ∝ (r + 1)^-s
    memory: str = (
        "hbm"  # hbm | host: weight and state in host memory (a host group's), read and written across the link
    )


def _dcn_tables(cap: int) -> tuple[tuple[int, float], ...]:
    doc = json.loads((Path(__file__).resolve().parent.parent / "examples" / "dlrm_dcnv2.json").read_text())
    return tuple((min(t["num_embeddings"], cap), float(t["pooling_factor"])) for t in doc["embedding_tables"])


HIGH_POOL = ((4_000_000, 100.0), (2_000_000, 150.0), (4_000_000, 200.0))
BIG3 = tuple(sorted(_dcn_tables(4_000_000), key=lambda t: -t[0])[:3])
SMALL = tuple((round(10_000 * 100 ** (i / 127)), float(1 + (i % 20))) for i in range(128))
CASES = (
    Case("small-tables-16k", 16384, 32, SMALL, "fp16", "uniform"),
    Case("dcnv2-32k", 32768, 128, _dcn_tables(4_000_000), "fp32", "uniform"),
    Case("dcnv2-zipf-8k", 8192, 128, _dcn_tables(4_000_000), "fp32", "loguniform"),
    Case("pool-200-bf16-16k", 16384, 128, HIGH_POOL, "bf16", "uniform"),
    Case("dim-512-8k", 8192, 512, ((500_000, 10.0),) * 4, "fp32", "uniform"),
    # the capped DCNv2 plan's host group (its three largest tables, here capped at 4 M rows), in host memory and,
    # for the same ids, in HBM
    Case("dcnv2-3big-zipf-8k", 8192, 128, BIG3, "fp32", "loguniform"),
    Case("dcnv2-3big-zipf-8k-host", 8192, 128, BIG3, "fp32", "loguniform", memory="host"),
)
#: (elements, ids, warps, LONG_SEGMENT, SPLIT_SEGMENT) of the grouped kernels; the first is the update's default, the
#: second the same with no segment split (each hot row summed by one program, the kernel before the split)
NO_SPLIT = 1 << 62
VARIANTS = ((512, 4, 2, 64, 1024), (512, 4, 2, 64, NO_SPLIT), (1024, 4, 4, 64, 1024), (512, 8, 2, 64, 1024))
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def small_cases() -> tuple[Case, ...]:
    return (
        Case("tiny-uniform", 16, 8, ((50, 3.0), (20, 2.0)), "fp32", "uniform"),
        Case("tiny-hot", 16, 16, ((30, 6.0),), "fp16", "loguniform"),
        Case("tiny-host", 16, 8, ((40, 4.0), (25, 2.0)), "fp32", "loguniform", memory="host"),
    )


def batch(
    case: Case,
    device: torch.device,
    gen: torch.Generator,
    draw: Callable[[int, int, int], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Group-row ids, their bags and the bags' offsets (fixed pooling per table, bags table-major). ``draw(t, rows,
    n)``: table ``t``'s ``n`` ids (its own row numbers, on the CPU) in place of ``case.ids``' sampler."""
    ids, bags, lengths = [], [], []
    base = 0
    for t, (rows, pool) in enumerate(case.tables):
        per = max(1, round(pool))
        n = case.batch * per
        local = draw(t, rows, n) if draw is not None else _sample(case.ids, rows, n, gen)
        ids.append(local + base)
        bags.append(torch.arange(case.batch).repeat_interleave(per) + t * case.batch)
        lengths.append(torch.full((case.batch,), per))
        base += rows
    length = torch.cat(lengths)
    offsets = torch.cumsum(length, 0) - length
    return tuple(x.to(device) for x in (torch.cat(ids), torch.cat(bags), offsets))


def _sample(kind: str, rows: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` row numbers of ``[0, rows)`` drawn as ``kind`` (:class:`Case`'s ``ids``) says."""
    u = torch.rand(n, generator=gen, device="cpu")
    if kind == "uniform":
        return (u * rows).long().clamp_(max=rows - 1)
    if kind.startswith("zipf"):  # the continuous inverse of P(r) ∝ (r + 1)^-s over [0, rows)
        a = 1.0 - float(kind[4:])
        top = (rows + 1.0) ** a
        return ((1.0 + u.double() * (top - 1.0)) ** (1.0 / a) - 1.0).long().clamp_(0, rows - 1)
    # log-uniform: P(r) ∝ 1/(r+1)
    return (torch.exp(u * math.log(rows + 1)) - 1).long().clamp_(0, rows - 1)


def timed(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    fn()
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    torch.cuda.synchronize(device)
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return float(statistics.median(out))


def link_bandwidth(device: torch.device) -> float:
    """Bytes per second of a copy from pinned host memory to the device (one direction of the host link)."""
    if device.type != "cuda":
        return 1e10
    x = torch.empty(2**30, dtype=torch.uint8, pin_memory=True)
    y = torch.empty(x.numel(), dtype=torch.uint8, device=device)
    ms = timed(lambda: y.copy_(x, non_blocking=True), 5, device)
    return x.numel() / (ms / 1e3)


def on_memory(x: torch.Tensor, memory: str, device: torch.device) -> torch.Tensor:
    """``x`` where the case keeps its tables: as it is (HBM), or copied to the host memory a ``host`` group's executor
    holds (managed memory kept in host DRAM, mapped for the device)."""
    if memory == "hbm" or device.type != "cuda":
        return x
    from shardwise.runtime.embedding.host_memory import managed_empty

    return managed_empty(tuple(x.shape), x.dtype, device).copy_(x)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a device-to-device copy (read + write)."""
    if device.type != "cuda":
        return 1e10
    x = torch.empty(2**30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), 10, device)
    return 2 * x.numel() / (ms / 1e3)


def with_constants(values: tuple[int, int, int, int, int], fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with the grouped kernels' constants set to ``values`` (the update's and the forward's alike)."""
    names = (
        "UPDATE_ELEMENTS", "GROUP_IDS", "UPDATE_WARPS", "LONG_SEGMENT", "SPLIT_SEGMENT", "POOL_ELEMENTS", "POOL_WARPS"
    )  # fmt: skip
    values = (*values, values[0], values[2])  # type: ignore[assignment]

    def run() -> Any:
        old = [getattr(fk, k) for k in names]
        for k, v in zip(names, values, strict=True):
            setattr(fk, k, v)
        try:
            return fn()
        finally:
            for k, v in zip(names, old, strict=True):
                setattr(fk, k, v)

    return run


def measure_case(
    case: Case, device: torch.device, reps: int, bandwidth: float, link: float | None = None
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(7)
    ids, bags, offsets = batch(case, device, gen)
    rows = sum(r for r, _ in case.tables)
    dtype = DTYPES[case.dtype]
    weight = on_memory(torch.randn(rows, case.dim, device=device, dtype=torch.float32).to(dtype), case.memory, device)
    state = on_memory(torch.zeros(rows, device=device), case.memory, device)
    grad = torch.randn(offsets.numel(), case.dim, device=device, dtype=dtype)
    n = ids.numel()
    s_ids, s_bags, _, starts = segments(ids, bags, narrow=True)
    unique = int((starts[:n] < n).sum())
    longest = int((torch.diff(starts[: unique + 1])).max()) if unique else 0
    b = dtype.itemsize
    update_bytes = n * (8 + case.dim * b) + unique * (2 * case.dim * b + 8 + 16)
    forward_bytes = n * (8 + case.dim * b) + offsets.numel() * case.dim * b

    def update(per_segment: bool = False) -> Callable[[], None]:
        return lambda: fk.launch(
            weight, state, None, s_ids, s_bags, starts, grad, opt=fk.ROWWISE_ADAGRAD, lr=1e-4, eps=1e-8, beta1=0.9,
            beta2=0.999, step_size=0.0, per_segment=per_segment,
        )  # fmt: skip

    def forward(per_bag: bool = False) -> Callable[[], Any]:
        return lambda: fk.pooled_rows(weight, ids, offsets, per_bag=per_bag)

    # the grouped kernel against the per-segment one from the same weights and state: the touched rows after one
    # update each (both sum a segment's ids in fp32, in tiles of their own order: a few units in the last place apart)
    touched = s_ids.index_select(0, starts[:unique]).long()
    saved_w, saved_s = weight.index_select(0, touched), state.index_select(0, touched)
    after = []
    for per_segment in (True, False):
        weight.index_copy_(0, touched, saved_w)
        state.index_copy_(0, touched, saved_s)
        update(per_segment)()
        after.append((weight.index_select(0, touched).float(), state.index_select(0, touched)))
    scale = float(after[0][0].abs().max()) or 1.0
    out: dict[str, Any] = {
        "case": case.name,
        "memory": case.memory,
        "grouped_vs_per_segment_max_rel": float((after[0][0] - after[1][0]).abs().max()) / scale,
        "state_max_rel": float((after[0][1] - after[1][1]).abs().max()) / (float(after[0][1].abs().max()) or 1.0),
        "forward_max_rel": _rel(forward()(), forward(per_bag=True)()),
        "ids": n,
        "bags": offsets.numel(),
        "rows": rows,
        "dim": case.dim,
        "dtype": case.dtype,
        "distinct_rows": unique,
        "longest_segment": longest,
        "update_floor_ms": update_bytes / bandwidth * 1e3,
        "forward_floor_ms": forward_bytes / bandwidth * 1e3,
        # over the host link, each distinct row crossing once (its repeats read from the L2 at best): the forward
        # reads it, the update reads and writes it and its state
        **(
            {
                "forward_link_floor_ms": unique * case.dim * b / link * 1e3,
                "update_link_floor_ms": unique * (2 * case.dim * b + 8) / link * 1e3,
            }
            if case.memory == "host" and link
            else {}
        ),
        "segments_int64_ms": timed(lambda: segments(ids, bags), reps, device),
        "segments_int32_ms": timed(lambda: segments(ids, bags, narrow=True), reps, device),
        # what the Triton backend runs: the int32 sort, then each head stores its start (no scatter of every id)
        "segments_kernel_same": bool(torch.equal(fk.segment_starts(s_ids), starts)),
        "segments_kernel_ms": timed(lambda: fk.segment_starts(sort_by_id(ids, bags, narrow=True)[0]), reps, device),
        "update_per_segment_ms": timed(update(per_segment=True), reps, device),
        **prepare_ids(case, ids, offsets, reps, device),
        "forward_per_bag_ms": timed(forward(per_bag=True), reps, device),
        "variants": [],
    }
    for v in VARIANTS:
        out["variants"].append(
            {
                "group_elements": v[0],
                "group_ids": v[1],
                "warps": v[2],
                "long_segment": v[3],
                "split_segment": v[4] if v[4] != NO_SPLIT else None,
                "update_ms": timed(with_constants(v, update()), reps, device),
                "forward_ms": timed(with_constants(v, forward()), reps, device),
            }
        )
    return out


def prepare_ids(
    case: Case, ids: torch.Tensor, offsets: torch.Tensor, reps: int, device: torch.device
) -> dict[str, float | bool]:
    """The lookup's id preparation of the case's call (``one_group.group_ids``: each bag's offset, each id's group row,
    range check and bag), by its two Triton kernels and by the torch ops they replaced, on the same call: the
    tables' own ids and bag starts, as a lookup receives them."""
    rows = torch.tensor([r for r, _ in case.tables], dtype=torch.int64)
    per = torch.tensor([max(1, round(p)) * case.batch for _, p in case.tables], dtype=torch.int64)
    lo = (torch.cumsum(rows, 0) - rows).to(device)
    id_firsts = (torch.cumsum(per, 0) - per).to(device)
    bag_firsts = (torch.arange(len(case.tables), dtype=torch.int64) * case.batch).to(device)
    table_of = torch.repeat_interleave(torch.arange(len(case.tables), device=device), per.to(device))
    raw = ids - lo.index_select(0, table_of)
    local = offsets - id_firsts.repeat_interleave(case.batch)
    call = (raw, local, id_firsts, bag_firsts, lo, lo + rows.to(device) - 1)
    kernels = one_group._kernels()
    assert kernels is not None
    same = all(
        torch.equal(a, b) for a, b in zip(kernels.group_ids(*call), one_group.group_ids_torch(*call), strict=True)
    )
    return {
        "prepare_kernels_ms": timed(lambda: kernels.group_ids(*call), reps, device),
        "prepare_torch_ms": timed(lambda: one_group.group_ids_torch(*call), reps, device),
        "prepare_same": same,
    }


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max()) / (float(want.float().abs().max()) or 1.0)


def table(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"{doc['machine']}; median of {doc['reps']} launches, ms; floor = the bytes at the measured copy bandwidth "
        f"({doc['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s)",
        "",
        "| case | ids | distinct | longest | id preparation: torch / kernels | segments i64 / i32 / i32 + kernel | "
        "update: per segment | grouped (default) | no split | best variant | floor | forward: per bag | grouped | "
        "floor | grouped vs per-segment (rel.) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["cases"]:
        d = r["variants"][0]
        unsplit = next((v for v in r["variants"] if v.get("split_segment", 0) is None), None)
        best = min(r["variants"], key=lambda v: v["update_ms"])
        label = f"{best['group_elements']}/{best['group_ids']}/w{best['warps']}/L{best['long_segment']}"
        label += f"/S{best['split_segment']}" if best.get("split_segment") else ""
        prep = (
            f"{r['prepare_torch_ms']:.3f} / {r['prepare_kernels_ms']:.3f}" + ("" if r["prepare_same"] else " (differ!)")
            if "prepare_torch_ms" in r
            else "—"
        )
        kernel_starts = f" / {r['segments_kernel_ms']:.3f}" if "segments_kernel_ms" in r else ""
        kernel_starts += "" if r.get("segments_kernel_same", True) else " (differ!)"
        lines.append(
            f"| {r['case']} | {r['ids']:,} | {r['distinct_rows']:,} | {r['longest_segment']:,} | {prep} | "
            f"{r['segments_int64_ms']:.3f} / {r['segments_int32_ms']:.3f}{kernel_starts} | "
            f"{r['update_per_segment_ms']:.3f} | "
            f"{d['update_ms']:.3f} | {unsplit['update_ms'] if unsplit else float('nan'):.3f} | "
            f"{label} {best['update_ms']:.3f} | {r['update_floor_ms']:.3f} | "
            f"{r['forward_per_bag_ms']:.3f} | {d['forward_ms']:.3f} | {r['forward_floor_ms']:.3f} | "
            f"{r['grouped_vs_per_segment_max_rel']:.1e} / {r['forward_max_rel']:.1e} |"
        )
    host = [r for r in doc["cases"] if r.get("memory") == "host"]
    if host:
        lines += [
            "",
            f"Tables in host memory (the kernels read and write them across the host link, "
            f"{doc.get('link_bandwidth_bytes_per_s', float('nan')) / 1e9:.1f} GB/s measured host to device); the same "
            "case in HBM beside it where it ran; link floor = each distinct row across the link once, ms:",
            "",
            "| case | update: grouped | in HBM | link floor | best variant | forward: grouped | in HBM | link floor | "
            "best variant |",
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |",
        ]
        by_name = {r["case"]: r for r in doc["cases"]}
        for r in host:
            twin = by_name.get(r["case"].removesuffix("-host"), {})
            d, t = r["variants"][0], (twin.get("variants") or [{}])[0]
            up = min(r["variants"], key=lambda v: v["update_ms"])
            fw = min(r["variants"], key=lambda v: v["forward_ms"])

            def name(v: dict[str, Any]) -> str:
                return f"{v['group_elements']}/{v['group_ids']}/w{v['warps']}"

            lines.append(
                f"| {r['case']} | {d['update_ms']:.3f} | {t.get('update_ms', float('nan')):.3f} | "
                f"{r.get('update_link_floor_ms', float('nan')):.3f} | {name(up)} {up['update_ms']:.3f} | "
                f"{d['forward_ms']:.3f} | {t.get('forward_ms', float('nan')):.3f} | "
                f"{r.get('forward_link_floor_ms', float('nan')):.3f} | {name(fw)} {fw['forward_ms']:.3f} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--report", type=Path)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--small", action="store_true", help="tiny cases (the CPU, under TRITON_INTERPRET=1)")
    p.add_argument("--only", default="", help="comma-separated case names (default: every case)")
    args = p.parse_args(argv)
    if args.report:
        print("\n".join(table(json.loads(args.report.read_text(encoding="utf-8")))))
        return 0
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    import triton

    doc: dict[str, Any] = {
        "kind": "fused_kernels",
        "machine": f"{name}, torch {torch.__version__}, Triton {triton.__version__}",
        "reps": args.reps,
        "copy_bandwidth_bytes_per_s": copy_bandwidth(device),
        "link_bandwidth_bytes_per_s": link_bandwidth(device),
        "cases": [],
    }
    chosen = [c for c in (small_cases() if args.small else CASES) if not args.only or c.name in args.only.split(",")]
    for case in chosen:
        bandwidths = (doc["copy_bandwidth_bytes_per_s"], doc["link_bandwidth_bytes_per_s"])
        doc["cases"].append(measure_case(case, device, args.reps, *bandwidths))
        print(f"{case.name}: done", flush=True)
        if args.output:
            args.output.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("\n".join(table(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
