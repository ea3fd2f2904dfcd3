"""A fleet priced with a calibration: the calibrated profile inline, in place of the catalogue name it overlays; and
whether a calibration may price a plan for an engine at all (:func:`engine_mismatch`)."""

from __future__ import annotations

from collections.abc import Mapping

from shardwise.hwprofiles import Calibration, HardwareProfile, catalogue
from shardwise.wire.spec import ENGINE_NAMES, Executor, FleetSpec

__all__ = ["calibrate_fleet", "engine_mismatch"]


def engine_mismatch(calibration: Calibration, executor: Executor, label: str | None = None) -> str | None:
    """Why ``calibration`` cannot price a plan for ``executor``, in one line naming it and both engines; None when
    it describes that engine (``Calibration.engine``: eager or graphed steps are shardwise's executor, ``torchrec``
    is TorchRec + FBGEMM). Figures timed on one engine say nothing of the other's kernels and overheads, so a plan is
    priced only with calibrations of the engine it is planned for. ``label``: how the caller names the calibration
    (its file, its reference), before its own label."""
    engine = Executor(calibration.engine)
    if engine is executor:
        return None
    named = f"{label}: " if label else ""
    return (
        f"{named}{calibration.label()} describes {ENGINE_NAMES[engine]} ({engine.value}), but the plan "
        f"is for {ENGINE_NAMES[executor]} ({executor.value}): give a calibration of {executor.value}, or plan for "
        f"{engine.value}"
    )


def calibrate_fleet(
    fleet: FleetSpec, calibration: Calibration, profiles: Mapping[str, HardwareProfile] | None = None
) -> FleetSpec:
    """``fleet`` with every host group of ``calibration.profile`` given the calibrated profile inline.

    ``profiles``: custom profiles a name may refer to besides the catalogue. Raises ValueError (one line) when no host
    group uses that profile, or when the calibrated profile is invalid.
    """
    known = {**catalogue(), **(profiles or {})}
    hosts = []
    used = False
    for group in fleet.hosts:
        if group.gpu_name == calibration.profile:
            base = group.gpu if isinstance(group.gpu, HardwareProfile) else known[group.gpu]
            group = group.model_copy(update={"gpu": calibration.apply(base)})
            used = True
        hosts.append(group)
    if not used:
        names = sorted({g.gpu_name for g in fleet.hosts})
        raise ValueError(f"the calibration is for {calibration.profile!r}; fleet {fleet.name} has {', '.join(names)}")
    return fleet.model_copy(update={"hosts": hosts})
