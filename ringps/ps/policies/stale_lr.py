"""`stale-lr` (Zhang et al. 2016, "Staleness-aware async-SGD"): the gradient of a push s versions
stale is divided by max(1, s) before it enters the momentum buffer, so the push moves the model
1/s as far in total (scaling only the step's learning rate would let the full gradient into the
momentum, which carries it on at full size: with momentum 0.9 that is a 7.5% cut, not 4x, at s=4)."""

from ringps.ps import POLICIES
from ringps.ps.policies.base import Policy, Push, Verdict


@POLICIES.register("stale-lr")
class StaleLR(Policy):
    judged = True

    def admit(self, push: Push) -> Verdict:
        return Verdict(True, scale=1.0 / max(1, push.staleness))
