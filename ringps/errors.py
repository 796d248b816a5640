"""Exceptions that carry a message meant for the user (one line, says what to do next)."""


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (gloo's carry a stack dump), or its type's name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class RingpsError(Exception):
    """Base class: the CLI prints `ringps: <message>` and exits non-zero, no traceback."""

    exit_code = 1


class ConfigError(RingpsError):
    """Bad input detected before anything starts (exit code 2, like argparse)."""

    exit_code = 2


class DataError(RingpsError):
    """A dataset is missing or malformed."""

    exit_code = 2


class CommTimeout(RingpsError):
    """A wait on another process ran past its timeout; the message names both ranks and the wait."""


class GroupFailure(RingpsError):
    """A failure every rank of a torchrun group learned of at the same point (rank 0's, broadcast):
    each rank says it in its own line, and rank 0 stays until they have (its exit stops the rest)."""


class WorkerFailed(RingpsError):
    """A worker process of a synchronous job failed; the job was stopped."""


class ProtocolError(RingpsError):
    """A parameter-server message was malformed, oversized or for a different parameter layout."""
