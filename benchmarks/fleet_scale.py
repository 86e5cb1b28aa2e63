"""Does the fleet view hold at 100 servers? `specdash attach` on 100 fake servers on
127.0.0.1, polled every second, in a real terminal (tmux), for --seconds (default 600).

The servers (tests/fake_fleet.py, asyncio, in a child process so their CPU and memory are
not counted) answer vLLM-style /metrics whose counters grow like a busy server's; by
default 3 of them stall (read the request, never answer), 2 answer a NaN counter and 2
answer bytes that are not metrics. Measured on the attaching process:

- key to screen: `s` (next sort column) and `r` (reverse) sent with tmux send-keys, and
  the time until tmux's screen shows the new hint line ("sorted by ..."), polled with
  capture-pane (each poll ~3 ms: the figure is within that of the truth). Target: < 100 ms.
- polls do not pile up: per server, requests counted by the server (at most one in flight
  at once, and no more than one per interval), and the process's thread count over time.
- memory: RSS every 10 s; flat = grows less than 5 MiB from minute 2 to the end.
- the misbehaving servers marked in their rows (down / bad), read off the screen.
- CPU: the attaching process's share of one core.

    python benchmarks/fleet_scale.py [--servers 100] [--seconds 600] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SESSION = "specdash-fleet-scale"
WIDTH, HEIGHT = 200, 50


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def screen() -> list[str]:
    return tmux("capture-pane", "-p", "-t", SESSION).splitlines()


def hint() -> str:
    return next((line.strip() for line in screen() if "sorted by" in line), "")


def key_to_screen(key: str, timeout: float = 5.0) -> float:
    """Seconds from sending `key` until the hint line changes."""
    before = hint()
    t0 = time.perf_counter()
    tmux("send-keys", "-t", SESSION, key)
    while time.perf_counter() - t0 < timeout:
        if hint() != before:
            return time.perf_counter() - t0
    raise SystemExit(f"the screen did not change within {timeout:g}s of {key!r}; hint: {before!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=100)
    ap.add_argument("--stall", type=int, default=3)
    ap.add_argument("--nan", type=int, default=2)
    ap.add_argument("--junk", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--probe-every", type=float, default=15.0, help="seconds between key probes")
    ap.add_argument("--out", type=Path, help="also write the report here, the command on its first line")
    args = ap.parse_args()

    fleet = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_fleet.py"), str(args.servers),
                              str(args.stall), str(args.nan), str(args.junk)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert fleet.stdout is not None and fleet.stdin is not None
    urls = json.loads(fleet.stdout.readline())
    bad = urls[: args.stall + args.nan + args.junk]
    env = f"PYTHONPATH={shlex.quote(os.environ.get('PYTHONPATH', str(ROOT)))}"
    command = (f"env {env} {shlex.quote(sys.executable)} -m specdash attach {' '.join(urls)} "
               f"--interval {args.interval:g} --screenshots /tmp")
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    tmux("new-session", "-d", "-s", SESSION, "-x", str(WIDTH), "-y", str(HEIGHT), command)
    pid = int(tmux("display", "-p", "-t", SESSION, "#{pane_pid}").strip())
    proc = psutil.Process(pid)
    if proc.name() == "env":  # env execs python: the same pid
        time.sleep(1.0)
    lines: list[str] = []
    samples: list[tuple[float, float, int]] = []  # (seconds since start, RSS MiB, threads)
    latencies: dict[str, list[float]] = {"s": [], "r": []}
    try:
        time.sleep(args.warmup)
        t0 = time.monotonic()
        c0 = proc.cpu_times()
        next_probe = t0
        while (now := time.monotonic()) - t0 < args.seconds:
            samples.append((now - t0, proc.memory_info().rss / 2**20, proc.num_threads()))
            if now >= next_probe:
                for key in ("s", "r", "r"):
                    latencies["s" if key == "s" else "r"].append(key_to_screen(key))
                    time.sleep(0.3)
                next_probe += args.probe_every
            time.sleep(max(0.0, 10.0 - (time.monotonic() - now)))
        t1 = time.monotonic()
        c1 = proc.cpu_times()
        samples.append((t1 - t0, proc.memory_info().rss / 2**20, proc.num_threads()))
        # The misbehaving rows, read off the screen: status column, reversed (not up first).
        while "sorted by status" not in hint():
            key_to_screen("s")
        if "(reversed)" not in hint():
            key_to_screen("r")
        time.sleep(1.5)
        shown = screen()
        marked = {}
        for url in bad:
            where = url.removeprefix("http://")
            row = next((line for line in shown if where in line), "")
            marked[url] = " ".join(row.split())[:140] if row else "(not on screen)"
        final = screen()
    finally:
        subprocess.run(["tmux", "send-keys", "-t", SESSION, "q"], capture_output=True)
        time.sleep(2.0)
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
        fleet.stdin.close()
        stats = json.loads(fleet.stdout.readline() or "[]")
        fleet.wait(10)

    duration = t1 - t0
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    everything = latencies["s"] + latencies["r"]
    ms = sorted(1000 * x for x in everything)

    def pct(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    rss = [(t, m) for t, m, _ in samples]
    late = [(t, m) for t, m in rss if t >= 120]
    growth = late[-1][1] - late[0][1] if len(late) >= 2 else float("nan")
    slope = statistics.linear_regression([t / 60 for t, _ in late], [m for _, m in late]).slope if len(late) >= 3 else float("nan")
    threads = sorted({n for _, _, n in samples})
    ok = [(polls, inflight) for kind, polls, _, inflight in stats if kind == "ok"]
    total_s = duration + args.warmup + 3  # every server was polled from before the warm-up to the end
    expected = total_s / args.interval
    out = [
        f"# {' '.join(shlex.quote(a) for a in sys.argv)}",
        f"# {time.strftime('%Y-%m-%d %H:%M')}, {psutil.cpu_count()} logical CPUs, "
        f"{args.servers} servers ({args.stall} stall, {args.nan} NaN, {args.junk} junk), tmux {WIDTH}x{HEIGHT}",
        f"measured {duration:.0f} s after a {args.warmup:g} s warm-up; CPU {100 * cpu / duration:.1f}% of one core "
        f"(user {c1.user - c0.user:.1f} s, system {c1.system - c0.system:.1f} s)",
        f"key to screen (s: next sort column, r: reverse), {len(ms)} presses: median {statistics.median(ms):.0f} ms, "
        f"p90 {pct(0.9):.0f} ms, max {ms[-1]:.0f} ms; target < 100 ms: {'PASS' if pct(0.9) < 100 else 'FAIL'} (p90)",
        f"  s: {' '.join(f'{1000 * x:.0f}' for x in latencies['s'])}",
        f"  r: {' '.join(f'{1000 * x:.0f}' for x in latencies['r'])}",
        f"memory (RSS): {rss[0][1]:.0f} MiB at {rss[0][0]:.0f} s, "
        + ", ".join(f"{m:.0f} MiB at {t / 60:.0f} min" for t, m in rss if abs(t - 60) < 5 or abs(t - 300) < 5)
        + f", {rss[-1][1]:.0f} MiB at the end; from 2 min to the end {growth:+.1f} MiB ({slope:+.2f} MiB/min); "
          f"flat (< 5 MiB): {'PASS' if abs(growth) < 5 else 'FAIL'}",
        f"  RSS every 10 s: {' '.join(f'{m:.0f}' for _, m in rss)}",
        f"threads: {threads[0]}..{threads[-1]} (constant: {'yes' if len(threads) == 1 else 'no'})",
        f"polls: well servers {min(r for r, _ in ok)}..{max(r for r, _ in ok)} polls (GET /metrics) each in about "
        f"{total_s:.0f} s (at most one per {args.interval:g} s: <= {expected:.0f}); max in flight per server "
        f"{max(i for *_, i in stats)}; pile-up: {'none' if max(i for *_, i in stats) <= 1 and max(r for r, _ in ok) <= expected + 2 else 'YES'}",
        f"  stalled servers: {', '.join(str(r) for k, _, r, _ in stats if k == 'stall')} requests each, "
        f"never answered (a poll waits out its read timeout, 5 s, then the next starts an interval later)",
        f"  NaN / junk servers: {', '.join(f'{p}/{r}' for k, p, r, _ in stats if k in ('nan', 'junk'))} "
        f"polls/requests each (after a failure a poll asks /props again first)",
        "misbehaving rows on screen (status sorted, reversed):",
        *(f"  {url.removeprefix('http://')}: {text}" for url, text in marked.items()),
        "the screen at the end (first 12 lines):",
        *(f"  | {line.rstrip()}" for line in final[:12]),
    ]
    report = "\n".join(out)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
