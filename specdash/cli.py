"""Entry point: argument parsing and exit codes only; each subcommand lives in
specdash/commands/<name>.py and exposes `register(subparsers)`.

`specdash` with no subcommand opens the dashboard (commands/dashboard.py), so the
dashboard's flags are registered on the top-level parser.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import sys

from specdash import __version__
from specdash.contract.errors import SpecdashError, describe

# Order is the order shown in --help.
SUBCOMMANDS = ["run", "serve", "bench", "sweep", "whatif", "replay", "compare", "export", "attach", "models", "check", "doctor",
               "calibrate", "web"]


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (argparse would print the whole usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specdash",
        description=(
            "Watch and steer speculative decoding live. With no subcommand, opens the "
            "dashboard on the default pair (Qwen2.5-Coder 1.5B target, 0.5B draft) with adaptive K: "
            "K chosen every step, 0 (plain decoding) where drafting does not pay. --k N alone fixes K."
        ),
        epilog="Run `specdash COMMAND --help` for a subcommand's options.",
    )
    parser.add_argument("--version", action="version", version=f"specdash {__version__}")
    dashboard = importlib.import_module("specdash.commands.dashboard")
    dashboard.add_arguments(parser)
    parser.set_defaults(func=dashboard.run)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"specdash.commands.{name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # A native crash (llama.cpp) at least says where, instead of a silent exit 139.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    parser = build_parser()
    args = parser.parse_args(argv)
    from specdash.commands.common import say
    from specdash.engine import repack

    # The repack probe's verdict is said once per machine, the first time (engine/repack.py).
    repack.hooks.announce = repack.hooks.progress = say
    try:
        return int(args.func(args) or 0)
    except SpecdashError as exc:
        print(f"specdash: error: {describe(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("specdash: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `specdash run --json | head` closes stdout early; that is not an error.
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
