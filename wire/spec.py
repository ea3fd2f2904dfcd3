"""The wire contract: what a job sends (ModelSpec, FleetSpec) and what shardwise answers (Plan).

Frozen pydantic models, imported by the client, the CLI, the service and the solver alike; this module imports
pydantic and the profile schema only. Every size is in bytes, every time in milliseconds. Bad input is refused
with the field path and the reason (pydantic's ValidationError carries both).

Extend, never rename: new fields get defaults so that older documents still validate.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from itertools import pairwise
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    FailFast,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shardwise.hwprofiles import HardwareProfile, catalogue
from shardwise.hwprofiles.limits import (
    MAX_BATCH,
    MAX_DETERMINISTIC_TIME,
    MAX_DIM,
    MAX_FEATURES,
    MAX_FEATURES_PER_TABLE,
    MAX_FLOPS_PER_SAMPLE,
    MAX_GPUS_PER_HOST,
    MAX_HOST_GROUPS,
    MAX_HOSTS,
    MAX_MEMORY_BYTES,
    MAX_MODEL_BYTES,
    MAX_POOLING_FACTOR,
    MAX_ROWS,
    MAX_STEP_BYTES,
)

SCHEMA_VERSION: Final = 1
#: the share of HBM a GPU keeps back when neither the fleet nor its profile gives a reserve (a profile of the
#: caller's own without ``runtime_reserve_bytes``; the catalogue's profiles all carry one)
DEFAULT_RESERVE_FRACTION: Final = 0.1
MAX_PROGRESS_POINTS: Final = 512  # a solve's recorded progress (SolverInfo.progress) keeps at most this many points

#: what a name may hold, and a reference to a stored spec: "name", "name@latest" or "name@<version>" (a positive int32)
NAME_PATTERN: Final = r"^[A-Za-z0-9_.:/\-\[\]]+$"
REF_PATTERN: Final = r"^[A-Za-z0-9_.:/\-\[\]]{1,200}(@(latest|[1-9][0-9]{0,8}))?$"
_NAME_RE, _REF_RE = re.compile(NAME_PATTERN), re.compile(REF_PATTERN)
_NAME_CHARS: Final = "letters, digits and _ . : / - [ ]"


def _name_form(value: str) -> str:
    if not _NAME_RE.match(value):
        raise PydanticCustomError(
            "name_form", f"a name is made of {_NAME_CHARS} alone: got '{{value}}'", {"value": value}
        )
    return value


def _ref_form(value: str) -> str:
    if not _REF_RE.match(value):
        raise PydanticCustomError(
            "ref_form",
            f"a stored spec is named NAME, NAME@latest or NAME@VERSION, NAME made of {_NAME_CHARS}, VERSION a whole "
            "number from 1 (versions count from 1): got '{value}'",
            {"value": value},
        )
    return value


# the checks say in words what the patterns say; the JSON schema keeps the patterns for clients that validate
Name = Annotated[
    str,
    Field(min_length=1, max_length=200, json_schema_extra={"pattern": NAME_PATTERN}),
    AfterValidator(_name_form),
]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
Ms = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Ref = Annotated[
    str, Field(min_length=1, max_length=215, json_schema_extra={"pattern": REF_PATTERN}), AfterValidator(_ref_form)
]


class Dtype(StrEnum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"
    int8 = "int8"

    @property
    def nbytes(self) -> int:
        return _DTYPE_BYTES[self.value]


_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


class Pooling(StrEnum):
    sum = "sum"
    mean = "mean"
    none = "none"  # sequence: one output row per id


class Optimizer(StrEnum):
    sgd = "sgd"
    adagrad = "adagrad"
    rowwise_adagrad = "rowwise_adagrad"
    adam = "adam"


class ShardingType(StrEnum):
    """How a table's shards cut it: ``table_wise`` one whole shard; ``column_wise`` column slices holding every row;
    ``row_wise`` row blocks holding every column (over the fleet, a GPU type or a block of hosts);
    ``table_row_wise`` row blocks on the GPUs of one host; ``grid_shard`` column bands, each cut into row blocks on
    the GPUs of one host (TorchRec's ``grid_shard``: the bands spread a table over several hosts while each band's
    partial rows are summed inside its host); ``data_parallel`` a full copy on every rank."""

    table_wise = "table_wise"
    row_wise = "row_wise"
    column_wise = "column_wise"
    table_row_wise = "table_row_wise"
    grid_shard = "grid_shard"
    data_parallel = "data_parallel"

    @property
    def splits_rows(self) -> bool:
        """Whether the shards cut the rows: a shard serves only the ids in its rows and returns partial pooled rows
        that the ranks sharing its columns sum (row_wise, table_row_wise, grid_shard)."""
        return self in _ROW_SPLITS


_ROW_SPLITS: frozenset[ShardingType] = frozenset(
    {ShardingType.row_wise, ShardingType.table_row_wise, ShardingType.grid_shard}
)


class Placement(StrEnum):
    hbm = "hbm"
    uvm_cache = "uvm_cache"  # weights in host memory, cache_fraction of rows cached in HBM
    host = "host"  # weights in host memory, read over the host link


class Executor(StrEnum):
    """The engine that will run a plan: ``shardwise`` — shardwise's own executor (``shardwise.runtime.apply_plan``);
    ``torchrec`` — TorchRec's ``DistributedModelParallel`` over FBGEMM's table-batched embedding kernels, given the
    plan by ``to_torchrec``. A plan is priced for the engine its request names (the cost model prices what that
    engine does) and laid out only as that engine can run it."""

    shardwise = "shardwise"
    torchrec = "torchrec"


#: how the CLI, the pages and the explanations name each engine: here, so that the client side (which imports no
#: solver) words it as the solver does (``shardwise.solver.engine.ENGINE_NAMES``, a test holds the two equal)
ENGINE_NAMES: Final = {
    Executor.shardwise: "shardwise's executor",
    Executor.torchrec: "TorchRec + FBGEMM",
}


def engine_words(executor: Executor) -> str:
    """``priced for TorchRec + FBGEMM`` / ``priced for shardwise's executor``: the line that says which engine a
    plan's figures price."""
    return f"priced for {ENGINE_NAMES[executor]}"


