"""`specdash attach URL [URL ...]`: watch running servers (llama-server, vLLM, another
specdash's --metrics-port).

    --once [--json]    one snapshot per server (two polls `--interval` apart, so rates
                       exist), then exit: 0 when a server answered and none is in a health
                       alarm, 1 when one that answered is, 2 when none answered
    --watch [--json]   one line per server per interval until Ctrl-C (or --count lines;
                       then 1 when a server's last line is a health alarm, else 0)

Each row carries the server's health verdict (`health`, and `alarms`: what each firing
rule read; specdash/monitor/health.py). --once sees one interval: rules that need a running
history say `unknown` there, and only a floor set in the config ([health]
collapse_floor) can fire; --watch --count N judges N intervals.
    --prompt TEXT      drive mode: send TEXT to the server's completion endpoint; with
                       --json the event stream is printed as JSON lines (one URL), with
                       --headless the text and a summary per prompt; --prompt and
                       --prompt-file repeat (headless: each prompt in turn), --record FILE
                       records what came back, for `specdash compare` and `replay`
    (default)          the dashboard: one server's panels, or the fleet table
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdash.contract.errors import SpecdashError

INTERVAL_RANGE = (0.1, 60.0)
TIMEOUT_RANGE = (0.1, 120.0)
WINDOW_RANGE = (1.0, 3600.0)


def _seconds(flag: str, lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be seconds, {lo:g}..{hi:g}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: must be seconds, {lo:g}..{hi:g}")
        return value
    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number >= 1")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "attach",
        help="watch running llama-server / vLLM / specdash servers (one, or a fleet)",
        description=(
            "Attach to running servers through /metrics (and, for llama-server, /slots and "
            "/props). One URL opens the dashboard's panels on it; several open the fleet table. "
            "llama-server must run with --metrics. --once/--watch print snapshots instead; "
            "--json makes them JSON (vLLM-style field names), each with the server's health verdict. "
            "Exit 2 when no server answered; --once (and --watch --count) exit 1 when a server that "
            "answered is in a health alarm."
        ),
    )
    p.add_argument("urls", nargs="+", metavar="URL", help="server base URL, e.g. http://127.0.0.1:8080")
    add_poll_arguments(p)
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="an HTTP header for every request, e.g. \"Authorization: Bearer KEY\" "
                   "(repeatable; values never appear in output, screenshots or recordings)")
    p.add_argument("--prompt", action="append", metavar="TEXT",
                   help="drive mode: send TEXT to the server's completion endpoint and stream it "
                   "(repeatable with --headless or --json: the prompts run one after another)")
    p.add_argument("--prompt-file", action="append", metavar="FILE",
                   help="drive mode: a prompt from FILE, as --prompt (repeatable; '-' = stdin)")
    p.add_argument("--headless", action="store_true",
                   help="drive mode without the dashboard: the text on stdout, a summary line per prompt "
                   "on stderr (as `specdash run`); with --record, a recording for `specdash compare`")
    p.add_argument("--max-tokens", type=_positive_int, default=256, metavar="N",
                   help="drive mode: tokens to generate (default 256)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="print one snapshot per server and exit")
    mode.add_argument("--watch", action="store_true", help="print a snapshot per server every interval")
    p.add_argument("--count", type=_positive_int, metavar="N",
                   help="with --watch: stop after N intervals")
    p.add_argument("--config", metavar="PATH", help="TOML settings file: its [health] thresholds judge "
                   "every server (default: $SPECDASH_CONFIG, then ~/.config/specdash/config.toml)")
    p.add_argument("--record", metavar="FILE", help="record what the dashboard shows, or in headless drive mode "
                   "(--headless, --json) what the server streamed, for `specdash replay` and `specdash compare`")
    p.add_argument("--screenshots", metavar="DIR", help="folder for `s` screenshots (default ~/specdash-screenshots)")
    p.add_argument("--json", action="store_true",
                   help="JSON: with --once/--watch one object per server per line (the `server` event "
                   "of specdash/contract/events.py); with --prompt the event stream as JSON lines")
    p.set_defaults(func=run)


def add_poll_arguments(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How servers are polled: attach's flags, and `specdash web`'s, which passes them on."""
    group.add_argument("--interval", type=_seconds("--interval", *INTERVAL_RANGE), default=1.0, metavar="SECONDS",
                       help="seconds between polls of each server, 0.1..60 (default 1)")
    group.add_argument("--window", type=_seconds("--window", *WINDOW_RANGE), default=10.0, metavar="SECONDS",
                       help="rates are over this sliding window of polls (default 10)")
    group.add_argument("--timeout", type=_seconds("--timeout", *TIMEOUT_RANGE), default=5.0, metavar="SECONDS",
                       help="read timeout per request (default 5; connecting gives up after 2)")


