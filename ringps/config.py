"""The one config tree, validated once before any process starts.

Each component reads its own section (`cfg.data`, `cfg.train`, `cfg.compress`, ...). Every leaf
has a globally unique name, so the CLI flag is simply `--name-with-dashes` and a YAML file may be
written nested by section or flat (`epochs: 3` or `train: {epochs: 3}`). `load_config` merges
defaults <- YAML <- flags and turns the first validation error into one line such as
`--density 1.5: must be <= 1`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ringps.errors import ConfigError

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|m|g)?bit\s*$", re.IGNORECASE)
_RATE_UNIT = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(text: str) -> float:
    """'100mbit' -> 1e8 bits per second. Raises ValueError with the accepted forms."""
    m = _RATE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a rate; write e.g. 100mbit, 1gbit, 500kbit")
    unit = m.group(2).lower() if m.group(2) else None
    bits = float(m.group(1)) * _RATE_UNIT[unit]
    if bits <= 0:
        raise ValueError(f"{text!r}: a rate must be positive")
    return bits


def host_rates(spec: str, hosts: int, option: str = "--bandwidth") -> list[float]:
    """'1gbit' or '1gbit,100mbit,...' -> one rate (bits/s) per host; ConfigError naming `option`."""
    try:
        rates = [parse_rate(r) for r in spec.split(",")]
    except ValueError as e:
        raise ConfigError(f"{option} {spec}: {e}") from None
    rates = rates * hosts if len(rates) == 1 else rates
    if len(rates) != hosts:
        raise ConfigError(f"{option} {spec}: {len(rates)} rates for {hosts} hosts; give one, or one per host")
    return rates


def _split_list(value: Any) -> Any:
    """Flags give lists as '1,1,2,4'; YAML gives real lists. Accept both."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _when_given(check):
    """A field validator that runs `check(value)` (which raises ValueError) unless the value is None."""

    def run(cls, v):
        if v is not None:
            check(v)
        return v

    return classmethod(run)


def _step_range(v: str) -> None:
    a, sep, b = v.partition(":")
    if not (sep and a.isdigit() and b.isdigit() and 1 <= int(a) <= int(b)):
        raise ValueError("write A:B, whole steps with 1 <= A <= B")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    """Processes, placement and the run folder (read by `launch`)."""

    workers: int = Field(4, ge=1, le=256, description="worker processes")
    servers: int = Field(1, ge=1, le=64, description="parameter-server ranks (ps-* strategies only)")
    threads: int = Field(1, ge=1, le=64, description="intra-op threads per process")
    malloc_keep_mb: int = Field(256, ge=0, le=1 << 16, description="glibc: freed memory each process keeps for reuse, "
                                "instead of faulting it back every step (ringps/malloc.py); 0: glibc's defaults")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="auto: nccl with CUDA, else gloo (gloo for ps-* strategies, on the CPU)")
    timeout: float = Field(120.0, gt=0, description="seconds any wait on another process may take")
    seed: int = Field(0, ge=0, description="seed for data order, init and selection")
    name: Optional[str] = Field(None, description="run name (default: STRATEGY-TIMESTAMP)")
    out: Optional[str] = Field(None, description="run folder (default runs/NAME)")
    net: Optional[str] = Field(
        None,
        description="emulated links: one rate for all hosts (1gbit, 100mbit) or one per host, "
        "comma-separated; needs root and iproute2. Rate only: this kernel has no netem",
    )
    slowdown: Optional[list[float]] = Field(
        None, description="per-worker compute stretch, e.g. 1,1,2,4 (worker i sleeps (f-1)x its compute)"
    )
    progress: bool = Field(True, description="show a progress bar")
    trace: bool = Field(True, description="write a timeline trace per rank, trace/rank-R.json (Chrome trace format: "
                        "Perfetto, HTA); its cost is measured in docs/RESULTS.md")
    profile_steps: Optional[str] = Field(None, description="A:B: also capture torch.profiler for steps A to B "
                                         "(trace/profile-rank-R.json)")
    tensorboard: bool = Field(False, description="write TensorBoard event files to tb/ (needs the tensorboard package)")

    _split = field_validator("slowdown", mode="before")(_split_list)

    @field_validator("slowdown")
    @classmethod
    def _factors(cls, v: Optional[list[float]]) -> Optional[list[float]]:
        if v is not None and any(f < 1 for f in v):
            raise ValueError("every factor must be >= 1")
        return v

    _steps = field_validator("profile_steps")(_when_given(lambda v: _step_range(v)))
    _rates = field_validator("net")(_when_given(lambda v: [parse_rate(part) for part in v.split(",")]))

    def net_rates(self, hosts: int) -> list[float]:
        """Bits per second for each of `hosts` emulated hosts."""
        assert self.net is not None
        rates = [parse_rate(p) for p in self.net.split(",")]
        return rates * hosts if len(rates) == 1 else rates


