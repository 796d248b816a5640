"""Parameter servers: layout (shards and slices), wire protocol, policies, server and client."""

from ringps.registry import Registry

POLICIES: Registry = Registry("policy")

from ringps.ps import policies  # noqa: E402,F401  (registration)
from ringps.ps.api import RemoteOptimizer, is_server, serve  # noqa: E402,F401  (the public API)
