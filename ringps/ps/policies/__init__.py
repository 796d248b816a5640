"""Server policies, one file each (docs/DESIGN.md "Parameter server"); importing a module registers it.

sync (BSP), async (ASGD), threshold (expiration), ssp (bounded staleness), stale-lr (Zhang et al.
2016), dcasgd (Zheng et al. 2017), vsgd (value staleness). The interface is in `base.py`.
"""

# the registry: one line per policy
from ringps.ps.policies import (
    asynchronous,  # noqa: E402,F401
    dcasgd,  # noqa: E402,F401
    ssp,  # noqa: E402,F401
    stale_lr,  # noqa: E402,F401
    sync,  # noqa: E402,F401
    threshold,  # noqa: E402,F401
    vsgd,  # noqa: E402,F401
)
from ringps.ps.policies.base import Policy, Push, Verdict  # noqa: F401
from ringps.ps.policies.vsgd import VSGD  # noqa: E402,F401