class DataConfig(Section):
    """What each worker reads (read by `data`)."""

    dataset: str = Field("orl-faces", description="orl-faces, fashion-mnist, synthetic or folder:PATH")
    batch_size: int = Field(16, ge=1, le=65536, description="samples per worker per step")
    train_per_class: int = Field(7, ge=1, le=9, description="orl-faces: training images per person (rest held out)")
    augment: bool = Field(True, description="light augmentation (shift, flip) of orl-faces and folder images")
    synthetic_samples: int = Field(4096, ge=8, description="synthetic: training samples")
    synthetic_shape: list[int] = Field([1, 32, 32], description="synthetic: C,H,W of one sample")
    synthetic_classes: int = Field(10, ge=2, description="synthetic: classes")

    _split = field_validator("synthetic_shape", mode="before")(_split_list)

    @field_validator("synthetic_shape")
    @classmethod
    def _shape(cls, v: list[int]) -> list[int]:
        if len(v) != 3 or any(d < 1 for d in v):
            raise ValueError("must be three positive sizes C,H,W")
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        known = ("orl-faces", "fashion-mnist", "synthetic")
        if v not in known and not v.startswith("folder:"):
            raise ValueError(f"unknown dataset; known: {', '.join(known)}, folder:PATH")
        return v


class ModelConfig(Section):
    """The network (read by `models`)."""

    model: str = Field("facenet", description="facenet, resnet-small or mlp")


class TrainConfig(Section):
    """The loop every strategy shares (read by `train`)."""

    epochs: int = Field(40, ge=1, description="passes over the training split")
    steps: Optional[int] = Field(None, ge=1, description="stop after this many steps (overrides epochs)")
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="optimizer")
    lr: float = Field(0.01, gt=0, le=10, description="peak learning rate")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum")
    weight_decay: float = Field(5e-4, ge=0, description="L2 weight decay")
    lr_schedule: Literal["constant", "cosine", "step"] = Field("cosine", description="learning-rate schedule")
    warmup_epochs: float = Field(1.0, ge=0, description="linear learning-rate warm-up")
    eval_every: int = Field(0, ge=0, description="evaluate every N steps (0: every epoch)")
    target_accuracy: Optional[float] = Field(0.9, gt=0, le=1, description="held-out accuracy for time-to-accuracy")
    stop_at_target: bool = Field(False, description="stop once target accuracy is reached")
    checkpoint_every: int = Field(0, ge=0, description="save a checkpoint every N steps (0: never)")
    resume: Optional[str] = Field(None, description="checkpoint folder to resume from")


class StrategyConfig(Section):
    """Which strategy runs and its DDP-level options (read by `strategies`)."""

    strategy: str = Field("ring-topk", description="training strategy (see `ringps list`)")
    bucket_cap_mb: float = Field(25.0, gt=0, description="DDP bucket size in MB")
    powersgd_rank: int = Field(4, ge=1, description="powersgd: matrix approximation rank")
    powersgd_start_iter: int = Field(10, ge=2, description="powersgd: plain all-reduce for the first N steps")
    local_period: int = Field(8, ge=1, description="localsgd: steps between model averages; diloco: inner steps per outer step (H)")
    local_warmup_steps: int = Field(20, ge=0, description="localsgd: steps of global gradient all-reduce before local SGD starts")
    diloco_outer_lr: float = Field(0.7, gt=0, description="diloco: outer Nesterov SGD learning rate (the paper's 0.7)")
    diloco_outer_momentum: float = Field(0.9, ge=0, lt=1, description="diloco: outer momentum (the paper's 0.9)")
    auto_calibration: Optional[str] = Field(
        None, description="--strategy auto: this cluster's calibration file (ringps simulate --calibrate RUN... --out FILE): "
        "its compute, links and progress; default: the shipped profile's compute and 0.95 link efficiency")
    auto_resolution: float = Field(
        0.05, ge=0, lt=1, description="--strategy auto: candidates predicted within this fraction of the fastest are "
        "ties to the simulator (its held-out step time lies a median 5% from runs), and the plainest update among "
        "them is chosen (DDP's all-reduce, then 16 bits, low-rank, sparse, local steps, the parameter servers); 0: the fastest")
    layer_strategy: Literal["off", "auto"] = Field(
        "off", description="auto: per-layer methods, wait-free pushes, priority pulls (ps-async/threshold/stale-lr, ring-topk)")