class DenseStyle(StrEnum):
    replicate = "replicate"
    fsdp = "fsdp"
    colwise = "colwise"
    rowwise = "rowwise"


class PlanStatus(StrEnum):
    """The plan's own status, about its layout: ``optimal`` — it fits and its predicted step time meets
    :attr:`Plan.lower_bound_ms`, the bound no plan over the whole candidate catalogue can beat; ``feasible`` — it
    fits, not proved optimal against every plan (it may still be optimal among the layouts a search looked at:
    :attr:`SolverInfo.searched_optimal`); ``infeasible`` — no layout (the explanation says why). What the solver
    reported is :attr:`SolverInfo.status`, a separate field; :attr:`Plan.verdict` says it all in words."""

    optimal = "optimal"
    feasible = "feasible"
    infeasible = "infeasible"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# --------------------------------------------------------------------------------------------------- the model


class EmbeddingTableSpec(_Frozen):
    name: Name
    num_embeddings: int = Field(gt=0, le=MAX_ROWS, description="rows; at most 1e13")
    embedding_dim: int = Field(gt=0, le=MAX_DIM, description="columns; at most 65536")
    dtype: Dtype = Dtype.fp32
    pooling_factor: float = Field(
        default=1.0,
        gt=0,
        le=MAX_POOLING_FACTOR,
        allow_inf_nan=False,
        description="ids per sample per feature (mean bag size); at most 1e6",
    )
    pooling_factor_p99: float | None = Field(
        default=None,
        ge=0,
        le=MAX_POOLING_FACTOR,
        allow_inf_nan=False,
        exclude_if=lambda v: v is None,  # unset, a table dumps (and hashes) as before the field existed
        description="99th percentile of ids per sample per feature: a sequence table's long sequences (a pooled "
        "table's long bags), which a step waits for; None = not known (lengths priced at pooling_factor). describe() "
        "measures it. The cost model takes the lengths' tail as normal (deviation (p99 - pooling_factor) / 2.326, "
        "none at or below the mean) and prices the ids each rank exchanges for a sharded table, and looks up in a "
        "data_parallel copy, as the most of the ranks' totals",
    )
    pooling: Pooling = Pooling.sum
    num_features: int = Field(default=1, gt=0, le=MAX_FEATURES_PER_TABLE, description="at most 10000")
    optimizer: Optimizer = Optimizer.rowwise_adagrad
    access_skew: float | None = Field(
        default=None, gt=0, le=5, allow_inf_nan=False, description="Zipf exponent of row accesses; None = uniform"
    )
    weighted: bool = Field(
        default=False,
        description="ids come with a per-sample weight (a weighted collection): an fp32 weight travels with each id",
    )

    @property
    def weight_bytes(self) -> int:
        return self.num_embeddings * self.embedding_dim * self.dtype.nbytes


