"""End to end, as a person would: `specdash` in a real terminal (tmux), keys typed, the
screen read back with capture-pane."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)"),
]

STATUS = re.compile(r"▶ running │ .* │ K (\d+) fixed │ T [\d.]+ │ ([\d.]+) tok/s")
EXIT = "SPECDASH-EXIT:"


class Tmux:
    """One tmux server of our own (-L), so nothing else's sessions are touched."""

    def __init__(self, name: str):
        self.socket = name

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "e2e")

    def wait_for(self, predicate, what: str, timeout_s: float = 300.0) -> str:
        # A liveness bound for a loaded 2-core machine; nothing asserts how fast it was.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"never happened: {what}\n--- screen ---\n{self.screen()}")


def status(screen: str) -> tuple[int, float] | None:
    match = STATUS.search(screen)
    return (int(match.group(1)), float(match.group(2))) if match else None


def test_dashboard_in_tmux_plus_then_q(tmp_path, smol_path):
    tmux = Tmux(f"specdash-e2e-{os.getpid()}")
    command = " ".join(shlex.quote(a) for a in [
        sys.executable, "-m", "specdash", "--target", str(smol_path), "--draft", "lookup", "--k", "2",
        "--threads", "1", "--screenshots", str(tmp_path), "--max-tokens", "3000",
        "--prompt", "Write the numbers from 1 to 400, separated by commas.",
    ])
    tmux("new-session", "-d", "-s", "e2e", "-x", "100", "-y", "30",
         f"{command}; echo {EXIT}$?; sleep 120")
    try:
        screen = tmux.wait_for(lambda s: (st := status(s)) is not None and st[1] > 0, "tokens streaming")
        assert status(screen)[0] == 2
        # Every panel's title, once the system hints' toast (up for 10 s where the machine
        # has any, over the bottom right panels) is gone; the run is still going.
        screen = tmux.wait_for(lambda s: all(t in s for t in ("Generation", "Acceptance", "CPU", "Memory")),
                               "every panel on screen")
        assert status(screen) is not None, "the run ended before the checks: a longer prompt is needed"

        tmux("send-keys", "-t", "e2e", "+")
        screen = tmux.wait_for(lambda s: (st := status(s)) is not None and st[0] == 3, "K=3 on the status line")
        assert "K 3 · lookup" in screen  # the K panel's title
        screen = tmux.wait_for(lambda s: (st := status(s)) is not None and st[1] > 0, "tok/s above zero")

        tmux("send-keys", "-t", "e2e", "q")
        screen = tmux.wait_for(lambda s: EXIT in s, "the process exited")
        assert f"{EXIT}0" in screen
        # The alternate screen is gone: no panel borders, no traceback left behind.
        assert "╭" not in screen and "Traceback" not in screen
    finally:
        subprocess.run(["tmux", "-L", tmux.socket, "kill-server"], capture_output=True)


# The status line's names part under auto: "← auto·lookup", or the source alone where the
# terminal is short of room ("← lookup" at 80 columns).
AUTO_SOURCE = re.compile(r"← (?:auto·)?(lookup|suffix|model)\b")
DRAFTS_SHOWN = re.compile(r"Acceptance \d+%")  # the panel's title once drafts were verified


def test_the_default_first_screen_shows_speculation_and_which_source_drafted(tmp_path):
    """`specdash` with no arguments (issue 32): within the built-in workload's first
    prompts, where there is something to copy, the acceptance panel shows drafts and the
    status line names the source auto chose; at 80x24, then at 120x36."""
    tmux = Tmux(f"specdash-first-{os.getpid()}")
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "specdash", "--screenshots", str(tmp_path)])
    # $COLUMNS/$LINES exported, as GNU readline does (pytest imports it: a run without a
    # terminal, as CI's, hands them to every child): the app must follow the resize anyway.
    tmux("new-session", "-d", "-s", "e2e", "-x", "80", "-y", "24", "-e", "COLUMNS=80", "-e", "LINES=24",
         f"{command}; echo {EXIT}$?; sleep 120")
    try:
        def drafting(screen: str) -> bool:
            rows = [line for line in screen.splitlines() if line.strip()]
            return (len(rows) >= 2 and AUTO_SOURCE.search(rows[-2]) is not None  # the status line
                    and DRAFTS_SHOWN.search(screen) is not None)

        screen = tmux.wait_for(drafting, "auto drafting from a named source at 80x24", timeout_s=600)
        assert "no drafts yet" not in screen
        tmux("resize-window", "-t", "e2e", "-x", "120", "-y", "36")
        # The wide layout; the status line still names the source (in full, "auto·lookup",
        # unless its optional parts take the room: then the source alone).
        named = re.compile(r"← (?:auto·)?(lookup|suffix|model|plain)\b")
        screen = tmux.wait_for(lambda s: len(s.splitlines()) >= 36 and "System" in s and DRAFTS_SHOWN.search(s)
                               and named.search([r for r in s.splitlines() if r.strip()][-2]) is not None,
                               "drafts and auto's source shown at 120x36")
        tmux("send-keys", "-t", "e2e", "q")
        screen = tmux.wait_for(lambda s: EXIT in s, "the process exited")
        assert f"{EXIT}0" in screen
    finally:
        subprocess.run(["tmux", "-L", tmux.socket, "kill-server"], capture_output=True)
