"""`ringps` command line. Each command is a module in ringps/cli with HELP, add_arguments(parser)
and run(args); COMMANDS lists them in the order `ringps --help` shows.

Every failure the user can act on prints one line `ringps: ...` and exits non-zero (2 for bad
input); tracebacks are kept for real bugs.
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Optional

from ringps.cli.options import Parser
from ringps.errors import RingpsError

COMMANDS = {
    "train": "ringps.cli.train",
    "compare": "ringps.cli.compare",
    "report": "ringps.cli.report",
    "plan": "ringps.cli.plan",
    "simulate": "ringps.cli.simulate",
    "profile": "ringps.cli.profile",
    "bench": "ringps.cli.bench",
    "cluster": "ringps.cli.cluster",
    "list": "ringps.cli.listing",
}


def build_parser() -> Parser:
    p = Parser(prog="ringps", description="Data-parallel PyTorch training for slow networks and unequal workers.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, module in COMMANDS.items():
        mod = importlib.import_module(module)
        sp = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return p


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt


def sigterm_like_ctrl_c() -> None:
    """SIGTERM cleans up like Ctrl-C: processes, namespaces, temp files (Python's default SIGTERM
    exits without running `finally` blocks, which would leave emulated hosts behind)."""
    signal.signal(signal.SIGTERM, _terminate)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    sigterm_like_ctrl_c()
    try:
        return args._run(args) or 0
    except RingpsError as e:
        print(f"ringps: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("ringps: interrupted; every process it started has been stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
