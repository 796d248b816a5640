"""Flags generated from the config tree, so every config key has a flag of the same name.

Flags take their values as text and leave conversion and validation to the config model; a flag
that is not given does not override the YAML file or the default. Argument errors print one line
and exit 2 (argparse's rule), never the usage block.
"""

from __future__ import annotations

import argparse
import sys
import typing
from typing import Any, NoReturn

from ringps.config import flag, sections


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"ringps {self.prog.split()[-1]}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _is_bool(annotation: Any) -> bool:
    return annotation is bool or (typing.get_origin(annotation) is typing.Union and bool in typing.get_args(annotation))


def add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="options from a YAML file (flags override it)")
    for sec, cls in sections().items():
        group = p.add_argument_group(f"{sec} options")
        for leaf, f in cls.model_fields.items():
            default = f.default
            shown = ",".join(map(str, default)) if isinstance(default, list) else default
            help_text = f"{f.description or ''} (default: {shown})".replace("%", "%%")
            if _is_bool(f.annotation):
                group.add_argument(flag(leaf), dest=leaf, action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=help_text)
            else:
                group.add_argument(flag(leaf), dest=leaf, metavar=leaf.upper(), default=argparse.SUPPRESS,
                                   help=help_text)


def config_overrides(args: argparse.Namespace, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config keys the user gave as flags (flat leaf names)."""
    known = {leaf for cls in sections().values() for leaf in cls.model_fields}
    return {k: v for k, v in vars(args).items() if k in known and k not in exclude}