class CompressConfig(Section):
    """Gradient selection with memory (read by ring-topk, topk-allgather and the layer planner)."""

    density: float = Field(0.01, gt=0, le=1, description="fraction of each large tensor sent per step")
    density_warmup_epochs: float = Field(2.0, ge=0, description="epochs to tighten density from 0.25 to --density")
    # names from the registries (`ringps list`), checked against them before anything starts
    selector: str = Field("auto", description="a registered selector (topk, threshold, randomk) or auto: sampled "
                          "threshold on large tensors, exact top-k on small ones")
    memory: str = Field("ef", description="a registered memory: ef (error feedback), dgc (momentum correction), none")
    exchange: str = Field("auto", description="a registered exchange (`ringps list`), or auto: the cost model's "
                          "choice per bucket")
    value_dtype: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="what selected values travel in (allgather, shared-index; sums stay fp32) and "
        "dense buckets (summed in 16 bits, as DDP's fp16 hook)")
    dense_below: int = Field(1 << 17, ge=0, description="tensors with fewer entries go dense, fused into one message")
    block: int = Field(256, ge=1, description="shared-index: entries per block")
    clip_norm: float = Field(0.0, ge=0, description="local gradient clipping (DGC); 0: off")
    memory_units: Literal["gradient", "update"] = Field(
        "gradient", description="ring-topk's memory: gradient: what it holds back is applied at the lr of the step "
        "that sends it; update: at the lr of the step that computed it (Stich et al. 2018's Mem-SGD; rescaled when the "
        "lr moves; no accuracy gain measured here, docs/RESULTS.md)")
    exact_tail: float = Field(
        0.4, ge=0, lt=1, description="ring-topk: the run's last fraction of steps, in which shared-index gives way "
        "to every rank's own top k (allgather, or whichever sparse exchange exchange=auto prices lowest among "
        "those as faithful): its common blocks carry less of each rank's gradient, and what the memory holds "
        "back leaves exactly before the run ends (0.4: after the target at 100 Mbit/s, docs/RESULTS.md). "
        "0: the exchange stays to the end")
    sparse_progress: Optional[float] = Field(
        None, gt=0, le=1, description="exchange auto: progress of a sparse step relative to a dense one, for every sparse "
        "exchange; default: each exchange's own, measured (shared-index 0.65, allgather and sparse-rs 0.88: "
        "docs/RESULTS.md). Sparse only where the step per unit of progress is shorter")


