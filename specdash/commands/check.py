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
            "A target whose GGUF keeps a multi-token-prediction head drafts for itself: "
            "`check TARGET` (or `check TARGET mtp`) says whether its head can draft here. "
            "Exit 0 compatible, 1 not (by llama.cpp's rules), 2 bad input."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help="target model: a known name or a GGUF path")
    parser.add_argument("draft", metavar="DRAFT", nargs="?",
                        help="draft model: a known name or a GGUF path; `mtp` (or nothing) for the "
                             "target's own multi-token-prediction head")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: it loads llama.cpp, which `specdash --help` need not pay for.
    from specdash.models.compat import check_pair

    with fetch_progress_bar() as bar:
        target = resolve_model(args.target, progress=bar)
        if args.draft in (None, "mtp"):
            return _check_head(target, named=args.draft == "mtp")
        draft = resolve_model(args.draft, progress=bar)
    report = check_pair(target, draft)

    out = stdout_console()
    out.print(f"target {target}\ndraft  {draft}")
    head = _head_line(target)
    if head:
        out.print(f"target {head}", soft_wrap=True)
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
    out.print(f"target {_kept(target)}", soft_wrap=True)
    if report.compatible:
        out.print(Text("compatible: the draft can speculate for the target", style="green"))
        return 0
    out.print(Text(f"NOT compatible: {len(report.failed())} rule(s) failed", style="red"))
    if report.translatable:
        from specdash.models.compat import translation_note

        ratio = Path(draft).stat().st_size / max(Path(target).stat().st_size, 1)
        out.print(Text(f"specdash {translation_note(ratio)} (refuse with --no-translate)", style="yellow"))
    return 1


def _head_line(target: object) -> str:
    """"MTP head: N layer(s) (...)" for a target that keeps one, else ""."""
    from specdash.models.mtp_info import mtp_head

    head = mtp_head(str(target))
    if head.layers:
        return f"{head.describe()}: it drafts for itself (--draft mtp), no draft model needed"
    return head.describe()


def _check_head(target: object, *, named: bool) -> int:
    """`check TARGET [mtp]`: can the target draft with its own MTP head here? Exit 0 yes,
    1 no (the one-line reason); without a head and without `mtp` named, a usage error."""
    from specdash.engine.drafters.mtp import MtpUnavailable, staging_api
    from specdash.contract.errors import SpecdashError
    from specdash.models.mtp_info import mtp_head

    head = mtp_head(str(target))
    if not head.layers and not named:
        raise SpecdashError(f"check {target}: give a DRAFT model to check against it; the target has no "
                            "MTP head to draft for itself")
    out = stdout_console()
    out.print(f"target {target}\ndraft  mtp (the target's own head)")
    out.print(f"target {_rollback(target)}", soft_wrap=True)
    out.print(f"target {_kept(target)}", soft_wrap=True)
    why = ""
    if not head.layers:
        why = (f"{Path(str(target)).name}: {head.describe()}" if head.declared else
               f"{Path(str(target)).name} has no MTP head (nextn_predict_layers is absent or 0; many "
               "published GGUFs drop the head)")
    else:
        out.print(f"target {head.describe()}", soft_wrap=True)
        try:
            staging_api()
        except MtpUnavailable as exc:
            why = str(exc)
    if why:
        out.print(Text(f"mtp unavailable: {why}", style="red"), soft_wrap=True)
        return 1
    cost = head.relative_cost
    priced = f" (a drafted token reads {cost:.0%} of a target step's weights)" if cost is not None else ""
    out.print(Text(f"compatible: the target drafts with its own MTP head{priced}", style="green"), soft_wrap=True)
    return 0


def _rollback(path: object) -> str:
    """How this model undoes rejected drafts, from its header (rollback_info.explain).
    The engine decides by asking llama.cpp at run time; this is the expectation."""
    from specdash.models.scan import inspect_model

    return inspect_model(str(path)).rollback_text()


def _kept(target: object) -> str:
    """The cost profile a run of the target would start from (costs/store.describe_kept)."""
    from specdash.costs.store import describe_kept

    return describe_kept(Path(str(target)))
