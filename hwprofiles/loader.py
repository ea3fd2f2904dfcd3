"""Load and validate the accelerator catalogue (``profiles/*.yaml``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from shardwise.hwprofiles.schema import HardwareProfile

PROFILE_DIR = Path(__file__).parent / "profiles"


class ProfileError(ValueError):
    """A profile file or inline profile that does not validate."""


def parse_profile(data: Any, *, origin: str = "inline profile", require_sources: bool = False) -> HardwareProfile:
    """Validate one profile given as a mapping; ``require_sources`` demands a source for every figure."""
    try:
        profile = HardwareProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ProfileError(f"{origin}: {loc}: {first['msg']}") from exc
    if require_sources:
        missing = profile.unsourced()
        if missing:
            raise ProfileError(f"{origin}: figures without a source: {', '.join(missing)}")
    return profile


def load_profile_file(path: Path) -> HardwareProfile:
    """Read one catalogue YAML; its file stem must equal the profile's name."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path.name}: not valid YAML: {exc}") from exc
    profile = parse_profile(data, origin=path.name, require_sources=True)
    if profile.name != path.stem:
        raise ProfileError(f"{path.name}: name {profile.name!r} does not match the file name")
    return profile


@lru_cache(maxsize=1)
def _catalogue() -> dict[str, HardwareProfile]:
    profiles: dict[str, HardwareProfile] = {}
    for path in sorted(PROFILE_DIR.glob("*.yaml")):
        profile = load_profile_file(path)
        profiles[profile.name] = profile
    return profiles


def catalogue() -> dict[str, HardwareProfile]:
    """Every catalogue profile by name (validated once per process)."""
    return dict(_catalogue())


def get_profile(name: str) -> HardwareProfile:
    """One catalogue profile; unknown names raise with the list of known ones."""
    profiles = _catalogue()
    try:
        return profiles[name]
    except KeyError:
        raise ProfileError(f"unknown GPU profile {name!r}; known: {', '.join(sorted(profiles))}") from None