class DenseLayerSpec(_Frozen):
    """One dense layer: ``kind`` ``linear`` (an ``nn.Linear``: its size is ``in_features`` × ``out_features``, and
    any style fits it) or ``unclassified`` (any other module that holds parameters — a norm, an attention block, a
    cross network built from ``nn.ParameterList`` — or compute outside every layer; described by what it costs:
    ``param_count``, ``activation_bytes_per_sample`` and ``flops_per_sample``, and run data parallel, ``replicate``
    or ``fsdp``; tensor parallelism needs a linear layer). ``style`` pins the layer's style; unset, the planner
    chooses among the styles its kind allows (:attr:`styles`)."""

    name: Name
    kind: Literal["linear", "unclassified"] = "linear"
    in_features: int | None = Field(default=None, gt=0, le=MAX_FEATURES, description="linear; at most 2^20")
    out_features: int | None = Field(default=None, gt=0, le=MAX_FEATURES, description="linear; at most 2^20")
    param_count: int | None = Field(
        default=None, ge=0, le=MAX_MODEL_BYTES, description="unclassified: the parameters it holds (0: compute only)"
    )
    activation_bytes_per_sample: int | None = Field(
        default=None,
        ge=0,
        le=MAX_STEP_BYTES,
        description="bytes of the layer's input and output per sample: required for an unclassified layer; a linear "
        "layer's defaults to (in + out) · dtype bytes (one row in, one out), more when it runs on every token",
    )
    dtype: Dtype = Dtype.fp32
    bias: bool = True
    optimizer: Optimizer = Optimizer.adam
    flops_per_sample: int | None = Field(
        default=None,
        ge=0,
        le=MAX_FLOPS_PER_SAMPLE,
        description="forward FLOPs per sample when measured (describe()); else 2·in·out; required for an "
        "unclassified layer; at most 1e15",
    )
    style: DenseStyle | None = Field(
        default=None, description="pin the layer's style; unset: the planner chooses among those its kind allows"
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> DenseLayerSpec:
        linear = ("in_features", "out_features")
        costed = ("param_count", "activation_bytes_per_sample", "flops_per_sample")
        if self.kind == "linear":
            missing = [f for f in linear if getattr(self, f) is None]
            extra = [f for f in costed[:1] if getattr(self, f) is not None]
        else:
            missing = [f for f in costed if getattr(self, f) is None]
            extra = [f for f in linear if getattr(self, f) is not None]
        article = "a linear" if self.kind == "linear" else "an unclassified"
        if missing:
            raise ValueError(f"{article} layer needs {' and '.join(missing)}")
        if extra:
            raise ValueError(f"{article} layer has no {' or '.join(extra)}")
        if self.style is not None and self.style not in self.kind_styles:
            raise ValueError(
                f"style {self.style.value} needs a linear layer; an unclassified one runs replicate or fsdp"
            )
        return self

    @property
    def kind_styles(self) -> tuple[DenseStyle, ...]:
        """Every style the layer's kind allows: all for a linear layer, replicate and fsdp otherwise."""
        return tuple(DenseStyle) if self.kind == "linear" else (DenseStyle.replicate, DenseStyle.fsdp)

    @property
    def styles(self) -> tuple[DenseStyle, ...]:
        """The styles a plan may give this layer: the pinned one, else every style its kind allows."""
        return (self.style,) if self.style is not None else self.kind_styles

    @property
    def num_params(self) -> int:
        if self.kind == "unclassified":
            return self.param_count or 0
        i, o = self._dims()
        return i * o + (o if self.bias else 0)

    @property
    def activation_bytes(self) -> int:
        """Bytes of the layer's input and output for one sample."""
        if self.activation_bytes_per_sample is not None:
            return self.activation_bytes_per_sample
        i, o = self._dims()
        return (i + o) * self.dtype.nbytes

    @property
    def forward_flops_per_sample(self) -> int:
        if self.flops_per_sample is not None:
            return self.flops_per_sample
        i, o = self._dims()
        return 2 * i * o

    def _dims(self) -> tuple[int, int]:
        """A linear layer's (in_features, out_features); :meth:`_kind_fields` made sure it has both."""
        return self.in_features or 0, self.out_features or 0


#: the keys that say a document is a model (a fleet has none of them)
_MODEL_KEYS: Final = frozenset({"batch_size_per_gpu", "embedding_tables", "dense_layers"})


class ModelSpec(_Frozen):
    schema_version: Literal[1] = SCHEMA_VERSION
    name: Name
    batch_size_per_gpu: int = Field(gt=0, le=MAX_BATCH, description="samples per GPU per step; at most 1e9")
    # FailFast: a list's validation stops at its first bad item, so that 600,000 bad tables in an 8 MB body cost
    # one error, not millions (every error the service reports is named all the same)
    embedding_tables: Annotated[list[EmbeddingTableSpec], FailFast()] = Field(default_factory=list)
    dense_layers: Annotated[list[DenseLayerSpec], FailFast()] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _not_a_fleet(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "hosts" in data and not _MODEL_KEYS & data.keys():
            raise PydanticCustomError(
                "fleet_not_model",
                "this is a fleet (it has hosts), not a model: a model has batch_size_per_gpu and embedding_tables",
            )
        return data

    @model_validator(mode="after")
    def _names_unique(self) -> ModelSpec:
        if not self.embedding_tables and not self.dense_layers:
            raise ValueError("a model needs at least one embedding table or dense layer")
        for field, items in (
            ("embedding_tables", self.embedding_tables),
            ("dense_layers", self.dense_layers),
        ):
            seen: set[str] = set()
            for item in items:
                if item.name in seen:
                    raise ValueError(f"{field}: duplicate name {item.name!r}")
                seen.add(item.name)
        total = sum(t.weight_bytes for t in self.embedding_tables)
        total += sum(d.num_params * d.dtype.nbytes for d in self.dense_layers)
        if total > MAX_MODEL_BYTES:
            raise ValueError(
                f"the model's weights come to {total:.3g} bytes; at most {MAX_MODEL_BYTES:.0e} are planned"
            )
        step = sum(
            self.batch_size_per_gpu * t.num_features * max(t.pooling_factor, 1.0) * (8 * t.embedding_dim + 64)
            for t in self.embedding_tables
        )
        if step > MAX_STEP_BYTES:
            raise ValueError(
                f"the model's lookups move {step:.3g} bytes per GPU per step (batch × features × pooling factor × "
                f"(8 · dim + 64), summed over tables); at most {MAX_STEP_BYTES:.0e} are planned"
            )
        acts = self.batch_size_per_gpu * sum(d.activation_bytes for d in self.dense_layers)
        if acts > MAX_STEP_BYTES:
            raise ValueError(
                f"the dense layers' activations come to {acts:.3g} bytes per GPU per step (batch × activation bytes "
                f"per sample, summed over layers); at most {MAX_STEP_BYTES:.0e} are planned"
            )
        return self

    def table(self, name: str) -> EmbeddingTableSpec:
        for t in self.embedding_tables:
            if t.name == name:
                return t
        raise KeyError(name)


# --------------------------------------------------------------------------------------------------- the fleet


def _known_profiles(info: ValidationInfo) -> Mapping[str, HardwareProfile]:
    """Profiles a name may refer to: the catalogue, plus custom ones passed as validation context."""
    extra: Mapping[str, HardwareProfile] = {}
    if isinstance(info.context, Mapping):
        extra = info.context.get("profiles", {}) or {}
    return {**catalogue(), **extra}


class HostGroupSpec(_Frozen):
    """``count`` identical hosts, each with ``gpus_per_host`` GPUs of one kind."""

    gpu: str | HardwareProfile = Field(description="catalogue name, or an inline profile")
    count: int = Field(default=1, gt=0, le=MAX_HOSTS, description="hosts; at most 100000")
    gpus_per_host: int = Field(default=8, gt=0, le=MAX_GPUS_PER_HOST, description="at most 1024")
    host_memory_bytes: int | None = Field(
        default=None, gt=0, le=MAX_MEMORY_BYTES, description="per host; profile default if unset; at most 1e15"
    )
    names: list[Name] | None = Field(
        default=None,
        exclude_if=lambda v: v is None,  # unnamed hosts dump (and hash) as before names existed
        description="the hosts' names, one per host (unique in the fleet): a re-plan keeps a named host's shards "
        "where the new fleet names the same host; unnamed, a group's hosts match by position",
    )

    @model_validator(mode="after")
    def _one_name_a_host(self) -> HostGroupSpec:
        if self.names is not None and len(self.names) != self.count:
            raise ValueError(f"names: {len(self.names)} names for {self.count} hosts (one name a host)")
        return self

    @field_validator("gpu", mode="before")
    @classmethod
    def _known_gpu(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            known = _known_profiles(info)
            if value not in known:
                shown = repr(value) if len(value) <= 80 else f"{value[:80]!r}… ({len(value)} characters)"
                raise ValueError(f"unknown GPU profile {shown}; known: {', '.join(sorted(known))}")
        return value

    @property
    def gpu_name(self) -> str:
        return self.gpu if isinstance(self.gpu, str) else self.gpu.name


class FleetSpec(_Frozen):
    schema_version: Literal[1] = SCHEMA_VERSION
    name: Name
    hosts: list[HostGroupSpec] = Field(min_length=1, max_length=MAX_HOST_GROUPS)
    hbm_reserve_fraction: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        exclude_if=lambda v: v is None,  # unset: each GPU type keeps back its profile's absolute reserve
        description="the share of each GPU's HBM kept back for what a plan does not place (the runtime's context, "
        "buffers, allocator slack), on every GPU type hbm_reserve_bytes does not name. Unset (the default): each "
        "GPU type keeps back its profile's runtime_reserve_bytes, an absolute figure (the catalogue's, or a "
        f"calibration's), and a profile without one {DEFAULT_RESERVE_FRACTION:.0%}",
    )
    hbm_reserve_bytes: dict[Name, Annotated[int, Field(ge=0, le=MAX_MEMORY_BYTES)]] | None = Field(
        default=None,
        max_length=MAX_HOST_GROUPS,
        exclude_if=lambda v: v is None,  # unset, a fleet dumps (and hashes) as before the field existed
        description="per GPU type (its profile name), the bytes of HBM kept back on each GPU of that type: an "
        "absolute figure, the same on a 141 GB and a 288 GB part, where a fraction would keep back 14 and 29 GB. "
        "Before hbm_reserve_fraction and the profile's runtime_reserve_bytes",
    )

    @model_validator(mode="after")
    def _reserves_name_the_fleets_gpus(self) -> FleetSpec:
        if self.hbm_reserve_bytes is None:
            return self
        gpus = {g.gpu if isinstance(g.gpu, str) else g.gpu.name for g in self.hosts}
        unknown = sorted(set(self.hbm_reserve_bytes) - gpus)
        if unknown:
            raise ValueError(
                f"hbm_reserve_bytes names GPU type(s) the fleet has no host of: {', '.join(unknown)} "
                f"(its types: {', '.join(sorted(gpus))})"
            )
        return self

    @model_validator(mode="after")
    def _hosts_named_once(self) -> FleetSpec:
        seen: set[str] = set()
        for group in self.hosts:
            for name in group.names or ():
                if name in seen:
                    raise ValueError(f"host {name!r} is named twice in the fleet")
                seen.add(name)
        return self

    @model_validator(mode="before")
    @classmethod
    def _not_a_model(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "hosts" not in data and _MODEL_KEYS & data.keys():
            raise PydanticCustomError(
                "model_not_fleet",
                "this is a model (it has batch_size_per_gpu or embedding_tables), not a fleet: a fleet has hosts, a "
                "list of {gpu, count, gpus_per_host}",
            )
        return data

    @property
    def world_size(self) -> int:
        return sum(g.count * g.gpus_per_host for g in self.hosts)

    @property
    def num_hosts(self) -> int:
        return sum(g.count for g in self.hosts)


# --------------------------------------------------------------------------------------------------- the plan


#: a plan's status in words, for the CLI, the pages and the docs alike (:func:`verdict_words`)
VERDICTS: Final = ("optimal", "optimal among the layouts searched", "best found", "infeasible")


def verdict_words(status: PlanStatus, searched_optimal: bool) -> str:
    """:attr:`Plan.verdict` from a status and the solver's ``searched_optimal`` flag (one of :data:`VERDICTS`)."""
    if status is PlanStatus.infeasible:
        return "infeasible"
    if status is PlanStatus.optimal:
        return "optimal"
    return "optimal among the layouts searched" if searched_optimal else "best found"


class RankTime(_Frozen):
    """A rank's predicted step: device compute, communication, and the host's time (the floor to enqueue a step,
    plus the CPU lookups of ``host`` shards, which are in ``compute`` too); ``total`` is ``max(compute + comm,
    host)`` (the device cannot run ahead of the host that enqueues its work)."""

    compute: Ms = 0.0
    comm: Ms = 0.0
    host: Ms = 0.0
    total: Ms = 0.0


class HbmBreakdown(_Frozen):
    """Where a rank's HBM goes (bytes)."""

    weights: NonNegInt = 0
    optimizer: NonNegInt = 0
    gradients: NonNegInt = 0
    buffers: NonNegInt = 0
    cache: NonNegInt = 0
    dense: NonNegInt = 0


class RankPlan(_Frozen):
    rank: NonNegInt
    host: NonNegInt
    gpu: str
    hbm_capacity_bytes: NonNegInt
    hbm_used_bytes: NonNegInt
    host_memory_used_bytes: NonNegInt = 0
    hbm_breakdown: HbmBreakdown = HbmBreakdown()
    predicted_ms: RankTime = RankTime()


class ShardPlan(_Frozen):
    rank: NonNegInt
    row_offset: NonNegInt
    num_rows: PositiveInt
    col_offset: NonNegInt
    num_cols: PositiveInt
    placement: Placement = Placement.hbm
    cache_fraction: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)

    @model_validator(mode="after")
    def _cache_fraction_only_for_cache(self) -> ShardPlan:
        if self.placement is Placement.uvm_cache and self.cache_fraction is None:
            raise ValueError("placement uvm_cache needs a cache_fraction")
        if self.placement is not Placement.uvm_cache and self.cache_fraction is not None:
            raise ValueError(f"cache_fraction is only for uvm_cache, not {self.placement.value}")
        return self


class TablePlan(_Frozen):
    name: Name
    sharding_type: ShardingType
    shards: list[ShardPlan] = Field(min_length=1)

    def layout_problems(
        self, rows: int, cols: int, world_size: int, host_of: Callable[[int], int], ranks_in: str = "the fleet"
    ) -> list[str]:
        """What is wrong with how the shards lay out a ``rows`` × ``cols`` table on ranks ``0..world_size-1``
        (empty = nothing): ranks out of range, shards out of bounds, overlaps and gaps (the shards must tile the table
        exactly once; data_parallel: full copies in HBM on distinct ranks), and the sharding type's shape (table_wise
        one shard, column_wise every row, row_wise / table_row_wise every column, table_row_wise inside one host,
        grid_shard column bands each inside one host). The one check of a plan's geometry, for the solver's validator
        and the executor."""
        out: list[str] = []
        where = f"table {self.name}"
        for i, s in enumerate(self.shards):
            if s.rank >= world_size:
                out.append(f"{where}: shard {i} on rank {s.rank}, but {ranks_in} has {world_size} ranks")
            if s.row_offset + s.num_rows > rows or s.col_offset + s.num_cols > cols:
                out.append(
                    f"{where}: shard {i} rows {s.row_offset}..{s.row_offset + s.num_rows} × cols "
                    f"{s.col_offset}..{s.col_offset + s.num_cols} is out of bounds ({rows} × {cols})"
                )
        if out:
            return out
        st = self.sharding_type
        if st is ShardingType.data_parallel:
            for i, s in enumerate(self.shards):
                if (s.row_offset, s.num_rows, s.col_offset, s.num_cols) != (0, rows, 0, cols):
                    out.append(f"{where}: data_parallel shard {i} is not a full copy")
                if s.placement is not Placement.hbm:
                    out.append(f"{where}: data_parallel copies live in HBM, shard {i} is {s.placement.value}")
            ranks = [s.rank for s in self.shards]
            if len(set(ranks)) != len(ranks):
                out.append(f"{where}: data_parallel lists a rank twice")
            return out
        area = sum(s.num_rows * s.num_cols for s in self.shards)  # column bands, each tiled by row blocks once
        if area != rows * cols:
            out.append(
                f"{where}: shards cover {area} cells of {rows * cols} ({'overlap' if area > rows * cols else 'gap'})"
            )
        cuts = sorted(
            {0, cols, *[s.col_offset for s in self.shards], *[s.col_offset + s.num_cols for s in self.shards]}
        )
        for lo, hi in pairwise(cuts):
            spans = sorted(
                (s.row_offset, s.row_offset + s.num_rows)
                for s in self.shards
                if s.col_offset <= lo and s.col_offset + s.num_cols >= hi
            )
            pos = 0
            for a, b in spans:
                if a < pos:
                    out.append(f"{where}: shards overlap at rows {a}..{min(b, pos)}, cols {lo}..{hi}")
                    break
                if a > pos:
                    out.append(f"{where}: rows {pos}..{a} of cols {lo}..{hi} belong to no shard (gap)")
                    break
                pos = b
            else:
                if pos != rows:
                    out.append(f"{where}: rows {pos}..{rows} of cols {lo}..{hi} belong to no shard (gap)")
        if st is ShardingType.table_wise and len(self.shards) != 1:
            out.append(f"{where}: table_wise needs exactly one shard, got {len(self.shards)}")
        if st is ShardingType.column_wise and any(s.num_rows != rows for s in self.shards):
            out.append(f"{where}: column_wise shards must hold every row")
        if st in (ShardingType.row_wise, ShardingType.table_row_wise) and any(s.num_cols != cols for s in self.shards):
            out.append(f"{where}: {st.value} shards must hold every column")
        if st is ShardingType.table_row_wise and len({host_of(s.rank) for s in self.shards}) > 1:
            out.append(f"{where}: table_row_wise shards must stay inside one host")
        if st is ShardingType.grid_shard:
            out.extend(self._grid_problems(host_of))
        return out

    def bands(self) -> dict[tuple[int, int], list[ShardPlan]]:
        """The shards by column band, keyed ``(col_offset, num_cols)`` in column order, each band's shards in the
        plan's order (a grid_shard table's bands; one band for row_wise and table_row_wise)."""
        out: dict[tuple[int, int], list[ShardPlan]] = {}
        for s in self.shards:
            out.setdefault((s.col_offset, s.num_cols), []).append(s)
        return dict(sorted(out.items()))

    def _grid_problems(self, host_of: Callable[[int], int]) -> list[str]:
        """A grid_shard table's bands: shards of one column range each (no band cut again by columns), each band's
        row blocks inside one host, at least two bands or the table_row_wise it would be."""
        where = f"table {self.name}"
        bands = self.bands()
        edges = list(bands)
        out: list[str] = []
        if any(a[0] + a[1] > b[0] for a, b in pairwise(edges)):
            out.append(f"{where}: grid_shard bands must not cut each other's columns (bands {edges})")
        if len(bands) < 2:
            out.append(f"{where}: grid_shard needs at least two column bands (one band is table_row_wise)")
        for (c0, nc), shards in bands.items():
            hosts = {host_of(s.rank) for s in shards}
            if len(hosts) > 1:
                out.append(f"{where}: grid_shard band of cols {c0}..{c0 + nc} spans hosts {sorted(hosts)}, not one")
        return out


class GemmPhase(StrEnum):
    """The three GEMMs of a linear layer's training step (``Y = X·Wᵀ``): ``forward`` (M = rows, N = out, K = in),
    ``input_grad`` (``dX = dY·W``: M = rows, N = in, K = out) and ``weight_grad`` (``dW = dYᵀ·X``: M = out, N = in,
    K = rows); rows are the samples (times the tokens per sample) a rank runs."""

    forward = "forward"
    input_grad = "input_grad"
    weight_grad = "weight_grad"


class KernelConfig(_Frozen):
    """One configuration of shardwise's Triton matmul: the output tile (``block_m`` × ``block_n``), the K step
    (``block_k``), the tile order (``group_m`` tile rows swept together, for L2 reuse), ``num_warps`` per program,
    ``num_stages`` of software pipelining and ``split_k`` (K cut into that many partial sums, added at the end)."""

    block_m: int = Field(ge=16, le=256)
    block_n: int = Field(ge=16, le=256)
    block_k: int = Field(ge=16, le=256)
    group_m: int = Field(default=8, ge=1, le=64)
    num_warps: int = Field(default=4, ge=1, le=16)
    num_stages: int = Field(default=3, ge=1, le=8)
    split_k: int = Field(default=1, ge=1, le=64)

    @field_validator("block_m", "block_n", "block_k", "num_warps")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError("must be a power of two")
        return v

    @property
    def label(self) -> str:
        """``128x128x64 w8 s3 g8 sk1``: tile M×N×K, warps, stages, group size, split-K."""
        return (
            f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages} g{self.group_m} "
            f"sk{self.split_k}"
        )


class KernelLibrary(StrEnum):
    """Which kernel runs a GEMM: ``triton`` — shardwise's Triton matmul with the choice's ``config``; ``vendor`` —
    the GPU vendor's GEMM library through ``torch.matmul`` (cuBLAS / cuBLASLt on NVIDIA, hipBLASLt on AMD), which
    is what an ``nn.Linear`` runs without shardwise."""

    triton = "triton"
    vendor = "vendor"


class KernelChoice(_Frozen):
    """The kernel shardwise's kernel model chose for one GEMM of a dense layer on one GPU type, and its predicted
    time (a model figure, from first principles: no timing run chose it). ``config`` is the best configuration of
    the Triton matmul whichever kernel runs; ``kernel`` says which does, ``predicted_us`` is its time, and
    ``triton_us`` / ``vendor_us`` the predicted times of both candidates (absent in plans from before the vendor was
    a candidate, whose choices are all ``triton``)."""

    gpu: str = Field(min_length=1, max_length=200, description="the profile the choice is for")
    phase: GemmPhase
    m: PositiveInt
    n: PositiveInt
    k: PositiveInt
    dtype: Dtype
    config: KernelConfig
    predicted_us: float = Field(ge=0, allow_inf_nan=False)
    kernel: KernelLibrary = Field(default=KernelLibrary.triton, description="the kernel that runs the GEMM")
    triton_us: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="predicted µs of config")
    vendor_us: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="predicted µs of the vendor GEMM (torch.matmul)"
    )


