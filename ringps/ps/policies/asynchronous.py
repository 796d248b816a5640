"""`async` (ASGD): every push applied at once, whatever its staleness."""

from ringps.ps import POLICIES
from ringps.ps.policies.base import Policy


@POLICIES.register("async")
class Async(Policy):
    pass
