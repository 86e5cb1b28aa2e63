"""`specdash check TARGET DRAFT`: can this draft speculate for this target?"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.text import Text

from specdash.commands.models import fetch_progress_bar, stdout_console
from specdash.models.resolve import resolve_model


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="check that a draft model can speculate for a target",
        description=(
            "Apply llama.cpp's draft/target compatibility rules (common/speculative.cpp): "
            "same vocabulary type; same add-BOS/add-EOS behaviour and BOS/EOS ids; "
            "vocabulary sizes within 128; identical token text for every id from 5 up. "
            "Prints each rule with evidence, and for a pair that fails them whether specdash can "
            "still speculate through translation (a draft with another vocabulary) and at what cost; "
            "then how each model will roll back rejected "
            "draft tokens: KV cache; recurrent-state snapshots (llama.cpp n_rs_seq, for the "
            "hybrid architectures llama.cpp supports); or checkpoint + replay (every other "
            "recurrent or hybrid model), with the memory it takes. "
            "Exit 0 compatible, 1 not (by llama.cpp's rules), 2 bad input."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help="target model: a known name or a GGUF path")
    parser.add_argument("draft", metavar="DRAFT", help="draft model: a known name or a GGUF path")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: it loads llama.cpp, which `specdash --help` need not pay for.
    from specdash.models.compat import check_pair

    with fetch_progress_bar() as bar:
        target = resolve_model(args.target, progress=bar)
        draft = resolve_model(args.draft, progress=bar)
    report = check_pair(target, draft)

    out = stdout_console()
    out.print(f"target {target}\ndraft  {draft}")
    width = max(len(r.name) for r in report.rules)
    for rule in report.rules:
        line = Text()
        line.append("PASS" if rule.passed else "FAIL", style="bold green" if rule.passed else "bold red")
        line.append(f"  {rule.name:<{width}}  {rule.evidence}")
        out.print(line)
    for role, path in (("target", target), ("draft ", draft)):
        out.print(f"{role} {_rollback(path)}", soft_wrap=True)
    from specdash.engine import repack

    out.print(f"weights repack {repack.resolve().label()} (specdash doctor says more)", soft_wrap=True)
    if report.compatible:
        out.print(Text("compatible: the draft can speculate for the target", style="green"))
        return 0
    out.print(Text(f"NOT compatible: {len(report.failed())} rule(s) failed", style="red"))
    if report.translatable:
        from specdash.models.compat import translation_note

        ratio = Path(draft).stat().st_size / max(Path(target).stat().st_size, 1)
        out.print(Text(f"specdash {translation_note(ratio)} (refuse with --no-translate)", style="yellow"))
    return 1


def _rollback(path: object) -> str:
    """How this model undoes rejected drafts, from its header (rollback_info.explain).
    The engine decides by asking llama.cpp at run time; this is the expectation."""
    from specdash.models.scan import inspect_model

    return inspect_model(str(path)).rollback_text()