class DensePlan(_Frozen):
    name: Name
    style: DenseStyle
    ranks: list[NonNegInt] = Field(min_length=1)
    kernels: list[KernelChoice] = Field(
        default_factory=list,
        max_length=3 * MAX_HOST_GROUPS,
        description="a linear layer's kernel per GPU type and phase (empty: an unclassified layer, a plan from "
        "before this field, or a layout priced with the flat GEMM fraction)",
    )


class SparseSync(StrEnum):
    """How the replicas of 2D sparse parallelism keep their embedding weights equal: ``allreduce_rows`` — every
    step, the gradients of the rows any replica touched are all-reduced across the replicas before the update (the
    same result as one model-parallel plan over the whole fleet); ``average_weights`` — every ``every_k_steps``
    steps the replicas' weights (and optimizer state) are averaged, drifting apart in between."""

    allreduce_rows = "allreduce_rows"
    average_weights = "average_weights"


class SparseGroups(_Frozen):
    """2D sparse parallelism: the fleet split into ``R`` replica groups of ``G`` ranks each. The embedding tables
    are sharded inside every group the same way — the ``j``-th rank of each group holds the same shards — so every
    group holds every table exactly once, and the ranks at position ``j`` form a replica set kept in sync by
    ``sync``. The pooled-embedding exchanges stay inside a group; dense layers are unchanged (over the fleet)."""

    groups: list[list[NonNegInt]] = Field(min_length=1, description="R groups of G ranks, disjoint, covering the fleet")
    sync: SparseSync = SparseSync.allreduce_rows
    every_k_steps: PositiveInt = Field(
        default=1, le=1_000_000, description="average_weights: steps between averages; allreduce_rows: 1"
    )

    @model_validator(mode="after")
    def _shape(self) -> SparseGroups:
        sizes = {len(g) for g in self.groups}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError("every group needs the same number of ranks (at least one)")
        flat = [r for g in self.groups for r in g]
        if len(set(flat)) != len(flat):
            raise ValueError("a rank is in two groups, or twice in one")
        if self.sync is SparseSync.allreduce_rows and self.every_k_steps != 1:
            raise ValueError("allreduce_rows syncs every step: every_k_steps must be 1")
        return self

    @property
    def group_size(self) -> int:
        return len(self.groups[0])

    @property
    def num_groups(self) -> int:
        return len(self.groups)


