"""The worker side of the parameter servers: pull, and push-and-pull in one round trip.

The model's parameters and gradients are views into two flat buffers in layout order (see
layout.py), so each shard's gradient is sent straight from the gradient buffer and each shard's
new values are received straight into the parameters. Requests to all servers go out at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ringps import trace
from ringps.comm.wait import wait
from ringps.errors import ProtocolError
from ringps.ps import wire
from ringps.ps.layout import Layout


@dataclass
class PushResult:
    applied: list[bool]  # per server
    staleness: list[int]
    weight: list[float]
    value_staleness: list[float]
    held_s: float  # longest time a server held the reply (sync, ssp)
    paused_s: float  # longest time a server held the push for another worker's evaluation
    round_trip_s: float
    bytes_sent: int
    bytes_recv: int
    global_updates: int  # pushes the servers have applied, all workers together (the job's budget counts these)
    finished: bool = False  # a server said the job is over (another worker reached the target)


class Client:
    def __init__(self, rank: int, server_ranks: tuple[int, ...], layout: Layout, values: torch.Tensor,
                 grads: torch.Tensor, timeout: float, sample_fraction: Optional[float] = None, sample_seed: int = 0):
        self.rank, self.servers, self.layout = rank, server_ranks, layout
        self.values, self.grads, self.timeout = values, grads, timeout
        self.versions = [0] * len(server_ranks)
        self.ranges = [layout.shard_range(s) for s in range(len(server_ranks))]
        self.sample_pos = ([torch.cat(layout.sample_positions(s, sample_fraction, seed=sample_seed))
                            for s in range(len(server_ranks))] if sample_fraction is not None else None)

    def _wait(self, works: list[tuple[object, str, int]]) -> None:
        for work, what, server in works:
            wait(work, self.timeout, f"rank {self.rank}: {what} with server rank {server}")

    def _post_replies(self, op: str, values: bool) -> tuple[list[torch.Tensor], list]:
        """Post the receives of every server's reply header (and values, straight into the
        parameters) before anything is sent: no extra round of latency per phase."""
        raws = [wire.empty_header() for _ in self.servers]
        works = [(dist.irecv(r, src=srv, tag=wire.TAG_REPLY), f"waiting for the {op} reply", srv)
                 for r, srv in zip(raws, self.servers)]
        if values:
            for s, srv in enumerate(self.servers):
                lo, hi = self.ranges[s]
                works.append((dist.irecv(self.values[lo:hi], src=srv, tag=wire.TAG_VALUES), "receiving values", srv))
        return raws, works

    def _replies(self, op: str, raws: list[torch.Tensor], works: list) -> list[wire.Header]:
        n = len(self.servers)
        self._wait(works[:n])  # headers first: a refusal comes without values
        heads = [wire.Header.decode(r) for r in raws]
        for h, srv in zip(heads, self.servers):
            if h.status == wire.REFUSED:
                raise ProtocolError(f"server rank {srv} refused this worker's {op} (see its log and ranks/rank{srv}.jsonl)")
        self._wait(works[n:])
        for s, h in enumerate(heads):
            self.versions[s] = h.version if h.op == wire.OP_REPLY and h.payload else self.versions[s]
        return heads

    def pull(self, flags: int = 0) -> None:
        """The servers' current values into the parameters. flags=FLAG_HOLD also holds every other
        worker's push until `release` (an evaluation); FLAG_RELEASE and FLAG_FINISH send no values back."""
        fp, values = self.layout.fingerprint, not flags & (wire.FLAG_RELEASE | wire.FLAG_FINISH)
        op = "pull" if values else "finish" if flags & wire.FLAG_FINISH else "release"
        raws, replies = self._post_replies(op, values=values)
        works = [(dist.isend(wire.Header(wire.OP_PULL, self.rank, s, fingerprint=fp, flags=flags).encode(), dst=srv,
                             tag=wire.TAG_HEADER), f"sending a {op}", srv) for s, srv in enumerate(self.servers)]
        self._wait(works)
        self._replies(op, raws, replies)

    def hold(self) -> None:
        self.pull(wire.FLAG_HOLD)

    def release(self) -> None:
        self.pull(wire.FLAG_RELEASE)

    def finish(self) -> None:
        """End the job on every server (the target is reached): the other workers stop after their step."""
        self.pull(wire.FLAG_FINISH)

    def push_pull(self, lr: float, step: int) -> PushResult:
        t0 = time.perf_counter()
        fp = self.layout.fingerprint
        works, sent = [], 0
        samples = [self.values[lo:hi][self.sample_pos[s]] if self.sample_pos is not None else None
                   for s, (lo, hi) in enumerate(self.ranges)]  # taken before new values can land
        raws, replies = self._post_replies("push", values=True)
        for s, srv in enumerate(self.servers):
            lo, hi = self.ranges[s]
            sample = samples[s]
            h = wire.Header(wire.OP_PUSHPULL, self.rank, s, version=self.versions[s], payload=hi - lo,
                            sample=0 if sample is None else sample.numel(), fingerprint=fp, lr=lr, step=step)
            works.append((dist.isend(h.encode(), dst=srv, tag=wire.TAG_HEADER), "sending a push header", srv))
            works.append((dist.isend(self.grads[lo:hi], dst=srv, tag=wire.TAG_PAYLOAD), "sending a gradient", srv))
            sent += (hi - lo) * self.grads.element_size()
            if sample is not None:
                works.append((dist.isend(sample, dst=srv, tag=wire.TAG_SAMPLE), "sending a value sample", srv))
                sent += sample.numel() * sample.element_size()
        t_sent = time.perf_counter()
        self._wait(works)
        t_pushed = time.perf_counter()
        heads = self._replies("push", raws, replies)
        tr = trace.get()
        if tr.enabled:
            tr.add("push", "comm", t_sent, t_pushed, bytes=sent)
            tr.add("wait for reply", "comm", t_pushed, time.perf_counter(), staleness=max(h.staleness for h in heads),
                   applied=all(h.status == wire.APPLIED for h in heads), held_s=max(h.held_us for h in heads) / 1e6)
        recv = sum(hi - lo for lo, hi in self.ranges) * self.values.element_size()
        return PushResult(
            applied=[h.status == wire.APPLIED for h in heads], staleness=[h.staleness for h in heads],
            weight=[h.weight for h in heads], value_staleness=[h.value_staleness for h in heads],
            held_s=max(h.held_us for h in heads) / 1e6, paused_s=max(h.paused_us for h in heads) / 1e6,
            round_trip_s=time.perf_counter() - t0, bytes_sent=sent, bytes_recv=recv, global_updates=max(h.updates for h in heads),
            finished=any(h.flags & wire.FLAG_FINISH for h in heads),
        )

    def stop(self) -> None:
        fp = self.layout.fingerprint
        raws, replies = self._post_replies("stop", values=False)
        self._wait([(dist.isend(wire.Header(wire.OP_STOP, self.rank, s, fingerprint=fp).encode(), dst=srv,
                                tag=wire.TAG_HEADER), "sending stop", srv) for s, srv in enumerate(self.servers)])
        self._replies("stop", raws, replies)
