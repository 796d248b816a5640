"""`threshold` (expiration): staleness s = server version - push version; the step is dropped
when s > T (the worker carries on from the values in the reply)."""

from ringps.ps import POLICIES
from ringps.ps.policies.base import Policy, Push, Verdict


@POLICIES.register("threshold")
class Threshold(Policy):
    judged = True
    uses_threshold = True

    def default_threshold(self, workers: int) -> int:
        # with N workers of one speed a push is about N - 1 versions stale (each other worker
        # pushed once meanwhile); twice that keeps a worker up to ~2x slower than the rest and
        # drops the ones slower still (T = 4, 6, 8 at N = 4 measured: docs/RESULTS.md)
        return 2 * (workers - 1)

    def admit(self, push: Push) -> Verdict:
        if push.staleness > self.threshold:
            return Verdict(False, reason=f"staleness {push.staleness} > T={self.threshold}")
        return Verdict(True)