class SolveParams(_Frozen):
    """Solve options, stored with every plan (same input + same params → the same plan)."""

    solver: Literal["cpsat", "greedy"] = "cpsat"
    time_limit_s: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    max_deterministic_time: float | None = Field(
        default=None, gt=0, le=MAX_DETERMINISTIC_TIME, allow_inf_nan=False, description="CP-SAT's; at most 1e6"
    )
    num_workers: int = Field(default=2, ge=1, le=64)
    random_seed: int = Field(default=0, ge=0, le=2**31 - 1)
    interleave_search: bool = True
    relative_gap_limit: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False)
    executor: Executor = Field(
        default=Executor.shardwise,
        description="the engine that will run the plan: shardwise (shardwise's executor) or torchrec (TorchRec's "
        "DistributedModelParallel on FBGEMM's kernels); the plan is priced for it and laid out only as it can run",
    )
    graphed_steps: bool = Field(
        default=False,
        description="shardwise's executor with each training step captured once as a CUDA graph and replayed "
        "(GraphedStep): priced with the graphed executor profile, whose host floor is device time that adds to the "
        "step; false: steps enqueued from Python (apply_plan's default). Not for torchrec",
    )
    sparse_2d: bool = Field(
        default=True,
        description="consider 2D sparse parallelism (tables sharded inside replica groups of whole hosts) on a "
        "multi-host fleet; false: 1D plans only, every table sharded over the whole fleet",
    )
    allow_weight_averaging: bool = Field(
        default=False,
        description="let a 2D plan keep its replicas in sync by averaging their weights every k steps "
        "(average_weights, TorchRec's DMPCollection), which trains another model than a 1D plan; without it a 2D "
        "plan all-reduces the touched rows' gradients every step (allreduce_rows, shardwise's executor only)",
    )

    @model_validator(mode="after")
    def _graphed_is_shardwise(self) -> SolveParams:
        if self.graphed_steps and self.executor is Executor.torchrec:
            raise ValueError(
                "graphed_steps prices shardwise's executor replaying CUDA graphs; TorchRec's steps are not graphed: "
                "drop graphed_steps or plan for executor shardwise"
            )
        return self

    def key_dump(self) -> dict[str, Any]:
        """The options as the request key hashes them: every field, except a field added after the key was first
        specified (:data:`ADDED_OPTIONS`) while it holds its default — so a request that does not use it keeps the
        key it always had."""
        data = self.model_dump(mode="json")
        for name in ADDED_OPTIONS:
            if getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name)
        return data


