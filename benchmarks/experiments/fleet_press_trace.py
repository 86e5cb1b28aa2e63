#!/usr/bin/env python
"""Where do the fleet's slow key presses go? `specdash attach` on 100 fake servers in tmux,
with a trace inside it: garbage collections (generation 2 always, 0 and 1 above 5 ms), the
table's draws and flushes, the sort keys' handlers, and the event loop running late by more
than 20 ms. Keys sent with tmux are timed to the screen as benchmarks/fleet_scale.py times
them (its key_to_screen), and every press above --slow ms is printed with the trace around it.

    python benchmarks/experiments/fleet_press_trace.py [--presses 60] [--slow 120]

Issue 42's fleet, stop 48: of 60 presses (median 60 ms, p90 180), every one above 120 ms had
a full collection of 142-187 ms starting within 30 ms of the key's handler (the sort's
allocations set it off); hence tui/gc_pacing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

# The fleet benchmark's terminal, and its timing of a key to the screen (its tmux session).
from fleet_scale import HEIGHT, SESSION, WIDTH, key_to_screen, tmux  # noqa: E402

# Runs inside the attaching process: wraps what the trace watches, then runs `specdash`.
CHILD = r'''
import asyncio, gc, os, runpy, sys, time
from specdash.tui.screens import fleet as F
from textual.app import App
log = open(os.environ["TRACE_LOG"], "w")
def w(msg): log.write(f"{time.time():.3f} {msg}\n"); log.flush()
started = {}
def on_gc(phase, info):
    g = info["generation"]
    if phase == "start":
        started[g] = time.perf_counter()
    else:
        ms = 1000 * (time.perf_counter() - started[g])
        if g == 2 or ms > 5:
            w(f"gc{g} {ms:.0f}ms")
gc.callbacks.append(on_gc)
def timed(cls, name, label):
    inner = getattr(cls, name)
    def wrapper(self, *a):
        t0 = time.perf_counter(); out = inner(self, *a); w(f"{label} {1000 * (time.perf_counter() - t0):.0f}ms"); return out
    setattr(cls, name, wrapper)
timed(F.FleetTable, "render_lines", "draw")
timed(F.FleetScreen, "flush", "flush")
timed(F.FleetScreen, "action_cycle_sort", "KEY s")
timed(F.FleetScreen, "action_reverse_sort", "KEY r")
run_async = App.run_async
async def traced(self, *a, **k):
    async def probe():
        while True:
            t0 = time.perf_counter(); await asyncio.sleep(0.01)
            late = 1000 * (time.perf_counter() - t0) - 10
            if late > 20: w(f"loop late {late:.0f}ms")
    asyncio.get_running_loop().create_task(probe())
    return await run_async(self, *a, **k)
App.run_async = traced
sys.argv = ["specdash", *sys.argv[1:]]
runpy.run_module("specdash", run_name="__main__")
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=100)
    ap.add_argument("--presses", type=int, default=60)
    ap.add_argument("--slow", type=float, default=120.0, help="print the trace around presses slower than this (ms)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="press-trace-"))
    (work / "child.py").write_text(CHILD)
    fleet = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_fleet.py"), str(args.servers), "3", "2", "2"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert fleet.stdout is not None and fleet.stdin is not None
    urls = json.loads(fleet.stdout.readline())
    trace = work / "trace.log"
    env = f"PYTHONPATH={shlex.quote(str(ROOT))} TRACE_LOG={shlex.quote(str(trace))}"
    command = f"env {env} {shlex.quote(sys.executable)} {work / 'child.py'} attach {' '.join(urls)} --interval 1"
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)  # none left: not an error
    tmux("new-session", "-d", "-s", SESSION, "-x", str(WIDTH), "-y", str(HEIGHT), command)
    presses: list[tuple[float, str, float]] = []
    try:
        time.sleep(20)
        for i in range(args.presses):
            key, sent = "s" if i % 3 == 0 else "r", time.time()
            presses.append((sent, key, 1000 * key_to_screen(key)))
            time.sleep(1.3)
    finally:
        subprocess.run(["tmux", "send-keys", "-t", SESSION, "q"], capture_output=True)
        time.sleep(2)
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
        fleet.stdin.close()
        fleet.wait(10)
    events = [(float(ts), msg) for ts, _, msg in (line.rstrip("\n").partition(" ") for line in trace.open())]
    ms = sorted(lat for *_, lat in presses)
    print(f"{len(ms)} presses: median {ms[len(ms) // 2]:.0f} ms, p90 {ms[int(0.9 * len(ms))]:.0f} ms, max {ms[-1]:.0f} ms")
    for sent, key, lat in presses:
        if lat < args.slow:
            continue
        print(f"--- {key}: {lat:.0f} ms")
        for t, msg in events:
            if sent - 0.15 <= t <= sent + lat / 1000 + 0.05:
                print(f"   {1000 * (t - sent):+6.0f} ms  {msg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
