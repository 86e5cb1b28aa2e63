"""`specdash run`: the engine headless. Text to stdout (summary on stderr), or the event
stream as JSON lines; optionally recorded, scripted and exported as Prometheus metrics."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from specdash.contract import events as E
from specdash.contract.vocabulary import SCHEDULE_SYNTAX
from specdash.commands.common import (add_engine_arguments, add_metrics_names, add_prompt_arguments, load_settings,
                                      read_prompt, stderr_progress)
from specdash.contract.events import StepEvent, Summary, to_dict
from specdash.monitor.health import HealthMonitor, in_order


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="generate headless (text, or JSON lines with --json)",
        description="Run the speculative engine on one prompt without the dashboard. "
        "Without --json the text streams to stdout and a one-line summary goes to stderr; "
        "with --json every event is a JSON object on its own line (specdash/contract/events.py).",
        epilog="Schedules: lines of `STEP: COMMAND ...`, e.g. `10: k=8` or `25: draft=suffix pause=2s`; "
        f"commands: {SCHEDULE_SYNTAX}. Commands are sent after step STEP and apply before the next; "
        "with --json each applied command shows as a settings line whose `command` is its text, and "
        "each refused one as a warning notice. # starts a comment. k=N fixes K as --k N does "
        "(under adaptive K, the default, it turns adaptive off); `k=N adaptive=on` keeps adaptive from K=N.",
    )
    add_engine_arguments(p)
    add_prompt_arguments(p, required=True)
    p.add_argument("--json", action="store_true",
                   help="emit the event stream as JSON lines (specdash/contract/events.py, schema field in every "
                   "line): settings, prefill, one step per line, notices, then the summary")
    p.add_argument("--schedule", metavar="FILE", help="apply commands at given steps (see below)")
    p.add_argument("--at", action="append", default=[], metavar="STEP:COMMAND",
                   help="apply COMMAND after step STEP, e.g. --at 10:k=8 (repeatable)")
    p.add_argument("--record", metavar="FILE", help="write the whole event stream to FILE (JSON lines "
                   "with a header: models, machine) for `specdash replay`")
    p.add_argument("--metrics-port", type=int, metavar="N",
                   help="serve Prometheus metrics (vLLM's series, specdash_ names) on 127.0.0.1:N while running")
    add_metrics_names(p)
    p.set_defaults(func=run)


def summary_line(s: Summary) -> str:
    acc = "n/a" if s.acceptance_rate is None else f"{s.acceptance_rate:.1%}"
    return (
        f"[{s.stop_reason}] {s.n_generated} tokens in {s.decode_s:.2f}s: {s.tokens_per_s:.1f} tok/s "
        f"(prefill {s.n_prompt} tok at {s.prefill_tokens_per_s:.0f} tok/s), acceptance {acc} "
        f"({s.num_accepted_tokens}/{s.num_draft_tokens}), mean accepted length {s.mean_accepted_length:.2f}, "
        f"{s.steps} steps"
    )


def run(args: argparse.Namespace) -> int:
    from specdash.tuning.schedule import Schedule, load_schedule, parse_at
    from specdash.sources.session import Session

    prompt = read_prompt(args)  # first: its own message for an empty prompt
    assert prompt is not None  # --prompt or --prompt-file is required
    config = load_settings(args)
    entries = (load_schedule(args.schedule) if args.schedule else []) + parse_at(args.at)
    sinks: list[Callable[[E.Event], None]] = [_printer(args.json)]
    closers: list[Callable[[], None]] = []
    if args.record or config.ui.record_dir:
        from specdash.records.recording import Recorder, recording_path

        recorder = Recorder(args.record or recording_path(config.ui.record_dir or "", "run"),
                            extra={"command": "run", "prompt": prompt})
        from specdash.records.recording import sample_telemetry

        sinks.append(recorder)
        closers.append(sample_telemetry(recorder))  # the machine's load, 1/s, for the replay's panels
        closers.append(recorder.close)
        closers.append(lambda: print(f"recorded {recorder.lines} lines to {recorder.path}", file=sys.stderr))
    if args.metrics_port is not None:
        from specdash.monitor.metrics_exporter import MetricsExporter

        exporter = MetricsExporter(args.metrics_port, names=args.metrics_names)
        sinks.append(exporter.feed)
        closers.append(exporter.close)
        print(f"metrics on {exporter.url}", file=sys.stderr)
    session = Session(config.engine, progress=stderr_progress())
    schedule = Schedule(entries, session.send)
    stopped = False
    # The prompt's text travels with its events, as in the dashboard's: `specdash compare`
    # checks that two runs ran the same prompt. After the first settings line, which
    # readers of `run --json` take as its first line.
    title = Path(args.prompt_file).name if getattr(args, "prompt_file", None) not in (None, "-") else "prompt"
    told = False
    health = HealthMonitor(config.health)  # its verdicts go to every sink, after the event judged
    try:
        for ev in session.run(prompt):
            for out in in_order(ev, health.feed(ev)):
                for sink in sinks:
                    sink(out)
            if not told and isinstance(ev, E.SettingsEvent):
                told = True
                for sink in sinks:
                    sink(E.PromptEvent(title, prompt, t=E.now()))
            if isinstance(ev, StepEvent):
                schedule.after_step(ev.step)
            elif isinstance(ev, Summary):
                stopped = ev.stop_reason == "stopped"
    finally:
        session.close()
        for close in closers:
            close()
    unapplied = schedule.unapplied(stopped)
    if unapplied:
        which = ", ".join(f"{e.where} ({e.command.text()} after step {e.step})" for e in unapplied)
        print(f"specdash: note: the run ended before these scheduled commands applied: {which}", file=sys.stderr)
    return 0


def _printer(as_json: bool) -> Callable[[E.Event], None]:
    def show(ev: E.Event) -> None:
        if as_json:
            print(json.dumps(to_dict(ev), ensure_ascii=False), flush=isinstance(ev, Summary))
        elif isinstance(ev, StepEvent):
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Summary):
            sys.stdout.write("\n")
            print(summary_line(ev), file=sys.stderr)
        elif isinstance(ev, E.NoticeEvent) and ev.level != "info":
            print(f"specdash: {ev.level}: {ev.message}", file=sys.stderr)

    return show
