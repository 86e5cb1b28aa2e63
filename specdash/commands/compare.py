"""`specdash compare A B`: acceptance and speed of two sets of runs of the same prompts,
side by side, with limits for CI (exit 1 when B is worse than A by more than allowed).
The figures and the verdict are specdash/records/compare.py's; this prints them."""

from __future__ import annotations

import argparse
import json
import math
import sys

EXIT_WORSE = 1


def _limit(flag: str) -> object:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 <= value <= 100:  # NaN fails it too
            raise argparse.ArgumentTypeError(f"{text!r}: must be a number 0..100 ({flag})")
        return value
    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare",
        help="two sets of runs of the same prompts side by side; exit 1 when B is worse than allowed",
        description="Compare runs of the same prompts: A (the baseline) and B (a new llama.cpp build, a new "
        "GGUF, other settings). Per prompt: acceptance (accepted / drafted tokens), acceptance length (1 + "
        "accepted / drafts), acceptance per draft position and tok/s (decode only), A beside B; a prompt run "
        "several times in a file counts all its runs. Settings that differ (temperature, K, drafter, model "
        "files, server build) are shown side by side, not refused. The two files must hold runs of the same "
        "prompts (exit 2 otherwise).",
        epilog="Inputs: recordings (`specdash run --record FILE`, `specdash --record FILE`, "
        "`specdash attach URL --prompt TEXT --headless --record FILE`) or saved JSON lines of `specdash run --json` and "
        "`specdash attach URL --prompt TEXT --json`. Exit codes: 0 compared, within the limits; 1 B is worse "
        "than a limit allows (each case named on stderr: the prompt and the figure); 2 a bad file (named with "
        "its line), different prompts, or a bad flag.",
    )
    p.add_argument("a", metavar="A.jsonl", help="the baseline runs")
    p.add_argument("b", metavar="B.jsonl", help="the runs judged against A")
    p.add_argument("--fail-if-acceptance-drops", dest="acceptance_drop", type=_limit("--fail-if-acceptance-drops"),
                   metavar="X",
                   help="exit 1 when, on any prompt, B's acceptance is more than X percentage points below A's "
                   "(absolute points, not percent of A: 66.7%% -> 52.4%% is a drop of 14.3); a prompt where B "
                   "drafted nothing and A did always fails. 0..100")
    p.add_argument("--fail-if-slower", dest="slower", type=_limit("--fail-if-slower"), metavar="X",
                   help="exit 1 when, on any prompt, B's tok/s is more than X percent below A's "
                   "(relative: B < A x (1 - X/100)). 0..100")
    p.add_argument("--json", action="store_true",
                   help="print the comparison as one JSON object (figures per prompt and in total, settings, "
                   "failures, `passed`) instead of the table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdash.records.compare import Limits, compare
    from specdash.records.runs import read_runs

    a = read_runs(args.a)  # a bad file fails here, in one line naming it
    b = read_runs(args.b)
    result = compare(a, b, Limits(acceptance_drop=args.acceptance_drop, slower=args.slower))
    if args.json:
        print(json.dumps(result.to_json(), indent=1, ensure_ascii=False))
    else:
        print(result.text())
    for failure in result.failures:
        print(f"specdash: compare: worse: {failure.message}", file=sys.stderr)
    return EXIT_WORSE if result.failures else 0