#: solve options added after the request key was specified: hashed only when set away from their default
ADDED_OPTIONS: Final = ("executor", "sparse_2d", "allow_weight_averaging", "graphed_steps")


class ProgressPoint(_Frozen):
    """One report of a solve in progress: ``t_s`` seconds after the job started solving, the best plan's predicted
    step so far (None before there is one) and the bound over every plan."""

    t_s: float = Field(ge=0, allow_inf_nan=False)
    best_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    bound_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class SolverInfo(_Frozen):
    """Who made the layout (``name``, ``params``, ``seconds``) and what its solver reported (``status``)."""

    name: str = "greedy"
    version: str = ""
    status: Literal["OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "MODEL_INVALID", "HEURISTIC"] = Field(
        default="HEURISTIC",
        description="what the solver reported, not the plan's status: CP-SAT's OPTIMAL, FEASIBLE, INFEASIBLE, "
        "UNKNOWN or MODEL_INVALID; HEURISTIC where no solver's verdict stands behind the plan (the greedy planner, "
        "TorchRec's planner, a layout priced as given: evaluated, ported, or kept from a direct port). Older "
        "documents may say FEASIBLE for a layout priced as given, INFEASIBLE where the greedy planner found none.",
    )
    seconds: float = Field(default=0.0, ge=0)
    gap: float | None = Field(
        default=None, ge=0, description="(step − bound_ms) / step: how far the plan may be from any plan at most"
    )
    objective_ms: float | None = None
    bound_ms: float | None = Field(
        default=None, description="the plan's lower_bound_ms: no plan over the whole candidate catalogue beats it"
    )
    searched_bound_ms: float | None = Field(
        default=None,
        ge=0,
        description="what the search proved over the layouts it searched (CP-SAT's model: a pruned candidate space): "
        "no layout among them beats it. At least bound_ms; not a bound on every plan. None where no search proved "
        "one (the greedy planner, a plan priced as given, documents from before this field).",
    )
    searched_gap: float | None = Field(
        default=None, ge=0, description="(step − searched_bound_ms) / step: the gap over the layouts searched"
    )
    searched_optimal: bool = Field(
        default=False,
        description="the plan meets searched_bound_ms: optimal among the layouts searched. The plan's status is "
        "optimal only when it also meets bound_ms (every plan); otherwise it is feasible with this flag set.",
    )
    params: SolveParams = SolveParams()
    versions: dict[str, str] = Field(default_factory=dict)
    phase: str | None = Field(
        default=None,
        description="the phase of the solve that found the returned layout: greedy, target packing, CP-SAT (rank "
        "mode), CP-SAT level one then level two and the LNS (host mode), ...; None in documents from before this "
        "field and for layouts priced as given",
    )
    progress: list[ProgressPoint] = Field(
        default_factory=list,
        max_length=MAX_PROGRESS_POINTS,
        description="the solve's best and bound as they improved, as the job that made the plan recorded them "
        "(empty for a plan made outside a job, or before this field)",
    )


