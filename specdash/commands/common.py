"""Flags shared by `specdash` (dashboard), `run` and `bench`, and how they become settings.

Every engine flag defaults to None so that a config file's value wins unless the flag
was given; specdash.config.apply_overrides merges them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdash.errors import SpecdashError


def _int_at_least(lo: int, what: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer >= {lo}, got {text!r}")
        if v < lo:
            raise argparse.ArgumentTypeError(f"{what} must be an integer >= {lo}, got {v}")
        return v

    return parse


def _float_in(lo: float, hi: float, what: str, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}")
        if not ((lo < v) if lo_open else (lo <= v)) or v > hi:
            lo_s = f"{lo} <" if lo_open else f"{lo} <="
            raise argparse.ArgumentTypeError(f"{what} must satisfy {lo_s} {what} <= {hi}, got {v}")
        return v

    return parse


def add_engine_arguments(parser: argparse.ArgumentParser, *, with_k: bool = True) -> None:
    """with_k=False lets a command define its own --k (bench takes a list).

    Flags not given are absent from the namespace (SUPPRESS), not None: a subcommand's
    parser would otherwise overwrite `specdash --draft lookup run ...` with its own None."""
    g = parser.add_argument_group("models and speculation", argument_default=argparse.SUPPRESS)
    g.add_argument("--config", metavar="PATH", help="TOML settings file (default: $SPECDASH_CONFIG, "
                   "then ~/.config/specdash/config.toml); flags override it")
    g.add_argument("--target", metavar="M", help="target model: a registry name (see `specdash models "
                   "list`) or a GGUF path (default qwen2.5-coder-1.5b)")
    g.add_argument("--draft", metavar="M", help="draft source: a model name or GGUF path, or lookup, "
                   "suffix, chain, none (default qwen2.5-coder-0.5b)")
    if with_k:
        g.add_argument("--k", type=_int_at_least(0, "K"), metavar="N", help="draft tokens per step; 0 = plain decoding (default 4)")
    g.add_argument("--adaptive", action=argparse.BooleanOptionalAction,
                   help="let the engine choose K (and K=0) from measured costs and acceptance")
    g.add_argument("--experts", type=int, metavar="N",  # the range depends on the model: checked on load
                   help="MoE targets: active experts per token (1..expert_count)")
    s = parser.add_argument_group("sampling", argument_default=argparse.SUPPRESS)
    s.add_argument("--temp", type=_float_in(0, 5, "temperature"), metavar="T", help="0 = greedy (default 0)")
    s.add_argument("--top-k", type=_int_at_least(0, "top-k"), metavar="N", help="0 = off (default)")
    s.add_argument("--top-p", type=_float_in(0, 1, "top-p", lo_open=True), metavar="P", help="1 = off (default)")
    s.add_argument("--seed", type=int, metavar="S", help="sampling seed (default: random)")
    r = parser.add_argument_group("runtime", argument_default=argparse.SUPPRESS)
    r.add_argument("--max-tokens", type=_int_at_least(1, "max-tokens"), metavar="N", help="tokens to generate per prompt (default 256)")
    r.add_argument("--threads", type=_int_at_least(1, "threads"), metavar="N", help="CPU threads (default: physical cores)")
    r.add_argument("--ctx", type=_int_at_least(64, "ctx"), metavar="N", help="context size in tokens (default 4096)")
    r.add_argument("--raw", action="store_true", help="send the prompt as is, without the model's chat template")


def load_settings(args: argparse.Namespace):
    """Config file (if any) overridden by the flags that were given -> Config."""
    from specdash.config import Config, apply_overrides, find_config_path, load_config

    path = find_config_path(getattr(args, "config", None))
    config = load_config(path) if path else Config()
    return apply_overrides(config, args)


def read_prompt(args: argparse.Namespace) -> str | None:
    """--prompt TEXT or --prompt-file FILE ('-' = stdin); None when neither was given."""
    if getattr(args, "prompt_file", None):
        if args.prompt_file == "-":
            return sys.stdin.read()
        path = Path(args.prompt_file)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SpecdashError(f"--prompt-file {path}: no such file")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecdashError(f"--prompt-file {path}: cannot read it ({exc.__class__.__name__}: {exc})")
        if not text.strip():
            raise SpecdashError(f"--prompt-file {path}: the file is empty")
        return text
    if getattr(args, "prompt", None) is not None:
        if not args.prompt.strip():
            raise SpecdashError("--prompt: the prompt is empty")
        return args.prompt
    return None


def add_prompt_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    g = parser.add_mutually_exclusive_group(required=required)
    g.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    g.add_argument("--prompt-file", metavar="FILE", help="read the prompt from FILE ('-' = stdin)")


def stderr_progress():
    """A progress callback for model fetch/load that draws on stderr: a bar on a terminal,
    a line per phase and per 10% when piped (CI logs stay short)."""
    interactive = sys.stderr.isatty()
    last = {"phase": None, "decile": -1}

    def progress(message: str, fraction: float | None) -> None:
        if fraction is None or not message.startswith("fetching"):
            return  # loading is quick; only a fetch is worth drawing
        if interactive:
            bar = "#" * int(fraction * 30)
            print(f"\r\033[K{message} [{bar:<30}] {fraction:4.0%}", end="", file=sys.stderr, flush=True)
            if fraction >= 1.0:
                print(file=sys.stderr)
            return
        phase, decile = message.split(":")[0] + message.split(":")[1].split()[0], int(fraction * 10)
        if phase != last["phase"] or decile != last["decile"]:
            print(f"{message} ({fraction:.0%})", file=sys.stderr, flush=True)
        last["phase"], last["decile"] = phase, decile

    return progress
