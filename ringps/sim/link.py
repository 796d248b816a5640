"""A link shared by the transfers on it at once, as SimPy events.

TCP flows through one bottleneck share it, but not always equally. Measured on ringps's emulated
cluster (tc tbf with a 200 ms drop-tail queue; docs/RESULTS.md §6), two workers pushing 43 MB to
one server at 1 Gbit/s took 0.64 s each, side by side, and then waited as long for their replies,
both at once: a fair share, the link idle one way while busy the other. At 100 Mbit/s the push
that started first kept most of the link (the later flow's slow start crawls through the queue
the first one built), the two drifted apart, and pushes of one worker overlapped replies to the
other, as a first-come-first-served queue would have it. So the share is weighted: the transfer
in flight longest gets weight 1, every later one `fairness` (1: a fair share, TCP's long-run
ideal and a data-centre network's; 0: first come, first served). For ringps's emulated cluster
`sim/calibrate.py` sets it from the link: 0 where tbf's queue overflows (`lossy`), else 1.

The two directions of a server's link can be paired (`pair`): while both carry transfers, each
runs at `duplex` x its rate. On the emulated cluster's lossy links k pushes in and k replies out
at once carry less each way than either alone (benchmarks/server_link.py at 100 Mbit/s: 0.95
of the rate one way at every k, 0.85 and 0.80 both ways at k = 3 and 4; a reply's ACKs wait in
the queue the pushes fill, and the other way round), which the 2-worker calibration cannot see
(at k = 2 the loss is small) and which made 3- and 4-worker parameter servers slower than
predicted.

The same object serves as a host's cores shared by the processes computing on them (sim/ps.py):
rate = cores, cap = 1 (a process runs on one core at a time), amounts in core-seconds, fair.

Each arrival or departure costs O(k) for k transfers in flight.
"""

from __future__ import annotations

import simpy

EPS = 1e-3  # bytes: what float rounding leaves of a finished transfer


class Flow:
    __slots__ = ("left", "done")

    def __init__(self, left: float, done: simpy.Event):
        self.left, self.done = left, done


class SharedLink:
    def __init__(self, env: simpy.Environment, rate: float, cap: float | None = None, latency: float = 0.0,
                 fairness: float = 1.0, eps: float = EPS):
        self.env, self.rate, self.cap, self.latency, self.fairness = env, rate, cap or rate, latency, fairness
        self.eps = eps  # what is left of a finished transfer after float rounding, in its units
        self.flows: list[Flow] = []  # in order of arrival: the first is served longest
        self.last = env.now
        self.busy_s = 0.0  # time with at least one transfer in flight (occupancy)
        self.wake = env.event()
        self.partner: "SharedLink | None" = None  # the other direction of a duplex link
        self.duplex = 1.0  # each direction's rate while both carry transfers
        env.process(self._serve())

    def pair(self, other: "SharedLink", duplex: float) -> None:
        self.partner, other.partner, self.duplex, other.duplex = other, self, duplex, duplex

    def _changing(self) -> None:
        """Before this link's transfers change: both directions run at the old rates until now."""
        self._advance()
        if self.partner is not None:
            self.partner._advance()

    def _changed(self) -> None:
        for link in (self, self.partner):
            if link is not None and not link.wake.triggered:
                link.wake.succeed()

    def _rates(self) -> list[float]:
        k = len(self.flows)
        total = 1.0 + self.fairness * (k - 1)
        rate = self.rate * (self.duplex if self.partner is not None and self.partner.flows else 1.0)
        rates = [rate * (1.0 if i == 0 else self.fairness) / total for i in range(k)]
        return [min(self.cap, r) for r in rates]

    def _advance(self) -> None:
        dt = self.env.now - self.last
        if self.flows and dt > 0:
            for f, r in zip(self.flows, self._rates()):
                f.left -= dt * r
            self.busy_s += dt
        self.last = self.env.now

    def transfer(self, nbytes: float):
        """A SimPy process: `yield env.process(link.transfer(n))` returns when n bytes are through."""
        if self.latency:
            yield self.env.timeout(self.latency)
        self._changing()
        flow = Flow(nbytes, self.env.event())
        self.flows.append(flow)
        self._changed()
        yield flow.done

    def _serve(self):
        while True:
            if not self.flows:
                self.wake = self.env.event()
                yield self.wake
                continue
            dt = min((f.left / r if r > 0 else float("inf")) for f, r in zip(self.flows, self._rates()))
            self.wake = self.env.event()
            yield self.env.timeout(max(0.0, dt)) | self.wake
            self._changing()
            done = [f for f in self.flows if f.left <= self.eps]
            for f in done:
                self.flows.remove(f)
                f.done.succeed()
            if done and self.partner is not None:
                self._changed()
