"""A fleet priced with a calibration: the calibrated profile inline, in place of the catalogue name it overlays."""

from __future__ import annotations

from collections.abc import Mapping

from shardwise.hwprofiles import Calibration, HardwareProfile, catalogue
from shardwise.wire.spec import FleetSpec

__all__ = ["calibrate_fleet"]


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
