"""One browser tab's process (started by `specdash web`, specdash/web/server.py): `specdash attach` drawing on the page.

textual-serve reads the page from this process's stdout as framed packets, so a stray
byte there (a print, a native library's message) would garble every frame after it. The
page gets a file descriptor of its own, and fd 1, `sys.stdout` and anything written to them
go to stderr, which textual-serve collects apart from the page.

The parent passes attach's arguments in $SPECDASH_WEB_ARGV (a JSON list): headers may carry
a server's key, and an environment is not on the process list as a command line is.
"""

from __future__ import annotations

import json
import os
import sys

from specdash.web import ARGV_ENV


def isolate_stdout() -> int:
    """Give the page its own descriptor and point fd 1 and sys.stdout at stderr.
    Returns the page's descriptor (Textual's web driver writes to sys.__stdout__)."""
    sys.stdout.flush()
    page_fd = os.dup(1)
    os.dup2(2, 1)
    setattr(sys, "__stdout__", os.fdopen(page_fd, "w", buffering=1, encoding="utf-8", closefd=False))
    sys.stdout = sys.stderr
    return page_fd


def main() -> int:
    isolate_stdout()
    try:
        argv = json.loads(os.environ[ARGV_ENV])
    except (KeyError, ValueError):
        print(f"specdash web: ${ARGV_ENV} is missing or not JSON; this process is started by `specdash web`",
              file=sys.stderr)
        return 2
    from specdash.cli import main as cli_main

    return cli_main(["attach", *argv])


if __name__ == "__main__":
    raise SystemExit(main())