class Plan(_Frozen):
    schema_version: Literal[1] = SCHEMA_VERSION
    id: str = ""
    request_hash: str = ""
    model: str = ""
    fleet: str = ""
    status: PlanStatus
    predicted_step_ms: Ms | None = None
    lower_bound_ms: Ms | None = Field(
        default=None,
        description="no plan over the whole candidate catalogue (every sharding, shard shape and placement shardwise "
        "considers, on any ranks) has a lower predicted step time; what a search proved over the layouts it looked at "
        "is solver.searched_bound_ms",
    )
    ranks: list[RankPlan] = Field(default_factory=list)
    tables: list[TablePlan] = Field(default_factory=list)
    dense: list[DensePlan] = Field(default_factory=list)
    solver: SolverInfo = SolverInfo()
    explanation: list[str] = Field(default_factory=list)
    calibrations: list[str] = Field(
        default_factory=list, description="the calibrations the fleet's profiles were priced with (empty: catalogue)"
    )
    sparse_groups: SparseGroups | None = Field(
        default=None,
        description="2D sparse parallelism: the replica groups the tables are sharded inside and how the replicas "
        "stay in sync (None: one group, the whole fleet)",
    )
    executor: Executor = Field(
        default=Executor.shardwise,
        description="the engine the plan's figures price: its step, memory and bound are what that engine does "
        "with the layout (a plan's request names the engine; evaluate may price a layout for the other one)",
    )

    @model_validator(mode="after")
    def _bound_below_objective(self) -> Plan:
        if self.status is not PlanStatus.infeasible and self.predicted_step_ms is None:
            raise ValueError("a feasible plan needs predicted_step_ms")
        if (
            self.predicted_step_ms is not None
            and self.lower_bound_ms is not None
            and self.lower_bound_ms > self.predicted_step_ms * (1 + 1e-9) + 1e-9
        ):
            raise ValueError("lower_bound_ms exceeds predicted_step_ms")
        searched = self.solver.searched_bound_ms
        if (
            self.predicted_step_ms is not None
            and searched is not None
            and searched > self.predicted_step_ms * (1 + 1e-9) + 1e-9
        ):
            raise ValueError("solver.searched_bound_ms exceeds predicted_step_ms")
        return self

    @property
    def executor_profile(self) -> str:
        """The executor profile that priced the plan's host terms wherever no calibration set them (the engine's:
        ``shardwise-eager``, ``shardwise-graphed`` with ``graphed_steps``, or ``torchrec``)."""
        if self.executor is Executor.torchrec:
            return "torchrec"
        return "shardwise-graphed" if self.solver.params.graphed_steps else "shardwise-eager"

    @property
    def verdict(self) -> str:
        """The plan's status in the words the CLI, the pages and the docs use: ``optimal`` (it meets the bound no
        plan over the whole candidate catalogue can beat), ``optimal among the layouts searched`` (the search
        proved it over the pruned space it looked at, not over every plan), ``best found`` (feasible, nothing
        proved) or ``infeasible``."""
        return verdict_words(self.status, self.solver.searched_optimal)

    @property
    def verdict_detail(self) -> str:
        """What stands behind :attr:`verdict`: ``no plan beats B ms`` for an optimal plan, ``at most X % from any
        plan (bound B ms)`` for any other with a bound; empty when there is no bound (or no layout)."""
        bound, step = self.lower_bound_ms, self.predicted_step_ms
        if self.status is PlanStatus.infeasible or bound is None or step is None:
            return ""
        if self.status is PlanStatus.optimal:
            return f"no plan beats {bound:.3f} ms"
        gap = self.solver.gap if self.solver.gap is not None else ((step - bound) / step if step > 0 else 0.0)
        return f"at most {gap:.1%} from any plan (bound {bound:.3f} ms)"

    def table(self, name: str) -> TablePlan:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)
