"""`specdash replay FILE [FILE2]`: a recording in the dashboard, or two compared."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from specdash.contract.errors import SpecdashError

if TYPE_CHECKING:
    from specdash.records.recording import Recording
    from specdash.tui.app_base import SourceFactory


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay",
        help="play a recording back in the dashboard, or compare two",
        description="Open the dashboard on a recording made with --record (or the record_dir "
        "config key): every panel shows what it showed live, telemetry included. Keys: space "
        "play/pause, [ and ] speed (0.5x to 16x), ← and → seek 10 s, home/end, s screenshot "
        "(its JSON names the file and the offset). With two files: both side by side on the "
        "same charts, with a legend (e.g. K=8 vs K=24 on one prompt).",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="one recording, or two to compare")
    p.add_argument("--speed", type=float, default=1.0, metavar="X", help="start at this speed, 0.5..16 (default 1)")
    p.add_argument("--theme", metavar="NAME", help="colour theme (default specdash-dark)")
    p.add_argument("--screenshots", metavar="DIR", help="folder for `s` screenshots (default ~/specdash-screenshots)")
    p.add_argument("--summary", action="store_true",
                   help="print what the recording holds (header, events, where it stops) and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdash.records.recording import read_recording
    from specdash.contract.events import SPEEDS

    if len(args.files) > 2:
        raise SpecdashError(f"replay takes one recording, or two to compare; got {len(args.files)}")
    if not SPEEDS[0] <= args.speed <= SPEEDS[-1]:
        raise SpecdashError(f"--speed {args.speed:g}: must be {SPEEDS[0]:g}..{SPEEDS[-1]:g}")
    recordings = [read_recording(f) for f in args.files]  # a bad file fails here, in one line
    if args.summary:
        for rec in recordings:
            print(summary(rec))
        return 0
    theme = args.theme or "specdash-dark"
    shots = args.screenshots or "~/specdash-screenshots"
    from specdash.commands.common import ui_prefs
    from specdash.tui.terminal import run_app

    keymap, mouse = ui_prefs(args)

    if len(recordings) == 2:
        from specdash.tui.compare import CompareApp

        return run_app(CompareApp(recordings[0], recordings[1], theme=theme, screenshots_dir=shots), keymap, mouse)
    from specdash.tui.app import DashboardOptions, SpecdashApp

    options = DashboardOptions(theme=theme, screenshots_dir=shots)
    app = SpecdashApp(options, source_factory=replay_factory(recordings[0], args.speed), local_telemetry=False)
    return run_app(app, keymap, mouse)


def replay_factory(rec: Recording, speed: float) -> SourceFactory:
    """The recording as a source; `r` after a recorded error plays it again from the start,
    in a new source (the closed one cannot play again) that begins with a rewind (the
    dashboard still holds what the last one showed)."""
    from specdash.sources.replay import ReplaySource
    from specdash.tui.app_base import first_then_new

    return first_then_new(ReplaySource(rec.path, speed=speed, recording=rec),
                          lambda prompts: ReplaySource(rec.path, speed=speed, recording=rec, rewind=True))


def summary(rec) -> str:
    from collections import Counter

    kinds = Counter(type(ev).__name__ for ev in rec.events)
    models = ", ".join(f"{m['role']} {m['name']} ({m['sha256'][:12] if m.get('sha256') else '?'})"
                       for m in rec.header.get("models", []))
    machine = rec.header.get("machine", {})
    lines = [
        f"{rec.path}: specdash {rec.header.get('specdash')} schema {rec.header.get('schema')}, "
        f"recorded {rec.header.get('created')}",
        f"  models: {models or 'none reported'}",
        f"  machine: {machine.get('cpu_model', '?')}, {machine.get('physical_cores', '?')} cores, "
        f"{machine.get('numa_nodes', '?')} NUMA nodes",
        f"  {len(rec.events)} events over {rec.duration:.1f} s: "
        + ", ".join(f"{n} {k}" for k, n in kinds.most_common()),
        f"  {rec.problem}" if rec.problem else "  whole file read",
    ]
    return "\n".join(lines)
