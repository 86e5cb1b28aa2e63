"""`specdash sweep`: plain decoding and each K on one prompt, plotted; the best K marked."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdash.commands.common import add_engine_arguments, add_prompt_arguments, load_settings, read_prompt, stderr_progress
from specdash.engine.settings import LIMIT
from specdash.contract.errors import SpecdashError
from specdash.tuning.sweep import DEFAULT_KS


def _ks(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    lim = LIMIT["k"]
    if not values or any(not (lim.lo or 0) <= v <= (lim.hi or 0) for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated Ks, each {lim.allowed}, e.g. 0,2,4,8")
    return values


def _temps(text: str) -> list[float]:
    """--temps: the engine's own temperature limit (engine/settings.py LIMITS) per value."""
    lim = LIMIT["temperature"]
    try:
        values = [lim.coerce(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated temperatures, each {lim.allowed} "
                                         "(0 = greedy), e.g. 0,0.7")
    return list(dict.fromkeys(values))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="plain decoding and each K on one prompt: the speed-vs-K curve and the best K",
        description="Run plain decoding and each K in a list for the current drafter on one prompt, "
        "in interleaved rounds, through the same engine and commands as the dashboard. Opens the "
        "dashboard's sweep view (k in the dashboard opens the same view) plotting tok/s and acceptance "
        "against K as results arrive, with the best K marked; a applies it, w saves it, t sets the "
        "temperatures, Esc cancels. With --temps, every K runs at each temperature (one series per "
        "temperature). With --headless, prints the table (and --json writes the results) instead.",
    )
    add_engine_arguments(p, with_k=False)
    add_prompt_arguments(p, required=False)
    p.add_argument("--ks", type=_ks, default=list(DEFAULT_KS), metavar="LIST",
                   help=f"Ks to try, comma-separated; 0 = plain decoding (default {','.join(map(str, DEFAULT_KS))})")
    p.add_argument("--temps", type=_temps, default=None, metavar="LIST",
                   help="temperatures to run every K at, comma-separated, e.g. 0,0.7 (default: the --temp "
                   "in force, alone); the operator's temperature is restored at the end. At T>0 each run "
                   "samples its own text: a point is the median of --rounds samples")
    p.add_argument("--rounds", type=int, default=2, metavar="N", help="rounds over all Ks (default 2)")
    p.add_argument("--sweep-tokens", type=int, default=96, metavar="N", help="tokens per run (default 96)")
    p.add_argument("--headless", action="store_true", help="no dashboard: print the results table")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="with --headless: write the results as JSON")
    p.add_argument("--whatif", metavar="PROFILE", help="first predict every K with `specdash whatif`'s simulation "
                   "on PROFILE (here, a TOML file, epyc-32b, gpu-like, ci-box): drawn as predicted points beside "
                   "the measured ones (greedy only)")
    p.set_defaults(func=run, k=None)


def run(args: argparse.Namespace) -> int:
    from specdash.tuning.prompts import BUILTIN

    if args.rounds < 1 or args.sweep_tokens < 1:
        raise SpecdashError("--rounds and --sweep-tokens must be >= 1")
    prompt = read_prompt(args)
    config = load_settings(args)
    if prompt is None:
        prompt = next(p.text for p in BUILTIN if p.name == "code-edit")
    if config.engine.draft == "none":
        raise SpecdashError("--draft none: every K would be plain decoding; choose a drafter (lookup, a model, ...)")
    predicted = _predict(args, config.engine, prompt) if args.whatif else None
    if args.headless:
        return headless(args, config.engine, prompt, predicted)
    from specdash.commands.dashboard import launch

    return launch(args, config, prompt, sweep=(tuple(args.ks), args.rounds, args.sweep_tokens), predicted=predicted,
                  sweep_temps=tuple(args.temps) if args.temps is not None else None)


