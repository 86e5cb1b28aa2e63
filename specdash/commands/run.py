"""`specdash run`: the engine headless. Text to stdout (summary on stderr), or JSON lines."""

from __future__ import annotations

import argparse
import json
import sys

from specdash.commands.common import add_engine_arguments, add_prompt_arguments, load_settings, read_prompt, stderr_progress
from specdash.events import StepEvent, Summary, to_dict


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="generate headless (text, or JSON lines with --json)",
        description="Run the speculative engine on one prompt without the dashboard. "
        "Without --json the text streams to stdout and a one-line summary goes to stderr; "
        "with --json every step is a JSON object on its own line, then a summary object.",
    )
    add_engine_arguments(p)
    add_prompt_arguments(p, required=True)
    p.add_argument("--json", action="store_true",
                   help="emit the event stream as JSON lines (specdash/events.py, schema field in every "
                   "line): settings, prefill, one step per line, notices, then the summary")
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
    from specdash.session import Session

    prompt = read_prompt(args)  # first: its own message for an empty prompt
    assert prompt is not None  # --prompt or --prompt-file is required
    config = load_settings(args)
    session = Session(config.engine, progress=stderr_progress())
    try:
        for ev in session.run(prompt):
            if args.json:
                print(json.dumps(to_dict(ev), ensure_ascii=False), flush=isinstance(ev, Summary))
            elif isinstance(ev, StepEvent):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, Summary):
                sys.stdout.write("\n")
                print(summary_line(ev), file=sys.stderr)
    finally:
        session.close()
    return 0
