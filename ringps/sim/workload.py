"""Workload profiles: what one training step of a model costs on one accelerator, per layer.

A profile is a YAML file (`ringps profile --model M --out P.yaml` measures one here):

    name: facenet             # free text
    device: "2-core CPU, 1 process"
    source: "measured by ringps profile"  # or the publication the numbers come from
    batch: 16                 # samples per worker per step
    steps_to_target: 55       # optional: dense synchronous steps to the target accuracy (progress model)
    noise_batch: 100          # optional: the gradient noise scale in samples (steps to the target by workers)
    optimizer_s: 0.012        # optional: the optimizer's step, after the exchange (default 0)
    kernels: {memory_gb_s: 34, fp32_tflops: 0.097}  # optional: the device's rates (Kernels)
    layers:                   # forward order
      - {name: conv1, kind: conv, params: 832, forward_s: 0.004, backward_s: 0.008}
      - {name: fc1, kind: fc, params: 10093568, forward_s: 0.01, backward_s: 0.02, in_features: 9856, out_features: 1024}

or, for a model that cannot run here, sizes and a total step time split in proportion to FLOPs:

    step_s: 1.22              # forward + backward per step
    layers: [{name: conv1, params: 9408, flops: 118e6}, ...]   # backward takes 2/3 of each layer's share
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ringps.cost import CostParams
from ringps.errors import ConfigError

PROFILES = Path(__file__).with_name("profiles")  # shipped profiles, by name


class Layer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    kind: str = "other"  # conv, fc, other
    params: int = Field(ge=0)
    forward_s: Optional[float] = Field(None, ge=0)
    backward_s: Optional[float] = Field(None, ge=0)
    flops: Optional[float] = Field(None, ge=0)  # with the profile's step_s: times in proportion
    in_features: int = 0
    out_features: int = 0


# The host whose costs CostParams's defaults are: this 2-core machine, where the validation grid's
# runs checked them (docs/RESULTS.md §6). Its dense memory pass moves 34 GB/s and its matrix
# product runs at 0.097 TFLOPS (one thread; `ringps.comm.probe.device_rates`: 33.1-34.1 GB/s and
# 0.089-0.099 TFLOPS over 4 calls, 2026-12-07). The defaults are 4-5x slower than those rates:
# they carry what the work costs around its kernels (allocations, the Python between them), as
# the runs measured it, and a device's rates scale them.
HOST_MEMORY_GB_S, HOST_FP32_TFLOPS = 34.0, 0.097
MEMORY_BOUND = ("pass_s", "reduce_s", "select_s", "scatter_s")


class Kernels(BaseModel):
    """What the strategies' own work (selection, scatter, memory passes, PowerSGD's products)
    costs per element on the profile's device: constants in `ringps.cost.CostParams`'s names, or
    the device's memory bandwidth and FP32 rate, which scale the defaults (this host's costs) by
    this host's rate over the device's. A GPU's profile without it would price that work at a
    CPU's speed: PowerSGD's 13 ms per step on a P100 (resnet101-p100) as 317 ms."""
    model_config = ConfigDict(extra="forbid")
    source: str = ""  # where the rates come from
    memory_gb_s: Optional[float] = Field(None, gt=0)  # the device's memory bandwidth (a spec sheet's, or measured)
    fp32_tflops: Optional[float] = Field(None, gt=0)
    pass_s: Optional[float] = Field(None, gt=0)
    reduce_s: Optional[float] = Field(None, gt=0)
    select_s: Optional[float] = Field(None, gt=0)
    scatter_s: Optional[float] = Field(None, gt=0)
    flop_s: Optional[float] = Field(None, gt=0)

    @model_validator(mode="after")
    def _complete(self) -> "Kernels":
        missing = [k for k in MEMORY_BOUND if getattr(self, k) is None]
        if missing and self.memory_gb_s is None:
            raise ValueError(f"give memory_gb_s (the device's memory bandwidth) or {missing[0]}")
        if self.flop_s is None and self.fp32_tflops is None:
            raise ValueError("give fp32_tflops (the device's FP32 rate) or flop_s")
        return self

    def cost_params(self) -> CostParams:
        d = CostParams()
        given = {k: getattr(self, k) or getattr(d, k) * HOST_MEMORY_GB_S / self.memory_gb_s for k in MEMORY_BOUND}
        return CostParams(**given, flop_s=self.flop_s or d.flop_s * HOST_FP32_TFLOPS / self.fp32_tflops)


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    device: str = ""
    source: str = ""
    batch: int = Field(ge=1)
    step_s: Optional[float] = Field(None, gt=0)
    steps_to_target: Optional[float] = Field(None, gt=0)
    noise_batch: Optional[float] = Field(None, gt=0)  # McCandlish et al.'s B_noise; None: linear scaling
    samples: Optional[int] = Field(None, ge=1)  # training samples (epoch-based warm-ups); None: not known
    # the optimizer's step per worker step, after the exchange (a synchronous worker's; a parameter
    # server's worker has none); not in compute_s
    optimizer_s: float = Field(0.0, ge=0)
    kernels: Optional[Kernels] = None  # None: the strategies' own work at this host's costs (CostParams)
    layers: list[Layer]

    @model_validator(mode="after")
    def _times(self) -> "Workload":
        if not self.layers:
            raise ValueError("a profile needs at least one layer")
        missing = [l.name for l in self.layers if l.forward_s is None or l.backward_s is None]
        if missing:
            if self.step_s is None or any(l.flops is None for l in self.layers):
                raise ValueError(f"layer {missing[0]} has no forward_s/backward_s: give them, or step_s and every "
                                 "layer's flops")
            total = sum(l.flops for l in self.layers) or 1.0
            for l in self.layers:  # backward ~ 2x forward
                share = self.step_s * l.flops / total
                l.forward_s, l.backward_s = share / 3, 2 * share / 3
        return self

    @property
    def params(self) -> int:
        return sum(l.params for l in self.layers)

    @property
    def compute_s(self) -> float:
        return sum(l.forward_s + l.backward_s for l in self.layers)

    @property
    def backward_s(self) -> float:
        return sum(l.backward_s for l in self.layers)

    def save(self, path: Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False))


def load_workload(spec: str) -> Workload:
    """A profile by path, or by the name of a shipped one (facenet, resnet-small, mlp, resnet50-k80, ...)."""
    path = Path(spec)
    if not path.is_file():
        path = PROFILES / f"{spec}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.yaml")))
        raise ConfigError(f"--profile {spec}: no such file or shipped profile; shipped: {known}")
    return load_yaml_model(Workload, path, f"--profile {spec}")


def load_yaml_model(cls: type[BaseModel], path: Path, label: str):
    """A YAML file validated as `cls`; what is wrong in it, one line naming `label` and the key
    (a ConfigError, never a validation traceback)."""
    try:
        return cls.model_validate(yaml.safe_load(path.read_text()))
    except (ValidationError, yaml.YAMLError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"msg": " ".join(str(e).split()), "loc": ()}
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{label}: {where + ': ' if where else ''}{first['msg'].removeprefix('Value error, ')}") from None


def from_profile(prof, name: str, device: str, steps_to_target: Optional[float] = None,
                 samples: Optional[int] = None, kernels: Optional[Kernels] = None) -> Workload:
    """A measured `ringps.schedule.profile.Profile` as a workload (`samples`: the training set's size).

    The profile times the modules that own parameters; what runs between them (activations,
    pooling, the loss: 58% of facenet's forward here) is in its whole-forward time only. It is
    spread over the layers in proportion to their own forward time, so the workload's compute is
    the whole forward and backward (shipped profiles measured before this carry the layers alone:
    see their `source`)."""
    own_f, own_b = sum(l.forward_s for l in prof.layers), sum(l.backward_s for l in prof.layers)
    fx = prof.forward_s / own_f if own_f > 0 else 1.0
    bx = prof.backward_s / own_b if own_b > 0 else 1.0  # the backward's stamps cover it whole, up to the last one
    layers = [Layer(name=l.name, kind=l.kind, params=l.params, forward_s=l.forward_s * fx, backward_s=l.backward_s * bx,
                    in_features=l.in_features, out_features=l.out_features) for l in prof.layers]
    return Workload(name=name, device=device, source="measured by ringps profile", batch=prof.batch,
                    steps_to_target=steps_to_target, samples=samples, layers=layers, kernels=kernels,
                    optimizer_s=sum(l.update_s for l in prof.layers))
