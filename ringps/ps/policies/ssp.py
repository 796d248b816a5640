"""`ssp` (stale synchronous parallel, Ho et al. 2013): a worker more than T pushes ahead of the
slowest live worker waits, at the server, before its reply."""

from __future__ import annotations

from collections import Counter

from ringps.errors import WorkerFailed
from ringps.ps import POLICIES
from ringps.ps.policies.base import Policy, Push


@POLICIES.register("ssp")
class SSP(Policy):
    uses_threshold = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.clock: Counter = Counter()  # pushes per worker

    def hold(self, server, push: Push) -> None:
        w, cond = push.worker, server.shard.cond
        self.clock[w] += 1
        cond.notify_all()
        ok = cond.wait_for(lambda: w not in server.live or server.finished
                           or self.clock[w] - min(self.clock[x] for x in server.live) <= self.threshold,
                           timeout=server.timeout)
        if not ok:
            slow = min(server.live, key=lambda x: self.clock[x])
            raise WorkerFailed(f"server rank {server.rank}: worker rank {w} waited {server.timeout:g}s for the slowest "
                               f"worker, rank {slow} (SSP bound {self.threshold})")

    def state_dict(self) -> dict:
        return {"clock": dict(self.clock)}

    def load_state_dict(self, state: dict) -> None:
        self.clock = Counter(state.get("clock", {}))
