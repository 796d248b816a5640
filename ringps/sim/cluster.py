"""The cluster a simulation runs on: given as flags of `ringps simulate` or a YAML file with the
same keys, validated like every other config.

    workers: 64
    net: 10gbit               # each host's link, both directions
    latency_s: 2.0e-5         # per message
    node_size: 8              # optional: nodes of G workers, each node one host: its G workers
                              # share its `net` link (give G x the rate for a NIC per worker) ...
    intra_net: 100gbit        # ... joined by a faster link inside the node
    slowdown: [1, 1, 2, 4]    # per worker (repeats to cover N), or:
    jitter: 0.1               # lognormal sigma of every step's compute
    servers: 4                # parameter-server strategies
    server_net: 10gbit        # default: net
    efficiency: 0.95          # payload per configured link bit (--calibrate fits it)
    fairness: 1.0             # transfers sharing a server's link: 1 equal shares, 0 first come
                              # first served (the emulated cluster's lossy links: calibrate.py)
    server_efficiency: 0.8    # the servers' links' payload per bit (default: efficiency; above 1
                              # only for a stand-in: calibrate.py's loopback)
    server_duplex: 1.0        # each direction of a server's link, while pushes come in and
                              # replies go out at once, carries this x its rate (1: independent;
                              # the emulated cluster's lossy links less: benchmarks/server_link.py)
    compute_scale: 1.0        # the profile's compute x this (another device)
    forward_share: 0.35       # optional: of a worker's compute per step (forward, backward and the
    optimizer_share: 0.15     # optimizer's step after the exchange), the forward's and the
                              # optimizer's; default: the profile's own split (--calibrate fits
                              # them from the runs' traces)
    shared_cores: 2           # optional: every worker is a process on one machine with this many
                              # cores (an emulated cluster like ringps's own): they share them
    cpu_per_byte: 4.0e-10     # CPU seconds per byte a worker sends or receives (system calls,
                              # the collective's copies and sums), on the cores it computes on;
                              # 0 (default): not modelled (--calibrate reports the host
                              # kernel's; it does not charge it: the runs already carry it)
    sync_wait_s: 0.04         # per synchronous step (local SGD: per average), the workers lining up
                              # at its last collective beyond what the model shows (processes
                              # time-sharing cores finish unevenly); `--strategy auto` measures it
                              # as its DDP step on loopback less the model's; 0 (default): none
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ringps.config import parse_rate
from ringps.errors import ConfigError


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workers: int = Field(4, ge=1, le=1 << 20)
    net: str = "1gbit"
    latency_s: float = Field(5e-5, ge=0)
    node_size: int = Field(1, ge=1)
    intra_net: Optional[str] = None
    slowdown: Optional[list[float]] = None
    jitter: float = Field(0.0, ge=0, le=2)
    servers: int = Field(1, ge=1)
    server_net: Optional[str] = None
    efficiency: float = Field(0.95, gt=0, le=1)  # payload per configured link bit (calibrated)
    # how transfers in flight at once share a server's link: 1 fair, 0 first come first served (link.py)
    fairness: float = Field(1.0, ge=0, le=1)
    # the servers' links' (default: efficiency); above 1 only for a stand-in link faster than its
    # rate (calibrate.py: loopback, a copy between processes, stands in as 10 Gbit/s)
    server_efficiency: Optional[float] = Field(None, gt=0, le=16)
    # each direction of a server's link while both carry transfers, x its rate (sim/link.py)
    server_duplex: float = Field(1.0, gt=0, le=1)
    compute_scale: float = Field(1.0, gt=0)  # the profile's compute times x this (another device)
    # of a worker's compute per step (forward + backward + optimizer step), the forward's and the
    # optimizer's on this cluster (calibrated from the runs' traces); None: the profile's own split
    forward_share: Optional[float] = Field(None, gt=0, lt=1)
    optimizer_share: Optional[float] = Field(None, ge=0, lt=1)
    shared_cores: Optional[int] = Field(None, ge=1)  # emulated cluster: all workers share these cores (sim/cpu.py)
    cpu_per_byte: float = Field(0.0, ge=0, le=1e-6)  # CPU s per byte a worker moves (sent + received)
    # per synchronous step, the workers lining up beyond the model's (parameter servers: not charged)
    sync_wait_s: float = Field(0.0, ge=0, le=60)

    @model_validator(mode="after")
    def _shares(self) -> "ClusterSpec":
        if (self.forward_share or 0.0) + (self.optimizer_share or 0.0) >= 1:
            raise ValueError(f"forward_share {self.forward_share} + optimizer_share {self.optimizer_share} must leave "
                             "the backward a share (sum < 1)")
        return self

    @field_validator("net", "intra_net", "server_net")
    @classmethod
    def _rate(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            parse_rate(v)
        return v

    @field_validator("slowdown", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return [float(x) for x in v.split(",")] if isinstance(v, str) else v

    @field_validator("slowdown")
    @classmethod
    def _factors(cls, v: Optional[list[float]]) -> Optional[list[float]]:
        if v is not None and (not v or any(f < 1 for f in v)):
            raise ValueError("every factor must be >= 1")
        return v

    # -- in the units the model computes in ----------------------------------------------------
    @property
    def bw(self) -> float:
        """Bytes per second per direction of a worker's link (payload)."""
        return parse_rate(self.net) / 8 * self.efficiency

    @property
    def intra_bw(self) -> float:
        return parse_rate(self.intra_net) / 8 * self.efficiency if self.intra_net else self.bw

    @property
    def server_bw(self) -> float:
        return parse_rate(self.server_net or self.net) / 8 * (self.server_efficiency or self.efficiency)

    @property
    def push_bw(self) -> float:
        """A worker's own link carrying pushes and replies: its rate at the servers' efficiency (the
        same TCP flows as at the server's end, not the ring's)."""
        return parse_rate(self.net) / 8 * (self.server_efficiency or self.efficiency)

    def slowdowns(self) -> list[float]:
        s = self.slowdown or [1.0]
        return [s[i % len(s)] for i in range(self.workers)]


def load_cluster(path: Optional[str], overrides: dict[str, Any]) -> ClusterSpec:
    """The cluster from `path` (YAML, optional) with the flags given (`overrides`, None: not
    given) over its keys; what is wrong is one line naming the flag, or the file and its key."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--cluster {path}: no such file")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"--cluster {path}: not YAML: {' '.join(str(e).split())}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--cluster {path}: a mapping of cluster keys (workers: 64, net: 10gbit, ...), "
                              f"not a {type(data).__name__}")
    given = {k: v for k, v in overrides.items() if v is not None}
    data.update(given)
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else None
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"not a cluster key; known: {', '.join(ClusterSpec.model_fields)}"
        if path and name is not None and name not in given:  # the file's key, not a flag
            raise ConfigError(f"--cluster {path}: {name}: {err.get('input')}: {msg}") from None
        if name is None:  # keys that do not fit together (the shares)
            raise ConfigError(f"{'--cluster ' + path if path else 'cluster'}: {msg}") from None
        raise ConfigError(f"--{name.replace('_', '-')} {err.get('input')}: {msg}") from None
