"""Why a model does not fit a fleet, in words: the short resource, by how much, and where."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardwise.solver.cpsat.candidates import Candidate
from shardwise.solver.load import LoadState
from shardwise.solver.topology import Topology
from shardwise.wire.spec import ModelSpec
from shardwise.wire.units import fmt_bytes


def smallest_shortage(topo: Topology, state: LoadState, cands: list[Candidate]) -> str:
    """The candidate that misses by the least, on a fleet holding nothing but the dense layers: what it lacks."""
    best: tuple[float, str] | None = None
    for c in cands:
        if c.scope == "fleet":
            hbm_need = c.hbm[:, 0]
            host_need = np.zeros(topo.num_hosts, dtype=np.int64)
            np.add.at(host_need, state.rank_host, c.host[:, 0])
        else:
            col = (
                c.scope_class
                if c.scope_class is not None
                else int(np.argmax([k.hbm_limit_bytes for k in topo.classes]))
            )
            hbm_need = np.full(topo.world_size, int(c.hbm[:, col].max()))
            host_need = np.full(
                topo.num_hosts, int(c.host[:, col].sum()) if c.scope != "rank" else int(c.host[:, col].max())
            )
        hbm_over = state.hbm + hbm_need - state.hbm_limit
        host_over = host_need - state.host_limit
        r = int(np.argmin(hbm_over))
        h = int(np.argmin(host_over))
        if hbm_over.min() > 0:
            over = float(hbm_over.min())
            msg = (
                f"as {c.label} it needs {fmt_bytes(state.hbm[r] + hbm_need[r])} of HBM on rank {r}, which offers "
                f"{fmt_bytes(state.hbm_limit[r])} after {topo.reserve_words(r)}: "
                f"short by {fmt_bytes(over)}"
            )
        elif host_over.min() > 0:
            over = float(host_over.min())
            msg = (
                f"as {c.label} it needs {fmt_bytes(host_need[h])} of host memory on host {h}, which has "
                f"{fmt_bytes(state.host_limit[h])}: short by {fmt_bytes(over)}"
            )
        else:
            continue
        if best is None or over < best[0]:
            best = (over, msg)
    return best[1] if best else "does not fit"


def explain_infeasible(
    topo: Topology,
    model: ModelSpec,
    cands: list[list[Candidate]],
    unplaced: list[str],
    empty_state: Callable[[], LoadState],
    fits: Callable[[LoadState, Candidate], bool],
) -> list[str]:
    """Lines for an infeasible answer, most fundamental shortage first."""
    lines: list[str] = []
    hbm_total = sum(c.hbm_limit_bytes * len(c.ranks) for c in topo.classes)
    host_total = sum(h.host_memory_bytes for h in topo.hosts)
    reserve = topo.reserves_words()
    n = len(model.embedding_tables)
    # least memory each table can live with (HBM + host), whatever the candidate
    need_any = 0
    need_hbm_min = 0
    for cs in cands:
        if not cs:
            continue

        def total(c: Candidate) -> int:
            h = np.min(c.hbm, axis=1) if c.scope != "fleet" else c.hbm[:, 0]
            d = np.min(c.host, axis=1) if c.scope != "fleet" else c.host[:, 0]
            return int(h.sum()) + int(d.sum())  # Python ints: the two sums together may pass int64

        need_any += min(total(c) for c in cs)
        need_hbm_min += min(int((np.min(c.hbm, axis=1) if c.scope != "fleet" else c.hbm[:, 0]).sum()) for c in cs)
    if need_any > hbm_total + host_total:
        lines.append(
            f"needs {fmt_bytes(need_any)} of HBM+host memory for {n} tables; the fleet offers "
            f"{fmt_bytes(hbm_total)} HBM (after {reserve}) and {fmt_bytes(host_total)} host memory: "
            f"short by {fmt_bytes(need_any - hbm_total - host_total)}"
        )
    if need_hbm_min > hbm_total:
        lines.append(
            f"even with every large table offloaded to host memory, HBM buffers and caches need "
            f"{fmt_bytes(need_hbm_min)}; the fleet offers {fmt_bytes(hbm_total)} HBM: short by "
            f"{fmt_bytes(need_hbm_min - hbm_total)}"
        )
    state = empty_state()
    for name in unplaced[:5]:
        i = [t.name for t in model.embedding_tables].index(name)
        cs = cands[i]
        if not cs:
            lines.append(f"table {name}: no sharding option exists for it on this fleet")
            continue
        if any(fits(state, c) for c in cs):
            if not lines:
                lines.append(
                    f"table {name}: fits an empty fleet but no rank had room left once the larger tables were "
                    f"placed (tried {len(cs)} options); the tables together need at least {fmt_bytes(need_hbm_min)} "
                    f"of HBM of the {fmt_bytes(hbm_total)} available"
                )
            continue
        lines.append(f"table {name}: {smallest_shortage(topo, state, cs)}")
    if len(unplaced) > 5:
        lines.append(f"… and {len(unplaced) - 5} more tables could not be placed")
    if not lines:
        lines.append(f"{len(unplaced)} table(s) could not be placed")
    return lines
