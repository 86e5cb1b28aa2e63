"""`specdash` with no subcommand: the live dashboard. Flags live on the top-level parser."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING
import os
import sys
from pathlib import Path

from specdash.config import UI_LIMIT, Config, UISettings
from specdash.commands.common import (add_engine_arguments, add_metrics_names, add_prompt_arguments, limit_type,
                                      load_settings, read_prompt, ui_prefs)
from specdash.engine.settings import EngineSettings
from specdash.contract.errors import SpecdashError
from specdash.sources.embedded import Progress

if TYPE_CHECKING:
    from specdash.tui.app import SpecdashApp

# Leading K=0 steps of every prompt: the plain-decoding reference on the tok/s chart,
# measured on this machine with this target.
CALIBRATE_STEPS = 12
# How long `q` waits for the engine's current step before leaving anyway. A 17-token verify
# batch of the 1.5B takes ~0.6 s here and llama_decode cannot be interrupted; leaving
# without it loses nothing (recordings are closed by the UI, the OS frees the models).
QUIT_GRACE_S = 0.2


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
    g.add_argument("--window", type=parse_window, metavar="SPAN",
                   help="time shown by the charts: 60s, 5m, 30m ... (default 60s); the charts "
                   "sample every 0.5 s of decode time whatever the window")
    g.add_argument("--record", metavar="FILE",
                   help="record the session (every event, telemetry included) for `specdash replay`")
    g.add_argument("--metrics-port", type=int, metavar="N",
                   help="serve Prometheus metrics (vLLM's series, specdash_ names) on 127.0.0.1:N")
    add_metrics_names(g)


def parse_window(text: str) -> float:
    """`60s`, `5m`, `1h`, or plain seconds -> seconds (10 s .. 24 h)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: use a span like 60s, 5m or 30m")
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if not 10 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: the window must be 10s..24h")
    return seconds


def check_theme(theme: str) -> None:
    """A one-line error for a theme that is neither Textual's nor one of ours."""
    from textual.theme import BUILTIN_THEMES

    from specdash.tui.themes import load_themes

    themes = {**BUILTIN_THEMES, **load_themes()}
    if theme not in themes:
        raise SpecdashError(f"--theme {theme}: unknown theme; available: {', '.join(sorted(themes))}")


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


def attach_outputs(app: SpecdashApp, args: argparse.Namespace, record_dir: str | None) -> None:
    """--record / record_dir and --metrics-port: listeners on the app's event path."""
    record = getattr(args, "record", None)
    if record or record_dir:
        from specdash.records.recording import Recorder, recording_path

        recorder = Recorder(record or recording_path(record_dir or "", "dashboard"), extra={"command": "dashboard"})
        app.add_listener(recorder)
        app.on_exit_callbacks.append(recorder.close)
    port = getattr(args, "metrics_port", None)
    if port is not None:
        from specdash.monitor.metrics_exporter import MetricsExporter

        exporter = MetricsExporter(port, names=getattr(args, "metrics_names", "specdash"))
        app.add_listener(exporter.feed)
        app.on_exit_callbacks.append(exporter.close)


def run(args: argparse.Namespace) -> int:
    prompt = read_prompt(args)  # first: its own message for an empty prompt
    config = load_settings(args)
    if prompt is None:
        prompt = _prompt_from_config(config.ui)
    return launch(args, config, prompt)


def launch(args: argparse.Namespace, config: Config, prompt: str | None,
           sweep: tuple[tuple[int, ...], int, int] | None = None,
           predicted: tuple[dict[int, tuple[float, float | None]], str] | None = None,
           sweep_temps: tuple[float, ...] | None = None) -> int:
    """The dashboard on the embedded engine; `sweep` = (Ks, rounds, tokens) opens the
    sweep view on the first prompt (`specdash sweep`), at each of `sweep_temps` if given."""
    from specdash.config import find_config_path
    from specdash.tuning.prompts import BUILTIN
    from specdash.sources.session import Session
    from specdash.sources.embedded import WorkItem
    from specdash.tui.app import DashboardOptions, SpecdashApp
    from specdash.tui.terminal import run_app

    theme = getattr(args, "theme", None) or config.ui.theme
    check_theme(theme)
    keymap, mouse = ui_prefs(args, config)  # a bad [keys] entry: one line, before anything loads
    options = DashboardOptions(
        settings=config.engine,
        prompt=prompt,
        workload=[WorkItem(f"{p.name} ({p.kind})", p.text) for p in BUILTIN],
        theme=theme,
        refresh=getattr(args, "refresh", None) or config.ui.refresh,
        screenshots_dir=getattr(args, "screenshots", None) or config.ui.screenshots_dir,
        config_path=find_config_path(getattr(args, "config", None)),
        window=getattr(args, "window", None) or 60.0,
        model_dirs=tuple(config.ui.model_dirs),
        health=config.health,
    )
    if sweep is not None:
        options.sweep_ks, options.sweep_rounds, options.sweep_tokens = sweep
        options.sweep_at_start = True
        options.sweep_predicted = predicted
        options.sweep_temps = sweep_temps

    def make_session(settings: EngineSettings, progress: Progress) -> Session:
        session = Session(settings, progress=progress)
        session.engine.calibrate_steps = CALIBRATE_STEPS
        return session

    app = SpecdashApp(options, session_factory=make_session)
    attach_outputs(app, args, config.ui.record_dir)
    # The engine thread needs the GIL for a moment after every llama_decode; while the UI
    # thread renders a frame it would wait up to the default 5 ms switch interval, with
    # the CPU cores idle. 0.5 ms makes that wait negligible (a frame costs ~20 ms).
    sys.setswitchinterval(0.0005)
    code = run_app(app, keymap, mouse)
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
