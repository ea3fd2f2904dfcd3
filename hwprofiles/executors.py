"""Executor profiles: what a training step costs the host and the executor, apart from the GPU.

A step's host terms — the fixed floor, the cost per table, per dense layer and per group of shards a rank looks up,
the zero-copy reads of ``host`` shards, the fetch of a ``uvm_cache`` shard's missing rows — belong to the engine that
runs the step and the CPU that enqueues it, not to the accelerator. So they live here, one small YAML file per engine
(``executors/*.yaml``), measured (each file names the calibration its figures come from), and not in the GPU profiles:

* ``shardwise-eager`` — shardwise's executor with each kernel enqueued from Python (``apply_plan``'s default);
* ``shardwise-graphed`` — the same executor with each step captured as a CUDA graph and replayed (``GraphedStep``):
  its floor is the device time of a step's small kernels, which adds to the step's work;
* ``torchrec`` — TorchRec's ``DistributedModelParallel`` on FBGEMM's kernels.

:func:`with_executor` lays one over a GPU profile: every host term the profile leaves at zero takes the executor's
figure, a figure a calibration set stays (a calibration measures this machine's host, the catalogue's figures
another's). The planner applies the one a plan is for (``SolveParams.executor`` and ``graphed_steps``) to every GPU
of a fleet alike (``shardwise.solver.topology.Topology``), so that no GPU type of a mixed fleet is charged host work
the others are not.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shardwise.hwprofiles.calibration import with_figures
from shardwise.hwprofiles.schema import ONE_LINE, HardwareProfile, StepOverheads

__all__ = ["EXECUTOR_TERMS", "ExecutorProfile", "executor_profile", "executor_profiles", "with_executor"]

EXECUTOR_DIR = Path(__file__).parent / "executors"

#: the step overheads an executor profile carries (``StepOverheads``' host and executor terms; the id sort before
#: the fused update, ``sort_ns_per_id``, is device time and stays the GPU's)
EXECUTOR_TERMS: Final = (
    "step_fixed_us",
    "per_table_us",
    "per_layer_us",
    "per_group_us",
    "host_shard_us",
    "host_ns_per_id",
    "host_ns_per_row_byte",
    "cache_fetch_us",
    "cache_fetch_ns_per_row",
)


class ExecutorProfile(BaseModel):
    """One engine's step overheads (module docstring), with where each comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    display_name: str = Field(min_length=1, max_length=120, pattern=ONE_LINE)
    engine: Literal["shardwise", "torchrec"]
    graphed: bool = False
    calibration: str = Field(min_length=1, max_length=400, pattern=ONE_LINE, description="the file and date")
    overheads: dict[str, float] = Field(min_length=1)
    sources: dict[str, str]

    @model_validator(mode="after")
    def _known_and_sourced(self) -> ExecutorProfile:
        unknown = sorted(set(self.overheads) - set(EXECUTOR_TERMS))
        if unknown:
            raise ValueError(f"terms an executor profile cannot set: {unknown}; settable: {list(EXECUTOR_TERMS)}")
        missing = sorted(set(self.overheads) - set(self.sources))
        if missing:
            raise ValueError(f"figures without a source: {missing}")
        StepOverheads.model_validate(self.overheads)  # the schema's bounds: no negative or absurd figure
        if self.graphed and self.engine != "shardwise":
            raise ValueError("graphed steps are shardwise's executor's")
        return self


@lru_cache(maxsize=1)
def _profiles() -> dict[str, ExecutorProfile]:
    out: dict[str, ExecutorProfile] = {}
    for path in sorted(EXECUTOR_DIR.glob("*.yaml")):
        try:
            profile = ExecutorProfile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
        except (yaml.YAMLError, ValidationError) as exc:
            raise ValueError(f"{path.name}: {str(exc).splitlines()[0]}") from None
        if profile.name != path.stem:
            raise ValueError(f"{path.name}: name {profile.name!r} does not match the file name")
        out[profile.name] = profile
    return out


def executor_profiles() -> dict[str, ExecutorProfile]:
    """Every executor profile by name (validated once per process)."""
    return dict(_profiles())


def executor_profile(engine: str, graphed: bool = False) -> ExecutorProfile:
    """The profile of ``engine`` (``shardwise`` or ``torchrec``, :class:`~shardwise.wire.spec.Executor`'s values),
    with its steps graphed or not (shardwise's executor only)."""
    if engine == "torchrec":
        if graphed:
            raise ValueError("graphed steps are shardwise's executor's, not TorchRec's")
        return _profiles()["torchrec"]
    return _profiles()["shardwise-graphed" if graphed else "shardwise-eager"]


#: overlaid profiles by (the profile's JSON, the executor's name): profiles are frozen but not hashable
_OVERLAID: dict[tuple[str, str], HardwareProfile] = {}
_OVERLAID_MAX: Final = 256


def _overlaid(profile: HardwareProfile, name: str) -> HardwareProfile:
    key = (profile.model_dump_json(), name)
    hit = _OVERLAID.get(key)
    if hit is None:
        if len(_OVERLAID) >= _OVERLAID_MAX:
            _OVERLAID.clear()
        hit = _OVERLAID[key] = _overlay(profile, _profiles()[name])
    return hit


def _overlay(profile: HardwareProfile, ex: ExecutorProfile) -> HardwareProfile:
    own = profile.overheads
    values: dict[str, float] = {}
    sources = dict(profile.sources)
    for term, value in ex.overheads.items():
        if getattr(own, term) == 0.0:  # a calibration's figure stays
            values[f"overheads.{term}"] = value
            if value:
                sources[f"overheads.{term}"] = f"executor profile {ex.name}: {ex.sources[term]}; {ex.calibration}"
    calibrated = profile.calibration is not None and any(getattr(own, t) for t in EXECUTOR_TERMS)
    values["overheads.graphed_steps"] = own.graphed_steps if calibrated else ex.graphed
    return with_figures(profile, values, sources=sources)


def with_executor(profile: HardwareProfile, executor: ExecutorProfile) -> HardwareProfile:
    """``profile`` with ``executor``'s step overheads wherever its own are zero (module docstring). A profile whose
    calibration set host terms keeps its own and its ``graphed_steps``; any other takes the executor's."""
    return _overlaid(profile, executor.name)
