"""`specdash serve`: the engine behind an OpenAI-compatible HTTP server, with the dashboard
on it (or `--headless`). The server itself is specdash/serve/; this wires it to the CLI."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from specdash.commands.common import add_engine_arguments, add_metrics_names, load_settings, stderr_progress, ui_prefs
from specdash.engine.settings import LIMIT
from specdash.contract.errors import SpecdashError
from specdash.contract.hosts import LOOPBACK_NAMES
from specdash.serve.gate import check_host, check_origin

API_KEY_ENV = "SPECDASH_API_KEY"
# An assistant's prompts (a repository map, open files, a growing chat) run to several
# thousand tokens; 16k holds them with room to answer, and costs ~450 MB of KV for the
# default 1.5B target (28 KB a token) plus ~200 MB for its draft. Below the Qwen2.5-Coder
# models' own 32k.
SERVE_CTX = 16384
# --max-body's default: a context's worth of JSON text (a token is ~4 characters, 6 bytes
# escaped, a few messages repeat a turn), never below aiohttp's own 1 MiB.
BODY_PER_POSITION = 64
BODY_FLOOR = 1024 ** 2


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the engine to OpenAI clients (chat and completions) and watch it in the dashboard",
        description="Start the speculative engine behind an OpenAI-compatible HTTP server "
        "(/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /props, /slots) and "
        "open the dashboard on the traffic it serves: every key works on the requests being served. "
        "Up to --parallel requests share one target batch per step, each drafting its own copies with K "
        "chosen for the batch; the rest wait, first in first out.",
        epilog=f"Clients: base_url http://HOST:PORT/v1 and any api_key (the key set with --api-key or "
        f"${API_KEY_ENV} when there is one). It listens on 127.0.0.1 unless --host says otherwise; any other "
        f"address needs an API key. Per request, llama-server's keys speculative.n_max, speculative.p_min and "
        f"speculative.types (openai SDK: extra_body) override the server's K ceiling, cut and drafter.",
    )
    add_engine_arguments(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                   "needs an API key)")
    g.add_argument("--port", type=int, default=8080, metavar="N", help="port (default 8080; 0 picks a free one)")
    g.add_argument("--api-key", metavar="KEY", help=f"require this key (Authorization: Bearer KEY) on every "
                   f"route but /health and /metrics (default ${API_KEY_ENV})")
    g.add_argument("--allowed-host", action="append", default=[], type=_checked(check_host), metavar="NAME",
                   help="also accept requests whose Host is NAME (a reverse proxy's public name); repeat for "
                   "more. Loopback names and the --host address are always accepted; any other Host is a 403 "
                   "(a DNS-rebinding page sends its own name)")
    g.add_argument("--cors", action="append", default=[], type=_checked(check_origin), metavar="ORIGIN",
                   help="let web pages at ORIGIN (scheme://host[:port], or *) call the server, with CORS "
                   "headers and preflights; repeat for more. Without it a request with another Origin is a 403")
    g.add_argument("--max-waiting", type=_count(1), default=64, metavar="N",
                   help="requests that may wait for the batch (default 64); one more is a 429 with Retry-After")
    g.add_argument("--max-body", type=_count(1), default=None, metavar="BYTES",
                   help="largest request body (default 64 bytes per --ctx position, at least 1 MiB); a larger "
                   "one is a 413")
    g.add_argument("--timeout", type=_seconds, default=600.0, metavar="S",
                   help="seconds a request may wait and run in all (default 600, as llama-server); past it a "
                   "stream ends with an error event, and a whole answer is a 504")
    g.add_argument("--send-timeout", type=_seconds, default=30.0, metavar="S",
                   help="seconds a streamed answer may wait for its client to read (default 30); past it "
                   "the client is dropped and its request cancelled, so a stalled reader holds no socket")
    g.add_argument("--headless", action="store_true", help="no dashboard: log to stderr (a service, a box "
                   "without a terminal); `specdash attach URL` watches and steers it")
    g.add_argument("--parallel", default="auto", type=parse_parallel, metavar="N|auto",
                   help=f"requests decoded together in one target batch, 1-{MAX_PARALLEL} (default auto: "
                   f"what this machine's batch costs say pays, measured at start, up to {AUTO_PARALLEL}; 1 where "
                   "batches cost as much as their tokens one by one). Batched requests draft copies only "
                   "(lookup, suffix): a draft model drafts one request at a time")
    g.add_argument("--record", metavar="FILE", help="record every event for `specdash replay`")
    g.add_argument("--theme", metavar="NAME", help="dashboard colour theme (as `specdash --theme`)")
    g.add_argument("--screenshots", metavar="DIR", help="folder for `s` screenshots")
    add_metrics_names(g)
    p.set_defaults(func=run)


# --parallel's range; auto measures widths up to AUTO_PARALLEL (each a sequence of its own in
# the target's context: --ctx positions each, so the KV cache grows with it).
MAX_PARALLEL = 16
AUTO_PARALLEL = 4


def parse_parallel(text: str) -> int | None:
    """--parallel: a count 1..MAX_PARALLEL, or auto (None)."""
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PARALLEL:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of requests 1..{MAX_PARALLEL}, or auto")
    return n


def _checked(check: Any) -> Any:
    def parse(text: str) -> Any:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _count(least: int) -> Any:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = least - 1
        if n < least:
            raise argparse.ArgumentTypeError(f"{text!r}: a whole number, {least} or more")
        return n
    return parse


def _seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = 0.0
    if not 0 < s < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds above 0")
    return s


def server_settings(args: argparse.Namespace) -> tuple[str, int, str | None]:
    """(host, port, api key) checked: the security rule fails before any model loads."""
    host, port = args.host, args.port
    if not 0 <= port <= 65535:
        raise SpecdashError(f"--port {port}: must be a port number 0..65535")
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if args.api_key is not None and not args.api_key.strip():
        raise SpecdashError("--api-key: the key is empty")
    if host not in LOOPBACK_NAMES and not key:
        raise SpecdashError(f"--host {host}: serving beyond this machine needs an API key "
                            f"(--api-key KEY or ${API_KEY_ENV}); or keep the default --host 127.0.0.1")
    return host, port, key


def run(args: argparse.Namespace) -> int:
    from specdash.monitor.metrics_exporter import MetricsExporter
    from specdash.serve.gate import Gate
    from specdash.serve.http import Limits, ServerThread, make_app
    from specdash.serve.link import EngineLink
    from specdash.serve.queue import ServeQueue

    host, port, key = server_settings(args)
    config = load_settings(args)
    settings = config.engine
    if not args.headless:
        from specdash.commands.dashboard import check_theme

        check_theme(args.theme or config.ui.theme)  # before the port is taken and models load
    if "ctx" not in vars(args) and settings.ctx == LIMIT["ctx"].default:
        settings = settings.replace(ctx=SERVE_CTX)
    queue = ServeQueue()
    exporter = MetricsExporter(None, names=args.metrics_names)
    sources: list[Any] = []

    def send(cmd: Any) -> None:
        if not sources:
            raise SpecdashError("the engine is not running")
        sources[-1].send(cmd)

    link = EngineLink(queue, exporter, settings.ctx, send=send, aliases=(settings.target,), parallel=args.parallel,
                      # --max-tokens: the cap for requests that send none;
                      # otherwise they may run to the end of the context, as OpenAI's do.
                      max_tokens=settings.max_tokens if "max_tokens" in vars(args) else None)
    gate = Gate(bound=host, allowed_hosts=frozenset(args.allowed_host), cors=frozenset(args.cors))
    limits = Limits(max_waiting=args.max_waiting, timeout=args.timeout, send_timeout=args.send_timeout,
                    max_body=args.max_body or max(BODY_FLOOR, BODY_PER_POSITION * settings.ctx))
    server = ServerThread(make_app(link, key, gate, limits), host, port)
    server.start()  # before any model loads: a taken port is one line at once
    print(f"specdash serve: listening on {server.url} (OpenAI API at {server.url}/v1); "
          f"loading {settings.target}", file=sys.stderr, flush=True)
    cut = [0, 0]

    def cancel_all() -> None:
        """Cut what runs and waits, each client told why; counted for the last line.
        Called as the stop begins (before the source closes and fails them itself) and
        once more at the end."""
        running, waiting = queue.cancel_all()
        cut[0], cut[1] = cut[0] + running, cut[1] + waiting

    try:
        if args.headless:
            code = _headless(args, config, settings, queue, link, sources, cancel_all)
        else:
            code = _dashboard(args, config, settings, queue, link, sources, cancel_all)
    finally:
        cancel_all()
        running, waiting = cut
        server.stop()
        link.close()
        print(f"specdash serve: stopped after {link.served} requests; cancelled {waiting + running} "
              f"({running} running, {waiting} waiting)", file=sys.stderr, flush=True)
    return code


def sessions(args: argparse.Namespace) -> Any:
    """The session factory: a target context with a sequence per request --parallel allows."""
    from specdash.sources.session import Session

    return functools.partial(Session, n_seq=args.parallel or AUTO_PARALLEL)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _headless(args: argparse.Namespace, config: Any, settings: Any, queue: Any, link: Any, sources: list[Any],
              cancel_all: Callable[[], None]) -> int:
    from specdash.serve.log import EventLog
    from specdash.sources.embedded import EmbeddedSource

    log = EventLog(sys.stderr, stderr_progress())
    listeners = [link.feed, log.feed]
    if args.record:
        from specdash.records.recording import Recorder

        recorder = Recorder(args.record, extra={"command": "serve"})
        listeners.append(recorder)
    source = EmbeddedSource(sessions(args), settings, queue, on_session=link.on_session, health=config.health)
    sources.append(source)

    def emit(ev: Any) -> None:
        for listener in listeners:
            listener(ev)

    # A service manager stops a service with SIGTERM: the same clean stop as Ctrl-C (and
    # the only one where a parent started it with SIGINT ignored, as a background job).
    signal.signal(signal.SIGTERM, _interrupt)
    source.start(emit)
    try:
        while not source.finished.wait(0.5):
            pass
        return 1 if source.error is not None else 0
    except KeyboardInterrupt:
        print("specdash serve: stopping", file=sys.stderr, flush=True)
        cancel_all()
        return 0
    finally:
        source.close()
        if args.record:
            recorder.close()


def _dashboard(args: argparse.Namespace, config: Any, settings: Any, queue: Any, link: Any,
               sources: list[Any], cancel_all: Callable[[], None]) -> int:
    from specdash.commands.dashboard import QUIT_GRACE_S, attach_outputs
    from specdash.config import find_config_path
    from specdash.sources.embedded import EmbeddedSource
    from specdash.tui.app import DashboardOptions, SpecdashApp
    from specdash.tui.terminal import run_app

    keymap, mouse = ui_prefs(args, config)
    options = DashboardOptions(
        settings=settings, prompt=None, workload=[], theme=args.theme or config.ui.theme,
        refresh=config.ui.refresh, screenshots_dir=args.screenshots or config.ui.screenshots_dir,
        config_path=find_config_path(getattr(args, "config", None)), model_dirs=tuple(config.ui.model_dirs),
        health=config.health,
    )

    def source(launched: Any, prompts: Any) -> EmbeddedSource:
        made = EmbeddedSource(sessions(args), launched or settings, queue.adopt(prompts), on_session=link.on_session,
                              health=config.health, listener=link.feed)
        sources.append(made)
        return made

    app = SpecdashApp(options, source_factory=source)
    attach_outputs(app, args, config.ui.record_dir)
    sys.setswitchinterval(0.0005)  # as the dashboard: the engine thread gets the GIL back at once
    # A service manager's stop (SIGTERM) quits as `q` does: the handler runs in the main
    # thread, Textual's, between its steps; then run() cancels what runs and waits, and
    # each client is told (without it the process dies and clients see a reset).
    def terminate(signum: int, frame: Any) -> None:
        cancel_all()
        app.exit()

    signal.signal(signal.SIGTERM, terminate)
    code = run_app(app, keymap, mouse)
    engine = app.engine_thread
    if engine is not None and engine.is_alive():
        engine.join(QUIT_GRACE_S)
    return code
