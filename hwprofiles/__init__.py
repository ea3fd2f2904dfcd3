"""Accelerator profiles: one validated YAML file per GPU, and the loader."""

from shardwise.hwprofiles.calibration import CALIBRATABLE, Calibration, load_calibration
from shardwise.hwprofiles.loader import ProfileError, catalogue, get_profile, load_profile_file, parse_profile
from shardwise.hwprofiles.schema import RATE_DTYPES, AchievedFractions, HardwareProfile, StepOverheads

__all__ = [
    "CALIBRATABLE",
    "RATE_DTYPES",
    "AchievedFractions",
    "Calibration",
    "HardwareProfile",
    "ProfileError",
    "StepOverheads",
    "catalogue",
    "get_profile",
    "load_calibration",
    "load_profile_file",
    "parse_profile",
]
