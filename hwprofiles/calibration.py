"""Calibrations: measured figures that overlay one accelerator profile.

A calibration is what ``shardwise calibrate`` writes after timing the executor's kernels, GEMMs, copies and the host
link on one GPU: the profile it applies to, the machine it was measured on (device, torch, driver, Triton, date),
and per figure the fitted value, where it comes from (``source: measured on …``), the number of samples behind it and
the fit's error. ``Calibration.apply(profile)`` returns the profile with those figures replaced and their sources
rewritten; the result is validated like any profile, so a calibration cannot produce an impossible one (an achieved
fraction above 1, a negative latency). ``apply_to_fleet`` swaps the calibrated profile in, inline, for every host
group of that GPU: the plan's request then carries the calibrated figures (and so does its request hash).

``measurements`` holds what was measured but is not (yet) a figure of the profile — per-kernel launch cost, a minimal
training step's host time — reported so that a reader sees them beside the fitted figures.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, FailFast, Field, field_validator

from shardwise.hwprofiles.schema import ONE_LINE, HardwareProfile

__all__ = ["CALIBRATABLE", "Calibration", "Figure", "load_calibration", "with_figures"]

#: the profile figures a calibration may set (dotted paths, as in a profile's ``sources``)
CALIBRATABLE: Final = (
    "achieved.embedding_gather",
    "achieved.memory_bound",
    "achieved.gemm",
    "achieved.host_link",
    "achieved.intra_host_collective",
    "achieved.inter_host_collective",
    "intra_host_latency_us",
    "inter_host_latency_us",
    "overheads.step_fixed_us",
    "overheads.per_table_us",
    "overheads.per_layer_us",
    "overheads.per_group_us",
    "overheads.sort_ns_per_id",
    "overheads.host_shard_us",
    "overheads.host_ns_per_id",
    "overheads.host_ns_per_row_byte",
    "overheads.cache_fetch_us",
    "overheads.cache_fetch_ns_per_row",
    "runtime_reserve_bytes",
)
#: calibratable figures that are whole bytes (a Figure's value is a float)
INTEGER_FIGURES: Final = frozenset({"runtime_reserve_bytes"})


class Figure(BaseModel):
    """One fitted figure: its value, its provenance, and how well the fit explains the samples."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    value: float = Field(ge=0, allow_inf_nan=False)
    source: str = Field(min_length=1, max_length=500, pattern=ONE_LINE)
    samples: int = Field(ge=1, description="measurements behind the fit")
    fit_error: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="RMS relative error of the fit over its samples"
    )


class Measurement(BaseModel):
    """A measured quantity that is not a profile figure (reported, not applied)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    value: float = Field(allow_inf_nan=False)
    unit: str = Field(min_length=1, max_length=40, pattern=ONE_LINE)
    source: str = Field(min_length=1, max_length=500, pattern=ONE_LINE)


class Calibration(BaseModel):
    """Measured figures for one profile, with the machine they were measured on."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = 1
    profile: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="the profile it overlays")
    device: str = Field(min_length=1, max_length=200, pattern=ONE_LINE, description="the GPU as the driver names it")
    torch: str = Field(min_length=1, max_length=80, pattern=ONE_LINE)
    driver: str | None = Field(default=None, max_length=80, pattern=ONE_LINE)
    triton: str | None = Field(default=None, max_length=80, pattern=ONE_LINE)
    # [0-9], not \d: the pattern is matched with Unicode classes, where \d also takes other scripts' digits
    date: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}", description="ISO date of the measurement")
    # FailFast: the first bad entry ends validation (a huge body of bad entries is a cheap 422)
    figures: Annotated[dict[str, Figure], FailFast()] = Field(min_length=1)
    measurements: Annotated[dict[str, Measurement], FailFast()] = Field(default_factory=dict)
    executor: Literal["eager", "graphed", "torchrec"] = Field(
        default="eager",
        description="what the figures describe: shardwise's executor with its steps eager (each kernel enqueued "
        "from Python) or graphed (each step captured once as a CUDA graph and replayed), or torchrec — TorchRec's "
        "DistributedModelParallel on FBGEMM's kernels (``shardwise calibrate --executor torchrec``); a plan is "
        "priced with calibrations of the engine it is planned for",
    )

    @field_validator("figures")
    @classmethod
    def _known_figures(cls, value: dict[str, Figure]) -> dict[str, Figure]:
        unknown = sorted(set(value) - set(CALIBRATABLE))
        if unknown:
            raise ValueError(f"figures a calibration cannot set: {unknown}; settable: {list(CALIBRATABLE)}")
        return value

    def digest(self) -> str:
        """sha256 of the canonical JSON: names the calibration in plans and request hashes."""
        # an eager calibration digests without the field, as every calibration did before graphed steps existed
        data = self.model_dump(mode="json", exclude={"executor"} if self.executor == "eager" else None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def engine(self) -> str:
        """The engine the figures describe: ``shardwise`` (eager or graphed steps) or ``torchrec``
        (:class:`shardwise.wire.spec.Executor`'s values)."""
        return "torchrec" if self.executor == "torchrec" else "shardwise"

    def label(self) -> str:
        """One line naming it: ``<profile> calibration <date> on <device>[, graphed steps | , TorchRec + FBGEMM]
        (<digest prefix>)``."""
        kind = {"graphed": ", graphed steps", "torchrec": ", TorchRec + FBGEMM"}.get(self.executor, "")
        return f"{self.profile} calibration {self.date} on {self.device}{kind} ({self.digest()[:12]})"

    def apply(self, profile: HardwareProfile) -> HardwareProfile:
        """``profile`` with the calibrated figures and their sources (a ValueError if it is another profile, or if
        the result is not a valid profile)."""
        if profile.name != self.profile:
            raise ValueError(f"this calibration is for {self.profile!r}, not {profile.name!r}")
        sources = dict(profile.sources)
        for path, fig in self.figures.items():
            error = f", fit error {fig.fit_error:.1%}" if fig.fit_error is not None else ""
            sources[path] = f"{fig.source} ({fig.samples} samples{error}; {self.label()})"
        values = {path: fig.value for path, fig in self.figures.items()}
        values["overheads.graphed_steps"] = self.executor == "graphed"
        return with_figures(profile, values, sources=sources, calibration=self.label())


def with_figures(
    profile: HardwareProfile,
    values: dict[str, float],
    *,
    sources: dict[str, str] | None = None,
    calibration: str | None = None,
) -> HardwareProfile:
    """``profile`` with the figures at the dotted ``values`` paths replaced (``achieved.gemm``,
    ``intra_host_latency_us``), validated like any profile; ``sources`` and ``calibration`` replace its own when
    given."""
    data: dict[str, Any] = profile.model_dump()
    for path, value in values.items():
        head, _, tail = path.partition(".")
        if path in INTEGER_FIGURES:
            value = round(value)
        data[head] = {**data[head], tail: value} if tail else value
    if sources is not None:
        data["sources"] = sources
    if calibration is not None:
        data["calibration"] = calibration
    return HardwareProfile.model_validate(data)


def load_calibration(path: Path | str) -> Calibration:
    """Read a calibration file (YAML or JSON). Raises ValueError with a one-line reason when it is not one."""
    import yaml

    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {p}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{p} is not YAML or JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: a calibration is a mapping, got {type(raw).__name__}")
    return Calibration.model_validate(raw)
