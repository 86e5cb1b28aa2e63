"""`specdash web [URL ...]`: `specdash attach` (one server's panels, or the fleet) in a
browser, through textual-serve. The server is specdash/web/; this wires it to the CLI."""

from __future__ import annotations

import argparse
import json
import os
import secrets

from specdash.commands.attach import add_poll_arguments, parse_headers
from specdash.commands.common import say, ui_prefs
from specdash.commands.serve import API_KEY_ENV, server_settings
from specdash.contract.errors import SpecdashError

DEFAULT_PORT = 8765
DEFAULT_URL = "http://127.0.0.1:8080"  # `specdash serve`'s default address


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "web",
        help="attach or the fleet in a browser (textual-serve): a live view to share without a terminal",
        description="Serve `specdash attach URL ...` as a web page: one URL shows that server's panels, "
        "several the fleet table. Each browser tab runs its own attach process; closing a tab ends it "
        "and nothing else (the servers it watches go on). It never loads a model.",
        epilog=f"From a laptop: ssh -L {DEFAULT_PORT}:127.0.0.1:{DEFAULT_PORT} BOX, run `specdash web` on "
        f"BOX, open http://127.0.0.1:{DEFAULT_PORT}/. It listens on 127.0.0.1 unless --host says otherwise; "
        f"any other address needs a key (--api-key or ${API_KEY_ENV}), opened once as /?key=KEY.",
    )
    p.add_argument("urls", nargs="*", metavar="URL", default=[DEFAULT_URL],
                   help=f"servers to watch (default {DEFAULT_URL}, a local `specdash serve`)")
    g = p.add_argument_group("web server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                   "needs a key)")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="N",
                   help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    g.add_argument("--api-key", metavar="KEY", help=f"require this key to open the page (default ${API_KEY_ENV}; "
                   "with --header and no key, a key is made for the run and printed: the page carries "
                   "those credentials, so no other local user may open it)")
    g.add_argument("--max-tabs", type=int, default=8, metavar="N",
                   help="browser tabs open at once, each its own attach process (default 8; more get a 503)")
    a = p.add_argument_group("what each tab's attach gets (as `specdash attach`)")
    add_poll_arguments(a)
    a.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="an HTTP header for the watched servers, e.g. \"Authorization: Bearer KEY\" "
                   "(passed to each tab's process in its environment, never on a command line)")
    a.add_argument("--config", metavar="PATH", help="TOML settings file ([health], [keys], [ui])")
    a.add_argument("--screenshots", metavar="DIR", help="folder for `s` screenshots, on this machine")
    p.set_defaults(func=run)


def attach_argv(args: argparse.Namespace) -> list[str]:
    """The arguments each tab's `specdash attach` gets, checked now: a bad URL, header or
    config is this command's one-line error, not a broken page later."""
    from specdash.monitor.remote.client import parse_url

    for raw in args.urls:
        parse_url(raw)
    parse_headers(args.header)
    argv = list(args.urls)
    argv += ["--interval", str(args.interval), "--window", str(args.window), "--timeout", str(args.timeout)]
    for flag, value in (("--config", args.config), ("--screenshots", args.screenshots)):
        if value is not None:
            argv += [flag, value]
    for header in args.header:
        argv += ["--header", header]
    ui_prefs(args)  # the config each tab reads: a bad file or [keys] table fails here, exit 2
    return argv


def run(args: argparse.Namespace) -> int:
    from specdash.monitor.remote.client import redact_url

    host, port, key = server_settings(args)
    if args.max_tabs < 1:
        raise SpecdashError(f"--max-tabs {args.max_tabs}: must be at least 1")
    argv = attach_argv(args)
    made_key = key is None and bool(args.header)
    if made_key:
        # The page drives and steers with the operator's --header credentials: a key-less
        # page on 127.0.0.1 would lend them to every user of this machine (Jupyter's rule).
        key = secrets.token_urlsafe(18)
    try:
        from specdash.web import ARGV_ENV
        from specdash.web.server import WebServer
    except ImportError as exc:  # textual-serve is a dependency; a broken install says so
        raise SpecdashError(f"specdash web needs textual-serve ({exc}); reinstall: pip install -e .") from None
    # Each tab's process inherits this environment (textual-serve copies it at spawn).
    os.environ[ARGV_ENV] = json.dumps(argv)
    # Never a URL's password in the page's title (every viewer's HTML) or on stderr.
    title = redact_url(args.urls[0]) if len(args.urls) == 1 else f"a fleet of {len(args.urls)}"

    try:
        server = WebServer(host=host, port=port, key=key, title=title, say=say, max_tabs=args.max_tabs)
        server.shown_key = made_key
        server.run()
    except OSError as exc:
        raise SpecdashError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None
    say("web view stopped")
    return 0
