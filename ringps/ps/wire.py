"""The parameter-server wire protocol: a validated fixed-size header, then the payload.

A request is a header of FIELDS int64 (tag HEADER) and, for a push, the gradient (tag PAYLOAD)
and, when the policy needs it, the value sample (tag SAMPLE). A reply is a header (tag REPLY)
and the values (tag VALUES). Separate tags keep headers and payloads from ever being matched with
each other. A pull may carry FLAG_HOLD (hold every other worker's push until this worker sends
FLAG_RELEASE): the evaluating worker of an asynchronous job uses it. A pull with FLAG_FINISH ends
the job (its evaluation reached the target, --stop-at-target): from then on every reply carries
FLAG_FINISH and each worker stops after the step it is in.

With several servers and a policy whose verdict depends on the push (threshold, stale-lr, vsgd),
server 0 judges every worker step and tells the other servers its verdict in an OP_VERDICT
header (tag VERDICT_BASE + worker rank, so each server's handler of that worker gets its own),
so a step is applied whole or dropped whole on every server.

Each field means one thing:

    op, sender, shard      what the message is and who sent it to which shard
    version                request: the shard version of the values the gradient was computed on;
                           reply: the version of the values that follow
    payload, sample        entries that follow (gradient or values; value sample)
    fingerprint            the parameter layout (model, servers, layer placement)
    lr                     the worker's learning rate for this push
    step                   the worker's own step number (a reply and a verdict echo it)
    status                 reply/verdict: applied, dropped, refused, stopped
    staleness              reply/verdict: versions applied between the worker's values and its push
    weight                 reply: the mean factor the gradient was scaled by (stale-lr, vsgd)
    held_us, paused_us     reply: time the policy held the reply; time the push waited for an evaluation
    value_staleness        reply: vsgd's mean relative distance
    layer, method          layer push/reply: which layer of the plan, and how its gradient travels
    rows                   sufficient factors: the batch rows of (delta, x)
    k                      top-k: (index, value) pairs that follow
    entries                layer reply: factor-log updates that follow (instead of values)
    flags                  END_OF_STEP, HOLD, RELEASE, REFRESH, FINISH
    updates                reply: pushes the servers have applied, all workers together
    worker                 verdict: whose step it judges
    scale                  verdict: the factor the judge gave the gradient (stale-lr)

The server checks every header before it touches anything: magic, op, sender, shard, version,
sizes, layout fingerprint, learning rate, and a checksum over the fields. A refused header is
counted and answered with status REFUSED; its payload, if its declared size is within bounds, is
received and thrown away, so the stream stays in step; a header declaring an oversized payload
ends the service to that peer (nothing of it can be trusted any more).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields
from typing import Optional

import torch

MAGIC = 0x5250_4753_0006  # "RPGS", protocol 6 (5 without FLAG_FINISH)
TAG_HEADER, TAG_PAYLOAD, TAG_REPLY, TAG_VALUES, TAG_SAMPLE = 11, 12, 13, 14, 15
TAG_VERDICT_BASE = 1000  # + worker rank: server 0's verdict on that worker's step

OP_PUSHPULL, OP_PULL, OP_STOP, OP_LAYER, OP_REPLY, OP_VERDICT = 1, 2, 3, 4, 10, 11
OPS = {OP_PUSHPULL: "push-pull", OP_PULL: "pull", OP_STOP: "stop", OP_LAYER: "layer push", OP_REPLY: "reply",
       OP_VERDICT: "verdict"}
# how a layer's gradient travels (OP_LAYER) and how its update comes back
DENSE, FP16, TOPK, SF = 0, 1, 2, 3
METHODS = {DENSE: "dense", FP16: "fp16", TOPK: "topk", SF: "sf"}
FLAG_END_OF_STEP = 1  # the step's last layer for this server: it commits the step and replies
FLAG_REFRESH = 2  # layer: send values (and momentum, for sf) rather than an update log
# OP_PULL: the evaluating worker holds the job still (every other push waits at the server) while
# it scores the model, so no worker trains in time the evaluator's clock leaves out; RELEASE ends it
FLAG_HOLD, FLAG_RELEASE = 8, 16
# OP_PULL: the evaluator's target is reached, end the job; reply: the job is over, stop after this step
FLAG_FINISH = 32
APPLIED, DROPPED, REFUSED, STOPPED = 0, 1, 2, 3
STATUS = {APPLIED: "applied", DROPPED: "dropped", REFUSED: "refused", STOPPED: "stopped"}
_MASK = (1 << 61) - 1
_FLOATS = {"lr", "weight", "value_staleness", "scale"}  # carried as the bits of a float64


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
    payload: int = 0
    sample: int = 0
    fingerprint: int = 0
    lr: float = 0.0
    step: int = 0
    status: int = 0
    staleness: int = 0
    weight: float = 1.0
    held_us: int = 0
    value_staleness: float = 0.0
    layer: int = 0
    method: int = DENSE
    rows: int = 0
    k: int = 0
    entries: int = 0
    flags: int = 0
    paused_us: int = 0
    updates: int = 0
    worker: int = 0
    scale: float = 1.0

    def fields(self) -> list[int]:
        f = [MAGIC] + [f2i(getattr(self, n)) if n in _FLOATS else int(getattr(self, n)) for n in NAMES]
        return f + [checksum(f)]

    def encode(self) -> torch.Tensor:
        return torch.tensor(self.fields(), dtype=torch.int64)

    @classmethod
    def decode(cls, t: torch.Tensor) -> "Header":
        f = t.tolist()
        return cls(**{n: i2f(v) if n in _FLOATS else v for n, v in zip(NAMES, f[1:-1])})

    @property
    def total(self) -> int:
        return self.payload + self.sample


NAMES = [f.name for f in fields(Header)]
FIELDS = len(NAMES) + 2  # magic + fields + checksum


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
        return h, "parameter layout fingerprint differs (different model, servers or layer placement)", drainable
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
