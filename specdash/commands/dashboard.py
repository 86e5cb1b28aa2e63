"""`specdash` with no subcommand: the live dashboard. Flags live on the top-level parser."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specdash.config import UI_LIMIT, UISettings
from specdash.commands.common import add_engine_arguments, add_prompt_arguments, limit_type, load_settings, read_prompt
from specdash.engine.settings import EngineSettings
from specdash.errors import SpecdashError
from specdash.sources.embedded import Progress

# Leading K=0 steps of every prompt: the plain-decoding reference on the tok/s chart,
# measured on this machine with this target.
CALIBRATE_STEPS = 12
# How long `q` waits for the engine's current step before leaving anyway.
QUIT_GRACE_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_prompt_arguments(parser, required=False)
    g = parser.add_argument_group("dashboard")
    g.add_argument("--theme", metavar="NAME", help="colour theme (default specdash-dark; also "
                   "specdash-light, Textual's built-ins, or your own in ~/.config/specdash/themes/)")
    g.add_argument("--refresh", type=limit_type(UI_LIMIT["refresh"]), metavar="SECONDS",
                   help="seconds between telemetry polls and redraws of numbers and charts, "
                   "0.1..60 (default 1); the text streams as it comes")
    g.add_argument("--screenshots", metavar="DIR",
                   help="folder for `s` screenshots (default ~/specdash-screenshots)")


def _prompt_from_config(ui: UISettings) -> str | None:
    if ui.prompt is not None:
        return ui.prompt
    if ui.prompt_file is not None:
        path = Path(ui.prompt_file).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecdashError(f"[generation] prompt_file = {path}: cannot read it ({exc})") from None
    return None


def run(args: argparse.Namespace) -> int:
    from textual.theme import BUILTIN_THEMES

    from specdash.config import find_config_path
    from specdash.prompts import BUILTIN
    from specdash.session import Session
    from specdash.sources.embedded import WorkItem
    from specdash.tui.app import DashboardOptions, SpecdashApp
    from specdash.tui.themes import load_themes

    prompt = read_prompt(args)  # first: its own message for an empty prompt
    config = load_settings(args)
    if prompt is None:
        prompt = _prompt_from_config(config.ui)
    themes = {**BUILTIN_THEMES, **load_themes()}
    if config.ui.theme not in themes:
        raise SpecdashError(f"--theme {config.ui.theme}: unknown theme; available: {', '.join(sorted(themes))}")
    options = DashboardOptions(
        settings=config.engine,
        prompt=prompt,
        workload=[WorkItem(f"{p.name} ({p.kind})", p.text) for p in BUILTIN],
        theme=config.ui.theme,
        refresh=config.ui.refresh,
        screenshots_dir=args.screenshots or config.ui.screenshots_dir,
        config_path=find_config_path(getattr(args, "config", None)),
    )
    def make_session(settings: EngineSettings, progress: Progress) -> Session:
        session = Session(settings, progress=progress)
        session.engine.calibrate_steps = CALIBRATE_STEPS
        return session

    app = SpecdashApp(options, session_factory=make_session)
    # The engine thread needs the GIL for a moment after every llama_decode; while the UI
    # thread renders a frame it would wait up to the default 5 ms switch interval, with
    # the CPU cores idle. 0.5 ms makes that wait negligible (a frame costs ~20 ms).
    sys.setswitchinterval(0.0005)
    app.run()
    code = app.return_code or 0
    engine = app.engine_thread
    if engine is not None and engine.is_alive():
        # Stop was sent; a step in progress ends within ~0.2 s on an idle machine and the
        # session closes. A long prefill or an overloaded CPU must not hold the shell.
        engine.join(QUIT_GRACE_S)
        if engine.is_alive():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code
