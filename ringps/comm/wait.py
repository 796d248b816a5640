"""The one way ringps waits on another process: a c10d work with a timeout, and on failure a
CommTimeout that says who waited for what (gloo's own message cut to its first line)."""

from __future__ import annotations

from datetime import timedelta

from ringps.errors import CommTimeout, first_line


def wait(work, timeout: float, what: str) -> None:
    """`what` names the waiter and the wait, e.g. "rank 3: receiving a gradient from rank 1"."""
    try:
        ok = work.wait(timeout=timedelta(seconds=timeout))
    except RuntimeError as e:
        raise CommTimeout(f"{what} failed after up to {timeout:g}s: {first_line(e)}") from None
    if ok is False:
        raise CommTimeout(f"{what} timed out after {timeout:g}s")