class PSConfig(Section):
    """Parameter servers and their staleness policies (read by the ps-* strategies)."""

    staleness_threshold: Optional[int] = Field(
        None, ge=0, description="T: threshold drops pushes more than T versions stale (default 2 x (workers - 1): "
        "keeps workers up to about 2x slower than the rest, docs/RESULTS.md); ssp's bound in pushes (default 4)")
    vsgd_sample: float = Field(0.01, gt=0, le=1, description="vsgd: fraction of each tensor's values sent along (at least 64)")
    vsgd_weight: str = Field("relative:2", description="vsgd: weight f(d) as NAME:SCALE, NAME in exp, inverse, linear, relative, none")
    vsgd_drop: Optional[float] = Field(None, gt=0, description="vsgd: drop a push whose relative value distance exceeds this")
    vsgd_scope: Literal["tensor", "push"] = Field(
        "tensor", description="vsgd: tensor: each tensor weighed by its own distance; push: one weight for the whole push "
        "(the median of its tensors' weights), which keeps the gradient's direction")
    async_momentum: Optional[float] = Field(
        None, ge=0, lt=1, description="the servers' momentum for asynchronous policies (every ps-* but ps-sync); "
        "default: max(0, 1 - workers x (1 - momentum)), 0.6 for 4 workers at --momentum 0.9, which offsets the "
        "momentum asynchrony adds (Mitliagkas et al. 2016; docs/RESULTS.md). ps-sync uses --momentum")
    dcasgd_lambda: float = Field(0.04, ge=0, description="dcasgd: delay-compensation strength")
    dcasgd_adaptive: bool = Field(
        False, description="dcasgd: DC-ASGD-a, strength lambda / sqrt(running mean of g*g) per entry (the paper uses "
        "lambda 2 with it); off: a constant lambda, as MXNet's DCASGD optimizer")
    ps_checkpoint_every: int = Field(0, ge=0, description="servers save a checkpoint every N versions (0: never)")

    @field_validator("vsgd_weight")
    @classmethod
    def _weight(cls, v: str) -> str:
        # the form here; the function's name is the VSGD policy's to check (before anything starts)
        name, _, scale = v.partition(":")
        try:
            ok = bool(name) and (not scale or float(scale) > 0)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError("write NAME:SCALE, SCALE a positive number (e.g. relative:2)")
        return v


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    run: RunConfig = RunConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    strategy: StrategyConfig = StrategyConfig()
    compress: CompressConfig = CompressConfig()
    ps: PSConfig = PSConfig()

    @model_validator(mode="after")
    def _cross(self) -> "Config":
        r = self.run
        if r.slowdown is not None and len(r.slowdown) != r.workers:
            raise ValueError(
                f"--slowdown has {len(r.slowdown)} factors for --workers {r.workers}; give one per worker"
            )
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# --------------------------------------------------------------------------------------------
# flat names <-> nested sections


def sections() -> dict[str, type[Section]]:
    return {name: f.annotation for name, f in Config.model_fields.items()}  # type: ignore[misc]


def leaf_index() -> dict[str, str]:
    """Leaf key -> section name. Leaf names are unique across sections (checked here)."""
    index: dict[str, str] = {}
    for sec, cls in sections().items():
        for leaf in cls.model_fields:
            assert leaf not in index, f"config key {leaf} appears in two sections"
            index[leaf] = sec
    return index


def flag(leaf: str) -> str:
    return "--" + leaf.replace("_", "-")


def nest(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{'epochs': 3, 'train': {'lr': 0.1}} -> {'train': {'epochs': 3, 'lr': 0.1}}."""
    index = leaf_index()
    out: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        key = key.replace("-", "_")
        if key in sections() and isinstance(value, dict):
            for k, v in value.items():
                k = k.replace("-", "_")
                if index.get(k) != key:
                    raise ConfigError(f"{key}.{k}: unknown option in section {key!r}")
                out.setdefault(key, {})[k] = v
        elif key in index:
            out.setdefault(index[key], {})[key] = value
        else:
            raise ConfigError(f"{flag(key)}: unknown option; `ringps train --help` lists them")
    return out


def _describe(err: dict[str, Any]) -> str:
    """pydantic error -> the rule, in words."""
    ctx = err.get("ctx") or {}
    kind = err["type"]
    rules = {
        "greater_than": "must be > {gt}",
        "greater_than_equal": "must be >= {ge}",
        "less_than": "must be < {lt}",
        "less_than_equal": "must be <= {le}",
        "literal_error": "must be one of {expected}",
        "int_parsing": "must be a whole number",
        "float_parsing": "must be a number",
        "bool_parsing": "must be true or false",
        "int_from_float": "must be a whole number",
    }
    if kind in rules:
        return rules[kind].format(**ctx)
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ")


def validate(flat_or_nested: dict[str, Any]) -> Config:
    """Build a Config; the first error becomes a ConfigError with one line."""
    try:
        return Config.model_validate(nest(flat_or_nested))
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
        if len(loc) >= 2:
            name = flag(loc[1])
            value = err.get("input")
            if isinstance(value, list):
                value = ",".join(str(v) for v in value)
            raise ConfigError(f"{name} {value}: {_describe(err)}") from None
        raise ConfigError(_describe(err)) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"--config {path}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: must be a mapping of option: value")
    return data


def load_config(yaml_path: Optional[str], overrides: dict[str, Any]) -> Config:
    """defaults <- YAML file <- flags (flags given as flat leaf names)."""
    merged = nest(load_yaml(yaml_path)) if yaml_path else {}
    for sec, values in nest(overrides).items():
        merged.setdefault(sec, {}).update(values)
    return validate(merged)
