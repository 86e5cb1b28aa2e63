"""`specdash doctor`: system hints for CPU inference (threads, OpenMP, NUMA, huge pages,
CPU governor), warnings first. Advice only: the exit code is 0 whatever it finds."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from specdash.telemetry.hints import Hint, collect_hints


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check this machine's settings for CPU inference",
        description=(
            "Check settings outside specdash that change its speed and print one line per "
            "check, warnings first, each with what it read: engine threads against physical "
            "cores, OMP_NUM_THREADS, NUMA memory policy (interleave on a multi-node machine), "
            "transparent huge pages, and the CPU frequency governor. Hints are advice: the "
            "exit code is 0 whatever they say."
        ),
        epilog=(
            "Examples: `specdash doctor --threads 8`; "
            "`numactl --interleave=all specdash doctor --json`."
        ),
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="engine thread count you plan to use; checked against physical cores "
        "(default: not checked, the engine uses one thread per physical core)",
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"hints": [...]} as JSON instead of lines'
    )
    parser.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="read proc/ and sys/ under DIR instead of / (to check a copied tree; default: /)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    hints = collect_hints(threads=args.threads, root=args.root)
    if args.json:
        print(json.dumps({"hints": [asdict(hint) for hint in hints]}, indent=2))
    else:
        for hint in hints:
            print(format_hint(hint))
    return 0


def format_hint(hint: Hint) -> str:
    return f"{hint.level.upper():<4}  {hint.key:<8}  {hint.message}  [read: {hint.evidence}]"
