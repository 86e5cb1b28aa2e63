"""`specdash doctor`: system hints for CPU inference (threads, OpenMP, NUMA, huge pages,
CPU governor) and llama.cpp's weight repacking on this CPU, warnings first. Advice only:
the exit code is 0 whatever it finds."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from typing import TYPE_CHECKING

from specdash.telemetry.hints import LEVEL_ORDER, Hint, collect_hints

if TYPE_CHECKING:
    from specdash.engine.repack import Verdict


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check this machine's settings for CPU inference",
        description=(
            "Check settings outside specdash that change its speed and print one line per "
            "check, warnings first, each with what it read: engine threads against physical "
            "cores, OMP_NUM_THREADS, NUMA memory policy (interleave on a multi-node machine), "
            "transparent huge pages, the CPU frequency governor, and weight repacking (llama.cpp's "
            "AMX repacking crashes on some Intel CPUs: a probe decides once per machine, see "
            "--repack). Hints are advice: the exit code is 0 whatever they say."
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
    parser.add_argument(
        "--repack", metavar="MODE", default="auto",
        help="the weight-repacking setting to check: auto (default: the probe's verdict, or "
        "$SPECDASH_REPACK), on, no-amx, off",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdash.engine import repack

    setting = repack.check_setting(args.repack, "--repack")
    hints = collect_hints(threads=args.threads, root=args.root)
    hints = sorted([*hints, repack_hint(repack.resolve(setting)), costs_hint()], key=lambda h: LEVEL_ORDER[h.level])
    if args.json:
        print(json.dumps({"hints": [asdict(hint) for hint in hints]}, indent=2))
    else:
        for hint in hints:
            print(format_hint(hint))
    return 0


def format_hint(hint: Hint) -> str:
    return f"{hint.level.upper():<4}  {hint.key:<8}  {hint.message}  [read: {hint.evidence}]"


def repack_hint(verdict: Verdict) -> Hint:
    """What weight repacking this machine loads models with, and what decided it."""
    from specdash.engine.repack import cache_file

    evidence = verdict.describe()
    if verdict.origin in ("probe", "cache"):
        evidence += f"; cached in {cache_file()}"
    if verdict.crashed:
        kept = {"no-amx": "AMX avoided, the other repacking kept",
                "off": "every model loads without repacking (slower)"}.get(verdict.mode, "")
        return Hint("warn", "repack", f"repack {verdict.label()}: {kept}", evidence)
    return Hint("ok", "repack", f"repack {verdict.label()}", evidence)


def costs_hint() -> Hint:
    """The cost profiles runs keep here (issue 40): how many, the newest, any unusable."""
    from specdash.costs.store import ProfileStore
    from specdash.engine.kept_costs import age_text

    store = ProfileStore()
    files = store.files()
    bad = [f for f in files if f.problem]
    good = [f for f in files if not f.problem]
    if bad:
        return Hint("warn", "costs", f"{len(bad)} kept cost profile(s) unusable, replaced by the next run of "
                    f"their target: {bad[0].path.name}: {bad[0].problem}", str(store.folder))
    if not good:
        return Hint("ok", "costs", "no kept cost profiles yet: a target's first run times each batch size "
                    "when a decision needs it (`specdash calibrate` times them all now)", str(store.folder))
    new = good[0]
    return Hint("ok", "costs", f"{len(good)} kept cost profile(s); newest {new.target}: {new.timings} timings of "
                f"{new.sizes} batch sizes, saved {age_text(new.age_s)} ago", str(store.folder))