def _predict(args: argparse.Namespace, settings, prompt: str):
    from specdash.tuning.whatif.api import predict_sweep

    # whatif simulates greedy decoding: its points are drawn on the T=0 series only.
    if args.temps is not None:
        if 0.0 not in args.temps:
            raise SpecdashError(f"--whatif with --temps {','.join(f'{t:g}' for t in args.temps)}: predictions are "
                                "for temperature 0 only; add 0 to --temps")
        settings = settings.replace(temperature=0.0)
    elif not settings.sampling.greedy:
        raise SpecdashError(f"--whatif with --temp {settings.sampling.temperature:g}: predictions need greedy "
                            "decoding (temperature 0)")
    return predict_sweep(settings, prompt, args.ks, args.sweep_tokens, args.whatif,
                         lambda m: print(f"whatif: {m}", file=sys.stderr, flush=True))


def headless(args: argparse.Namespace, settings, prompt: str, predicted=None) -> int:
    from specdash.contract import events as E
    from specdash.sources.session import Session
    from specdash.tuning.sweep import Sweep

    session = Session(settings, progress=stderr_progress())
    try:
        sweep = Sweep(prompt, session.engine.settings_event(), ks=args.ks, rounds=args.rounds,
                      max_tokens=args.sweep_tokens, temps=args.temps)
        if predicted is not None:
            sweep.predicted, sweep.predicted_from = predicted
        pending = sweep.start()
        while not sweep.finished:
            runs = [c for c in pending if isinstance(c, E.NewPrompt)]
            for cmd in pending:
                if not isinstance(cmd, E.NewPrompt):
                    session.send(cmd)
            (run,) = runs
            for ev in [E.PromptEvent(run.title, run.text_), *session.run(run.text_, run.max_tokens)]:
                if isinstance(ev, E.NoticeEvent) and ev.level != "info":
                    raise SpecdashError(f"sweep: {ev.message}")
                pending = sweep.feed(ev) or pending
                if isinstance(ev, E.Summary):
                    # K and T as the engine holds them, not as planned
                    live = session.settings
                    print(f"[{sweep.done}/{sweep.total}] K={live.k:<3} T={live.sampling.temperature:<4g} "
                          f"{ev.tokens_per_s:6.1f} tok/s"
                          + ("" if ev.acceptance_rate is None else f"  acc {ev.acceptance_rate:.0%}"),
                          file=sys.stderr, flush=True)
    finally:
        session.close()
    if sweep.problems:  # a command the engine did not take: the table would be mislabelled
        raise SpecdashError(f"sweep: {sweep.problems[0]}")
    print(table(sweep))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(sweep.to_json(), indent=2))
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0


def table(sweep) -> str:
    pred = sweep.predicted_t0
    lines = [f"{'K':>3} {'T':>4} {'tok/s':>7} {'min-max':>13} {'vs plain':>8} {'accept':>7} {'mean len':>8}"
             + (f" {'predicted':>9}" if pred else "")]
    for t in sweep.temps:
        best, plain = sweep.best_at(t), sweep.plain_at(t)
        for p in sweep.at(t):
            lo, hi = p.spread
            # "vs plain": against K=0 at the same temperature
            ratio = f"{p.tokens_per_s / plain:7.2f}x" if plain else "      -"
            acc = f"{p.acceptance:7.0%}" if p.acceptance is not None else "      -"
            mean = f"{p.mean_accepted_length:8.2f}" if p.mean_accepted_length is not None else "       -"
            # whatif's predictions are greedy: they go beside the T=0 rows only
            guess = (f" {pred[p.k][0]:9.1f}" if p.k in pred and t == 0 else f" {'-':>9}") if pred else ""
            temp = p.engine_temperature
            lines.append(f"{p.k:>3} {'?' if temp is None else format(temp, 'g'):>4} {p.tokens_per_s:7.1f} "
                         f"{lo:6.1f}-{hi:<6.1f} {ratio} {acc} {mean}{guess}"
                         + ("  <- best" if best is not None and p.k == best.k else ""))
    if len(sweep.temps) > 1:
        lines.append("best K per temperature; vs plain: against K=0 at the same temperature")
    if sweep.sampled:
        lines.append(sweep.sampled_note())
    if pred:
        lines.append(f"predicted (T=0 only): {sweep.predicted_from}")
    return "\n".join(lines)
