"""`specdash calibrate`: time the target's batch costs now and keep them (issue 40).

A run keeps what it learns anyway; this measures every size on purpose, before a server
takes traffic or a benchmark starts, so the next start decides from its first token on.
"""

from __future__ import annotations

import argparse
import sys

from specdash.commands.common import add_engine_arguments, load_settings, stderr_progress

# Long enough that every calibration size fits after it; what it says does not matter.
TEXT = ("Rename the variable `total` to `subtotal` in this function and keep everything else:\n"
        "def price(items):\n    total = 0\n    for item in items:\n        total += item.cost\n    return total\n")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="time the target's batch costs now and keep them for later runs",
        description="Time one target batch of each size adaptive K can use (1, 2, 3, 4, 5, 9, 16, 17 tokens "
        "up to --k-max + 1) and keep them as this machine's cost profile for the target, its threads, "
        "repacking and expert count, in $SPECDASH_PROFILE_DIR (default $SPECDASH_CACHE/profiles). "
        "Runs keep and refine the profile by themselves; without one, a run times each size the "
        "first time a decision needs it. The profile is a whatif profile (`specdash whatif --profile FILE`).",
    )
    add_engine_arguments(p, with_k=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdash.contract import events as E
    from specdash.costs.store import ProfileStore
    from specdash.sources.session import Session

    config = load_settings(args)
    session = Session(config.engine.replace(adaptive=True), progress=stderr_progress())
    try:
        if session.engine.controller is None or session.engine.controller.pinned_shape():
            print("specdash calibrate: adaptive K's costs are pinned here ($SPECDASH_COST_SHAPE): nothing to time",
                  file=sys.stderr)
            return 2
        said = list(session.calibrate(TEXT))
        store = ProfileStore()
        path = store.path_for(store.key(session.engine.target, session.settings.experts))
    finally:
        session.close()
    for ev in said:
        if isinstance(ev, E.NoticeEvent) and "kept profile" not in ev.message:
            print(ev.message.removeprefix("adaptive K: "))
    if not path.is_file():
        print(f"specdash calibrate: nothing kept in {path.parent}", file=sys.stderr)
        return 1
    print(f"kept in {path}")
    return 0
