"""The ``shardwise`` CLI's local commands, which need no server: ``plan``, ``evaluate``, ``port``, ``kernels`` and
``profiles``, with the port comparison's printing (``print_port``).

They load the solver lazily, when they run, so the base install can show ``--help`` and says in one line which extra
to add when the solver's dependencies are missing. ``register`` adds them to the ``shardwise`` app
(``shardwise.clients.cli``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from shardwise.clients.cli_common import (
    CalibrationOption,
    ExecutorOption,
    GraphedStepsOption,
    OneDOption,
    Solver,
    WeightAveragingOption,
    calibrated,
    describe_validation_error,
    engine_options,
    fail,
    gb,
    install_hint,
    invalid_plan_line,
    load_spec,
    print_plan,
    read_document,
    table,
    write_plan,
)
from shardwise.wire.port_spec import PortReport
from shardwise.wire.spec import (
    ENGINE_NAMES,
    DenseStyle,
    Executor,
    FleetSpec,
    ModelSpec,
    Plan,
    PlanStatus,
    SolveParams,
    engine_words,
)

MAX_PROBLEMS = 12  # an invalid plan lists this many problems, then how many more


def _solver_modules() -> Any:
    try:
        import numpy  # noqa: F401

        from shardwise.solver import planner
    except ImportError as exc:  # pragma: no cover - exercised on the base install only
        fail(f"the local planner needs the planner extra ({exc.name} is missing): {install_hint('planner')}")
    return planner


def _port_module() -> Any:
    _solver_modules()  # the one-line message when the planner extra is missing
    from shardwise.solver import port

    return port


def plan(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL", help="ModelSpec JSON/YAML")],
    fleet_path: Annotated[Path, typer.Argument(metavar="FLEET", help="FleetSpec JSON/YAML")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the plan JSON here")] = None,
    solver: Annotated[
        Solver, typer.Option(help="cpsat: CP-SAT, with its gap to the bound over all plans; greedy: the fast heuristic")
    ] = Solver.cpsat,
    time_limit: Annotated[float, typer.Option("--time-limit", help="CP-SAT time limit, seconds", min=0.001)] = 30.0,
    seed: Annotated[int, typer.Option(help="CP-SAT random seed (same seed, same plan)", min=0)] = 0,
    workers: Annotated[int, typer.Option(help="CP-SAT worker threads", min=1)] = 2,
    gap: Annotated[float, typer.Option(help="stop once within this relative gap of the bound", min=0.0)] = 0.0,
    deterministic_time: Annotated[
        float | None,
        typer.Option(
            "--deterministic-time", help="CP-SAT work limit in deterministic units: reproducible on any machine"
        ),
    ] = None,
    calibration: CalibrationOption = None,
    executor: ExecutorOption = Executor.shardwise,
    one_d: OneDOption = False,
    allow_weight_averaging: WeightAveragingOption = False,
    graphed_steps: GraphedStepsOption = False,
) -> None:
    """Plan MODEL on FLEET for the engine --executor names; print the per-rank table and (with -o) write the plan."""
    model = load_spec(model_path, ModelSpec)
    (fleet,) = calibrated([load_spec(fleet_path, FleetSpec)], calibration, executor)
    try:
        params = SolveParams(
            solver=solver.value,
            time_limit_s=time_limit,
            random_seed=seed,
            num_workers=workers,
            relative_gap_limit=gap,
            max_deterministic_time=deterministic_time,
            **engine_options(executor, one_d, allow_weight_averaging, graphed_steps),
        )
    except ValidationError as exc:
        fail(describe_validation_error(exc))
    planner = _solver_modules()
    try:
        result: Plan = planner.make_plan(model, fleet, params)
    except planner.ProblemTooLargeError as exc:  # more work than the solver's memory: the figures, in one line
        fail(str(exc))
    except planner.PlanValidationError as exc:  # the gate refused the planner's own plan
        fail(invalid_plan_line(exc.violations), code=3)
    print_plan(result)
    write_plan(result, output)
    if result.status is PlanStatus.infeasible:
        raise typer.Exit(1)


def evaluate(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL")],
    fleet_path: Annotated[Path, typer.Argument(metavar="FLEET")],
    plan_path: Annotated[
        Path,
        typer.Argument(metavar="PLAN", help="a plan in shardwise's wire format, or TorchRec's serialized ShardingPlan"),
    ],
    torchrec: Annotated[
        bool, typer.Option("--torchrec", help="price it for TorchRec + FBGEMM: short for --executor torchrec")
    ] = False,
    executor: Annotated[
        Executor | None,
        typer.Option(
            "--executor",
            help="the engine to price the layout for (torchrec: a layout TorchRec cannot run is a problem); "
            "default: the plan's own engine, torchrec for a TorchRec ShardingPlan",
            show_default=False,
        ),
    ] = None,
    calibration: CalibrationOption = None,
) -> None:
    """Validate PLAN for MODEL on FLEET and print its predicted step time per rank, priced for the engine --executor
    names. A TorchRec ShardingPlan (``sharding_type`` per table) is imported first."""
    if torchrec and executor is Executor.shardwise:
        fail("--torchrec is short for --executor torchrec: give one engine")
    model = load_spec(model_path, ModelSpec)
    fleet = load_spec(fleet_path, FleetSpec)
    document = read_document(plan_path)
    imported = looks_like_torchrec(document)
    given: Plan | None = None
    if not imported:
        try:
            given = Plan.model_validate(document)
        except ValidationError as exc:
            fail(f"{plan_path}: {describe_validation_error(exc)}")
    engine = Executor.torchrec if torchrec else executor
    if engine is None:  # the plan's own: a TorchRec ShardingPlan runs on TorchRec
        engine = Executor.torchrec if given is None else given.executor
    (fleet,) = calibrated([fleet], calibration, engine)
    if given is None:
        from shardwise.solver.torchrec.importer import from_torchrec

        try:
            given = from_torchrec(document, model, fleet)
        except ValueError as exc:
            fail(f"{plan_path}: {exc}")
    if given.ranks and len(given.ranks) != fleet.world_size:
        # rank for rank or not at all: one line, not a problem per layer that misses the other ranks
        typer.echo(
            f"plan is invalid: the plan has {len(given.ranks)} ranks, the fleet {fleet.name} has {fleet.world_size}; "
            f"score it on a fleet of {len(given.ranks)} GPUs, or compare it with a re-plan: shardwise port --plan",
            err=True,
        )
        raise typer.Exit(1)
    planner = _solver_modules()
    problems, scored = planner.score_plan(model, fleet, given, executor=engine)
    if problems:
        typer.echo(f"plan is invalid for {ENGINE_NAMES[engine]} ({len(problems)} problem(s)):", err=True)
        for p in problems[:MAX_PROBLEMS]:
            typer.echo(f"  - {p}", err=True)
        if len(problems) > MAX_PROBLEMS:
            typer.echo(f"  … and {len(problems) - MAX_PROBLEMS} more", err=True)
        raise typer.Exit(1)
    print_plan(scored, scored=True)


def looks_like_torchrec(document: Any) -> bool:
    """A serialized TorchRec ``ShardingPlan`` (``{"plan": {module: {table: {"sharding_type": ...}}}}``, or the same
    without the outer key) rather than a shardwise plan, which has no ``sharding_type`` two levels down."""
    if not isinstance(document, dict) or "tables" in document:
        return False
    inner = document.get("plan", document)
    if not isinstance(inner, dict):
        return False
    for tables in inner.values():
        if isinstance(tables, dict) and any(
            isinstance(entry, dict) and "sharding_type" in entry for entry in tables.values()
        ):
            return True
    return False


def _fleet_line(fleet: FleetSpec) -> str:
    groups = ", ".join(f"{g.count * g.gpus_per_host}× {g.gpu_name}" for g in fleet.hosts)
    return f"{fleet.name} ({groups})"


def _opt_gb(n: int | None) -> str:
    return f"{'-':>8}" if n is None else gb(n)


def _opt_ms(x: float | None) -> str:
    return f"{'-':>9}" if x is None else f"{x:>9.3f}"


def print_port(report: PortReport, source: FleetSpec, target: FleetSpec) -> None:
    """The comparison as text: the three plans, per-rank HBM and time on the target, short ranks, hints."""
    typer.echo(f"port {report.model}: {_fleet_line(source)} → {_fleet_line(target)}")
    src = report.source_plan
    if src.status is PlanStatus.infeasible:
        typer.echo(f"source plan:  infeasible on {report.source_fleet}")
    else:
        typer.echo(
            f"source plan:  {src.predicted_step_ms:.3f} ms per step on {report.source_fleet} ({src.solver.name})"
        )
    d = report.direct_port
    if d.feasible:
        typer.echo(f"direct port:  runs, {d.predicted_step_ms:.3f} ms per step on {report.target_fleet}")
    else:
        typer.echo(f"direct port:  does not run on {report.target_fleet}")
    re = report.replan
    if re.status is PlanStatus.infeasible:
        typer.echo(f"re-plan:      infeasible on {report.target_fleet}")
    else:
        bound = "" if re.lower_bound_ms is None else f", bound {re.lower_bound_ms:.3f} ms"
        kept = " (the direct port's layout)" if report.replan_from == "direct_port" else ""
        typer.echo(f"re-plan:      {re.predicted_step_ms:.3f} ms per step ({re.solver.name}{bound}){kept}")
    if report.speedup is not None:
        typer.echo(f"speed-up:     {report.speedup:.2f}× ({report.step_ms_saved:.3f} ms per step saved)")
    else:
        typer.echo("speed-up:     n/a (the direct port or the re-plan does not run)")
    if src.executor is re.executor:
        typer.echo(f"engine:       {engine_words(re.executor)}")
    else:  # a source plan given for one engine, the re-plan made for the other
        typer.echo(f"engine:       source plan {engine_words(src.executor)}, re-plan {engine_words(re.executor)}")
    typer.echo("")
    typer.echo(
        f"{'rank':>4} {'gpu':<16} {'usable GB':>9} {'src GB':>8} {'port GB':>8} {'re GB':>8} "
        f"{'port ms':>9} {'re ms':>9}"
    )
    for r in report.ranks:
        typer.echo(
            f"{r.rank:>4} {r.gpu:<16} {r.hbm_limit_bytes / 1e9:>9.2f} {_opt_gb(r.source_hbm_bytes)} "
            f"{_opt_gb(r.direct_port_hbm_bytes)} {_opt_gb(r.replan_hbm_bytes)} "
            f"{_opt_ms(r.direct_port_ms)} {_opt_ms(r.replan_ms)}"
        )
    if d.problems:
        typer.echo("")
        typer.echo("direct port problems:")
        for line in d.problems[:MAX_PROBLEMS]:
            typer.echo(f"  - {line}")
        if len(d.problems) > MAX_PROBLEMS:
            typer.echo(f"  … and {len(d.problems) - MAX_PROBLEMS} more")
    typer.echo("")
    typer.echo("hints:")
    for line in report.hints:
        typer.echo(f"  - {line}")


def port(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL", help="ModelSpec JSON/YAML")],
    source_path: Annotated[
        Path, typer.Option("--from", metavar="FLEET_A", help="the fleet the job runs on now (FleetSpec JSON/YAML)")
    ],
    target_path: Annotated[
        Path, typer.Option("--to", metavar="FLEET_B", help="the fleet it moves to (FleetSpec JSON/YAML)")
    ],
    plan_path: Annotated[
        Path | None,
        typer.Option("--plan", metavar="PLAN", help="the plan FLEET_A runs (wire format); default: plan it"),
    ] = None,
    solver: Annotated[
        Solver, typer.Option(help="cpsat: CP-SAT, with its gap to the bound over all plans; greedy: the fast heuristic")
    ] = Solver.cpsat,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="CP-SAT time limit per solve, seconds", min=0.001)
    ] = 30.0,
    seed: Annotated[int, typer.Option(help="CP-SAT random seed (same seed, same plan)", min=0)] = 0,
    workers: Annotated[int, typer.Option(help="CP-SAT worker threads", min=1)] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as one JSON object")] = False,
    calibration: CalibrationOption = None,
    executor: ExecutorOption = Executor.shardwise,
    one_d: OneDOption = False,
    allow_weight_averaging: WeightAveragingOption = False,
    graphed_steps: GraphedStepsOption = False,
) -> None:
    """Compare running MODEL's FLEET_A plan unchanged on FLEET_B (the direct port) with re-planning for FLEET_B, both
    plans for the engine --executor names."""
    model = load_spec(model_path, ModelSpec)
    fleets = [load_spec(source_path, FleetSpec), load_spec(target_path, FleetSpec)]
    source, target = calibrated(fleets, calibration, executor)
    given = load_spec(plan_path, Plan) if plan_path is not None else None
    try:
        params = SolveParams(
            solver=solver.value,
            time_limit_s=time_limit,
            random_seed=seed,
            num_workers=workers,
            **engine_options(executor, one_d, allow_weight_averaging, graphed_steps),
        )
    except ValidationError as exc:
        fail(describe_validation_error(exc))
    port_mod = _port_module()
    try:
        report: PortReport = port_mod.port_analysis(model, source, target, params, source_plan=given)
    except port_mod.PortError as exc:
        fail(f"{plan_path}: {exc}")
    except _solver_modules().ProblemTooLargeError as exc:
        fail(str(exc))
    except _solver_modules().PlanValidationError as exc:  # the gate refused a plan the port made
        fail(invalid_plan_line(exc.violations), code=3)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        print_port(report, source, target)
    if report.replan.status is PlanStatus.infeasible:
        raise typer.Exit(1)


def kernels(
    model_path: Annotated[Path, typer.Argument(metavar="MODEL", help="ModelSpec JSON/YAML")],
    fleet_path: Annotated[Path, typer.Argument(metavar="FLEET", help="FleetSpec JSON/YAML")],
    style: Annotated[
        DenseStyle, typer.Option(help="the style of every linear layer the model does not pin")
    ] = DenseStyle.replicate,
    batch: Annotated[
        int | None, typer.Option(help="samples per GPU (default: the model's batch_size_per_gpu)", min=1)
    ] = None,
    calibration: CalibrationOption = None,
    graphed_steps: GraphedStepsOption = False,
) -> None:
    """The kernel the kernel model chooses for each GEMM of MODEL's linear layers on each GPU type of FLEET (for
    eager steps, or with ``--graphed-steps`` for graphed ones, where Triton's launch costs no host time): per
    layer, phase and GPU, M N K and dtype, the kernel that runs it (``vendor``: the vendor GEMM through torch.matmul,
    cuBLAS / hipBLASLt; ``triton``: shardwise's Triton matmul), its predicted µs and TFLOP/s, and both candidates —
    the best Triton configuration and its µs, the vendor GEMM's µs — then each GPU type's GEMM time per step with the
    chosen kernels, with Triton alone and with the vendor alone (predictions from first principles, no timing
    run)."""
    model = load_spec(model_path, ModelSpec)
    (fleet,) = calibrated([load_spec(fleet_path, FleetSpec)], calibration)
    _solver_modules()
    from shardwise.solver.kernels import kernel_choices
    from shardwise.solver.topology import Topology

    try:
        topo = Topology(fleet, graphed=graphed_steps)
    except ValueError as exc:  # a GPU name the catalogue does not know (ProfileError)
        fail(f"{fleet_path}: {exc}")
    targets = [(c.profile, c.gpus_per_host) for c in topo.classes]
    priced = [p for p, _ in targets if p.microarch is not None]
    if not priced:
        names = ", ".join(sorted({p.name for p, _ in targets}))
        fail(f"no GPU of fleet {fleet.name} has a microarchitecture in its profile ({names}): nothing to price")
    samples = batch or model.batch_size_per_gpu
    rows: list[list[str]] = []
    skipped: list[str] = []
    totals: dict[str, list[float]] = {}  # GPU type → µs per step: chosen, Triton alone, vendor alone
    for layer in model.dense_layers:
        if layer.kind != "linear":
            skipped.append(layer.name)
            continue
        layer_style = layer.style or style
        for k in kernel_choices(layer, layer_style, samples, targets):
            tflops = 2.0 * k.m * k.n * k.k / (k.predicted_us * 1e-6) / 1e12
            triton_us = k.triton_us if k.triton_us is not None else k.predicted_us
            vendor_us = k.vendor_us if k.vendor_us is not None else float("nan")
            sums = totals.setdefault(k.gpu, [0.0, 0.0, 0.0])
            for i, us in enumerate((k.predicted_us, triton_us, vendor_us)):
                sums[i] += us
            rows.append(
                [
                    layer.name,
                    layer_style.value,
                    k.phase.value,
                    k.gpu,
                    str(k.m),
                    str(k.n),
                    str(k.k),
                    k.dtype.value,
                    k.kernel.value,
                    f"{k.predicted_us:.1f}",
                    f"{tflops:.1f}",
                    k.config.label,
                    f"{triton_us:.1f}",
                    f"{vendor_us:.1f}",
                ]
            )
    steps = "graphed" if graphed_steps else "eager"
    typer.echo(
        f"kernels for {model.name} on {fleet.name}, {samples:,} samples per GPU, {steps} steps (predicted, no timing "
        "run)"
    )
    header = ["layer", "style", "phase", "gpu", "M", "N", "K", "dtype", "runs", "pred µs", "TFLOP/s"]
    header += ["best Triton config", "Triton µs", "vendor µs"]
    for line in table(rows, header, right={4, 5, 6, 9, 10, 12, 13}):
        typer.echo(line)
    for gpu, (chosen, triton, vendor) in totals.items():
        typer.echo(
            f"{gpu}: GEMMs {chosen:.1f} µs per step with the chosen kernels ({triton:.1f} with Triton alone, "
            f"{vendor:.1f} with the vendor GEMM alone)"
        )
    if skipped:
        typer.echo(f"not priced by the kernel model (unclassified layers, flat GEMM fraction): {', '.join(skipped)}")
    unpriced = sorted({p.name for p, _ in targets if p.microarch is None})
    if unpriced:
        typer.echo(f"no microarchitecture in the profile of: {', '.join(unpriced)}")


def profiles() -> None:
    """List the accelerator catalogue."""
    from shardwise.hwprofiles import catalogue

    typer.echo(f"{'name':<17} {'HBM GB':>8} {'HBM TB/s':>8} {'bf16 TF':>8} {'scale-up GB/s':>13} {'peer GB/s':>9}")
    for name, p in sorted(catalogue().items()):
        typer.echo(
            f"{name:<17} {p.hbm_bytes / 1e9:>8.1f} {p.hbm_bandwidth_bytes_per_s / 1e12:>8.2f} "
            f"{p.peak_flops_per_s['bf16'] / 1e12:>8.0f} {p.scale_up_bytes_per_s / 1e9:>13.1f} "
            f"{p.scale_up_per_peer_bytes_per_s / 1e9:>9.1f}"
        )


def register(target: typer.Typer) -> None:
    """Add ``plan``, ``evaluate``, ``port``, ``kernels`` and ``profiles`` to a Typer app (the ``shardwise`` one)."""
    target.command()(plan)
    target.command()(evaluate)
    target.command()(port)
    target.command()(kernels)
    target.command()(profiles)