def parse_headers(items: list[str]) -> dict[str, str]:
    from specdash.monitor.remote.client import parse_header

    headers: dict[str, str] = {}
    for i, item in enumerate(items, 1):
        name, value = parse_header(item, i)
        headers[name] = value
    return headers


def prompts_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(title, text) of every --prompt and --prompt-file, in the order given on the line
    (argparse keeps each flag's own order; prompts before files)."""
    from specdash.commands.common import read_prompt_file

    out: list[tuple[str, str]] = []
    texts = getattr(args, "prompt", None) or []
    for text in texts:
        if not text.strip():
            raise SpecdashError("--prompt '': give the text to send")
        out.append(("prompt" if len(texts) == 1 else f"prompt {len(out) + 1}", text))
    for name in getattr(args, "prompt_file", None) or []:
        out.append((Path(name).name if name != "-" else "stdin", read_prompt_file(name)))
    return out


def build_sources(args: argparse.Namespace, *, with_prompt: bool = False,
                  prompts: list[tuple[str, str]] | None = None) -> list[Any]:
    """One RemoteSource per distinct URL (bad URLs and headers raise SpecdashError).
    with_prompt: the dashboard's one prompt (`prompts`, read from args when not given),
    sent once the server answers."""
    from specdash.monitor.remote.client import parse_url
    from specdash.sources.remote import RemoteSource

    from specdash.config import find_config_path, load_config

    headers = parse_headers(args.header)
    if not with_prompt:
        prompts = []
    elif prompts is None:
        prompts = prompts_of(args)
    path = find_config_path(getattr(args, "config", None))
    health = load_config(path).health if path else None
    seen: set[str] = set()
    sources = []
    for raw in args.urls:
        url = parse_url(raw)
        if url.base in seen:
            continue
        seen.add(url.base)
        sources.append(RemoteSource(
            raw, headers=headers, interval=args.interval, window=args.window,
            prompt=prompts[0][1] if prompts else None, prompt_title=prompts[0][0] if prompts else "",
            max_tokens=args.max_tokens, read_timeout=args.timeout,
            health=health))
    return sources


def run(args: argparse.Namespace) -> int:
    prompts = prompts_of(args)
    headless = bool(prompts) and (args.json or args.headless)
    if args.json and not (args.once or args.watch or prompts):
        raise SpecdashError("--json needs --once, --watch or --prompt (the dashboard is not JSON)")
    if args.headless and not prompts:
        raise SpecdashError("--headless is drive mode without the dashboard: give --prompt TEXT or --prompt-file FILE")
    if args.count is not None and not args.watch:
        raise SpecdashError("--count needs --watch")
    if prompts and (args.once or args.watch):
        raise SpecdashError("--prompt drives generation; use it without --once/--watch")
    if args.record and (args.once or args.watch):
        raise SpecdashError("--record records the dashboard or drive mode (--prompt); not --once/--watch")
    if len(prompts) > 1 and not headless:
        raise SpecdashError(f"{len(prompts)} prompts: the dashboard takes one (`n` types the next); "
                            "several run one after another with --headless or --json")
    dashboard = not (args.once or args.watch or headless)
    sources = build_sources(args, with_prompt=dashboard, prompts=prompts)
    try:
        if args.once:
            return once(sources, args)
        if args.watch:
            return watch(sources, args)
        if headless:
            if len(sources) != 1:
                raise SpecdashError(f"--prompt with {'--json' if args.json else '--headless'} takes one URL, "
                                    f"got {len(sources)}")
            return drive(sources[0], prompts, args)
        return open_dashboard(sources, args)
    finally:
        for source in sources:
            source.close()


# --- headless ---


def _first_two_polls(source: Any, interval: float) -> None:
    row = source.poll_now()
    if row.state == "up":
        time.sleep(interval)
        source.poll_now()


def snapshot_rows(sources: list[Any], interval: float) -> list[Any]:
    """Every server polled twice, `interval` apart, all servers at once; the rows."""
    threads = [threading.Thread(target=_first_two_polls, args=(s, interval), daemon=True) for s in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [s.server for s in sources]


def text_row(row: Any) -> str:
    """One server as a plain text line (no Textual)."""
    def f(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)
    if row.state != "up":
        seen = "never seen" if row.last_seen is None else f"last seen {time.time() - row.last_seen:.0f}s ago"
        return f"{row.url}  {row.state} · {seen} · {row_error(row)}"
    run_ = "-" if row.requests_running is None else row.requests_running
    wait = "-" if row.requests_waiting is None else row.requests_waiting
    return (f"{row.url}  {row.backend} {row.model or '?'}  busy/queued {run_}/{wait}  "
            f"gen {f(row.generation_tokens_per_s, '.1f')} tok/s  prompt {f(row.prompt_tokens_per_s, '.1f')} tok/s  "
            f"acceptance {f(row.acceptance_rate, '.1%')}  mean len {f(row.mean_accepted_length, '.2f')}  "
            f"tok/step {f(row.tokens_per_step, '.2f')}  errors {row.errors}  resets {row.resets}  "
            f"health {row.health or '-'}" + "".join(f"  alarm: {a}" for a in row.alarms)
            + (f"  note: {row.note}" if row.note else ""))


def row_error(row: Any) -> str:
    """A row's error, never empty: a server that is not up says at least that."""
    return row.error or f"{row.url}: {row.state}, no answer read yet"


def _print_row(row: Any, as_json: bool) -> None:
    from specdash.contract.events import to_dict

    print(json.dumps(to_dict(row), ensure_ascii=False) if as_json else text_row(row), flush=True)


def alarm_code(rows: list[Any]) -> int:
    """1 when a server that answered is in a health alarm (said on stderr), else 0."""
    from specdash.monitor.health import is_alarm

    alarming = [row for row in rows if row.state in ("up", "bad") and is_alarm(row.health)]
    for row in alarming:
        print(f"specdash: health {row.health}: {row.url}: {'; '.join(row.alarms)}", file=sys.stderr)
    return 1 if alarming else 0


def once(sources: list[Any], args: argparse.Namespace) -> int:
    rows = snapshot_rows(sources, args.interval)
    for row in rows:
        _print_row(row, args.json)
    for row in rows:
        if row.state != "up":
            print(f"specdash: error: {row_error(row)}", file=sys.stderr)
    if not any(row.state == "up" for row in rows):
        return 2
    return alarm_code(rows)


def watch(sources: list[Any], args: argparse.Namespace) -> int:
    for source in sources:
        source.start(lambda ev: None)
    printed = 0
    reported: dict[str, str] = {}
    next_tick = time.monotonic() + args.interval
    while args.count is None or printed < args.count:
        time.sleep(max(0.0, next_tick - time.monotonic()))
        next_tick += args.interval
        for source in sources:
            row = source.server
            _print_row(row, args.json)
            if row.state != "up" and row.error and reported.get(row.url) != row.error:
                print(f"specdash: {row.error}", file=sys.stderr, flush=True)
            reported[row.url] = row.error if row.state != "up" else ""
        printed += 1
    return alarm_code([source.server for source in sources])


def drive(source: Any, prompts: list[tuple[str, str]], args: argparse.Namespace) -> int:
    """Headless drive mode: every prompt in turn on one server, then exit 0. With --json
    the events as JSON lines (not the polls' rows and deltas: they belong to --watch),
    else the text on stdout and a summary line per prompt on stderr. --record keeps
    everything the source said, polls included, as the dashboard's recording does.
    Exit 2 when the server never answered or refused a prompt, 1 when a prompt failed."""
    import queue

    from specdash.commands.run import summary_line
    from specdash.contract.events import (CountersEvent, NewPrompt, NoticeEvent, ServerEvent, StatusEvent, StepEvent,
                                 Summary, to_dict)

    recorder = _recorder(args, [source]) if args.record else None
    events: queue.Queue[Any] = queue.Queue()
    source.start(events.put)
    for title, text in prompts:
        source.send(NewPrompt(text, title))
    first_state: str | None = None
    done = 0
    try:
        while True:
            ev = events.get()
            if recorder is not None:
                recorder.feed(ev)
            if isinstance(ev, (ServerEvent, CountersEvent)):
                continue
            if isinstance(ev, StatusEvent) and ev.state == "down" and first_state is None:
                print(f"specdash: error: {ev.message}", file=sys.stderr)
                return 2
            if isinstance(ev, StatusEvent):
                first_state = first_state or ev.state
            if args.json:
                print(json.dumps(to_dict(ev), ensure_ascii=False), flush=True)
            elif isinstance(ev, StepEvent):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, Summary):
                print(flush=True)
                print(summary_line(ev), file=sys.stderr, flush=True)
            elif isinstance(ev, NoticeEvent) and ev.level != "info":
                print(f"specdash: {ev.level}: {ev.message}", file=sys.stderr, flush=True)
            if isinstance(ev, Summary):
                done += 1
                if done == len(prompts):
                    return 0
            if isinstance(ev, NoticeEvent) and ev.level == "error" and "prompt" in ev.message:
                return 1
            if isinstance(ev, NoticeEvent) and ev.refused == "prompt":
                return 2
    finally:
        if recorder is not None:
            recorder.close()
            print(f"recorded {recorder.lines} lines to {recorder.path}", file=sys.stderr)


def _recorder(args: argparse.Namespace, sources: list[Any]) -> Any:
    """A Recorder for `--record`. The header names the server's build (llama-server's
    /props build_info), known only once a poll came back: read when the header is
    written, at the first settings event."""
    from specdash.records.recording import Recorder

    def server() -> dict[str, Any]:
        if len(sources) != 1:
            return {}
        props = sources[0].watch.props or {}
        info = {key: props.get(key) for key in ("build_info", "model_path") if isinstance(props.get(key), str)}
        return {"server": {"url": sources[0].url, "backend": sources[0].watch.backend, **info}}

    return Recorder(args.record, extra={"command": "attach", "urls": [s.url for s in sources]}, late_extra=server)


# --- the dashboard ---


def open_dashboard(sources: list[Any], args: argparse.Namespace) -> int:
    from specdash.commands.common import ui_prefs
    from specdash.tui.terminal import run_app

    keymap, mouse = ui_prefs(args)
    return run_app(dashboard_app(sources, args), keymap, mouse)


def dashboard_app(sources: list[Any], args: argparse.Namespace) -> Any:
    """The dashboard on `sources` (RemoteSources, not started). One server: its panels,
    the same as the embedded engine's. Several: the fleet table; Enter opens a server's
    panels, Esc comes back. `--record FILE` records what the dashboard receives."""
    from specdash.tui.app import DashboardOptions, SpecdashApp
    from specdash.tui.app_base import first_then_new
    from specdash.tui.fleet_app import FleetDashboard

    shots = getattr(args, "screenshots", None) or "~/specdash-screenshots"
    app: SpecdashApp
    if len(sources) == 1:
        (source,) = sources
        # `n` while the server is down restarts the source: a new one, with the prompt typed.
        app = SpecdashApp(DashboardOptions(screenshots_dir=shots), local_telemetry=False,
                          source_factory=first_then_new(source, lambda prompts: source.again(prompts.pop_nowait())))
    else:
        app = FleetDashboard(sources, screenshots_dir=shots)
    if getattr(args, "record", None):
        recorder = _recorder(args, sources)
        app.add_listener(recorder)
        app.on_exit_callbacks.append(recorder.close)
    return app
