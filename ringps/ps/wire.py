"""The parameter-server wire protocol: a validated fixed-size header, then the payload.

A request is a header of 21 int64 (tag HEADER) and, for a push, the shard's gradient (tag
PAYLOAD) and, when the policy needs it, the value sample (tag SAMPLE). A reply is a header (tag
REPLY) and the shard's current values (tag VALUES). Separate tags keep headers and payloads from
ever being matched with each other. A pull may carry FLAG_HOLD (hold every other worker's push
until this worker sends FLAG_RELEASE): the evaluating worker of an asynchronous job uses it.

The server checks every header before it touches anything: magic, op, sender, shard, version,
sizes, layout fingerprint, learning rate, and a checksum over the fields. A refused header is
counted and answered with status REFUSED and the reason; its payload, if its declared size is
within bounds, is received and thrown away, so the stream stays in step; a header declaring an
oversized payload ends the service to that peer (nothing of it can be trusted any more).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Optional

import torch

MAGIC = 0x5250_4753_0003  # "RPGS", protocol 3
FIELDS = 21
TAG_HEADER, TAG_PAYLOAD, TAG_REPLY, TAG_VALUES, TAG_SAMPLE = 11, 12, 13, 14, 15

OP_PUSHPULL, OP_PULL, OP_STOP, OP_LAYER, OP_REPLY = 1, 2, 3, 4, 10
OPS = {OP_PUSHPULL: "push-pull", OP_PULL: "pull", OP_STOP: "stop", OP_LAYER: "layer push", OP_REPLY: "reply"}
# how a layer's gradient travels (OP_LAYER) and how its update comes back
DENSE, FP16, TOPK, SF = 0, 1, 2, 3
METHODS = {DENSE: "dense", FP16: "fp16", TOPK: "topk", SF: "sf"}
FLAG_END_OF_STEP = 1  # the step's last layer: the server now replies, in priority order
# OP_PULL: the evaluating worker holds the job still (every other push waits at the server) while
# it scores the model, so no worker trains in time the evaluator's clock leaves out; RELEASE ends it
FLAG_HOLD, FLAG_RELEASE = 8, 16
APPLIED, DROPPED, REFUSED, STOPPED = 0, 1, 2, 3
STATUS = {APPLIED: "applied", DROPPED: "dropped", REFUSED: "refused", STOPPED: "stopped"}
_MASK = (1 << 61) - 1


def f2i(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def i2f(x: int) -> float:
    return struct.unpack("<d", struct.pack("<q", x))[0]


@dataclass
class Header:
    op: int
    sender: int
    shard: int
    version: int = 0
    payload: int = 0  # gradient entries
    sample: int = 0  # value-sample entries after the gradient
    fingerprint: int = 0
    lr: float = 0.0
    step: int = 0
    status: int = 0
    staleness: int = 0
    weight: float = 1.0
    held_us: int = 0
    value_staleness: float = 0.0
    layer: int = 0  # OP_LAYER: which layer of the plan
    method: int = DENSE
    rows: int = 0  # sf: batch rows of the factors; topk: k; reply: log entries that follow
    flags: int = 0
    paused_us: int = 0  # reply: how long this push waited for another worker's evaluation (FLAG_HOLD)

    def fields(self) -> list[int]:
        f = [MAGIC, self.op, self.sender, self.shard, self.version, self.payload, self.sample, self.fingerprint,
             f2i(self.lr), self.step, self.status, self.staleness, f2i(self.weight), self.held_us,
             f2i(self.value_staleness), self.layer, self.method, self.rows, self.flags, self.paused_us]
        return f + [checksum(f)]

    def encode(self) -> torch.Tensor:
        return torch.tensor(self.fields(), dtype=torch.int64)

    @classmethod
    def decode(cls, t: torch.Tensor) -> "Header":
        f = t.tolist()
        return cls(op=f[1], sender=f[2], shard=f[3], version=f[4], payload=f[5], sample=f[6], fingerprint=f[7],
                   lr=i2f(f[8]), step=f[9], status=f[10], staleness=f[11], weight=i2f(f[12]), held_us=f[13],
                   value_staleness=i2f(f[14]), layer=f[15], method=f[16], rows=f[17], flags=f[18], paused_us=f[19])

    @property
    def total(self) -> int:
        return self.payload + self.sample


def checksum(fields: list[int]) -> int:
    acc = 0
    for i, v in enumerate(fields[: FIELDS - 1]):
        acc = (acc * 1_000_003 + (v & _MASK) + i) & _MASK
    return acc


def empty_header() -> torch.Tensor:
    return torch.zeros(FIELDS, dtype=torch.int64)


@dataclass
class Expect:
    """What a server accepts from a given peer."""

    sender: int
    shard: int
    fingerprint: int
    payload: int  # the shard's entries
    sample: int  # value-sample entries the policy needs (0: none)
    version: int  # the shard's current version (a push can't be from the future)


def validate(raw: torch.Tensor, exp: Expect) -> tuple[Optional[Header], Optional[str], bool]:
    """(header, None, _) when acceptable; (header or None, reason, drainable) when refused.
    drainable: the declared payload is within bounds, so it can be received and discarded."""
    f = raw.tolist()
    if len(f) != FIELDS or f[0] != MAGIC:
        return None, "bad magic (not a ringps message, or another protocol version)", False
    if f[FIELDS - 1] != checksum(f):
        return None, "header checksum mismatch", False
    h = Header.decode(raw)
    sizes_ok = 0 <= h.payload <= exp.payload and 0 <= h.sample <= max(exp.sample, 0)
    drainable = sizes_ok and h.op == OP_PUSHPULL
    if h.op not in (OP_PUSHPULL, OP_PULL, OP_STOP, OP_LAYER):
        return h, f"unknown op {h.op}", False
    if h.sender != exp.sender:
        return h, f"sender field {h.sender} but the message came from rank {exp.sender}", drainable
    if h.shard != exp.shard:
        return h, f"shard {h.shard} sent to the server of shard {exp.shard}", drainable
    if h.fingerprint != exp.fingerprint:
        return h, "parameter layout fingerprint differs (different model, servers or slice size)", drainable
    if not sizes_ok:
        return h, f"payload {h.payload}+{h.sample} entries, expected at most {exp.payload}+{exp.sample}", False
    if h.op in (OP_PUSHPULL, OP_LAYER):
        if h.op == OP_PUSHPULL and (h.payload != exp.payload or h.sample != exp.sample):
            return h, f"payload {h.payload}+{h.sample} entries, expected exactly {exp.payload}+{exp.sample}", drainable
        if not 0 <= h.version <= exp.version:
            return h, f"version {h.version} outside 0..{exp.version}", drainable
        if not (math.isfinite(h.lr) and 0 <= h.lr <= 100):  # 0 at the very end of a cosine schedule
            return h, f"learning rate {h.lr} not in [0, 100]", drainable
    elif h.payload or h.sample:
        return h, f"{OPS[h.op]} carries no payload, header says {h.payload}+{h.sample}", False
    return h, None, drainable
