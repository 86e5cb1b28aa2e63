"""Soak: the real dashboard in tmux for a long session, driven by random keys.

`specdash` runs in its own tmux server on the default pair (or --target/--draft), with
--record, as an operator would leave it open. Every few seconds (random, seeded) a key
goes in the way a person types it: K up or down, a draft source from the `d` picker,
adaptive on/off, a temperature from the `t` dialog, pause then resume, a new prompt from
`n`, the experts key (a dense target refuses it), a screenshot. Whenever the prompt is
done a new one is typed, so the engine is generating for the whole run.

At the end it reports, from the process and its own recording:
- RSS of the specdash process at the start (after a warm-up in which every draft source
  has been loaded once) and at the end, and the growth between them (bar: < 5%), with
  where it grew: resident MB per mapping (anonymous memory, the heap, each mapped file);
- steps decoded, commands applied (settings events carrying a command), refusals;
- errors: error notices or an error state in the recording, a traceback on screen, or
  the process gone before `q` (bar: 0).

    python benchmarks/soak.py                            # 30 minutes, default pair
    python benchmarks/soak.py --minutes 5 --target smollm2-135m --draft lookup
    python benchmarks/soak.py --out benchmarks/results/soak.txt

It needs tmux. Exit status 1 when a bar is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string without using datetime, with tests.",
    "Explain, in three paragraphs, how a CPU cache hierarchy affects matrix multiplication speed.",
    "Rewrite this list as a Markdown table with columns name, role, city: Ana engineer Lisbon; "
    "Ben designer Oslo; Chen manager Taipei; Dara analyst Nairobi.",
    "Write the numbers from 1 to 300, separated by commas.",
    "Summarize the plot of a heist story in which the vault is empty, in 150 words.",
]
TEMPERATURES = ["0", "0.7", "0", "1.2", "0.3"]
DONE = "Done. Press n for a new prompt."
PAUSED = "⏸ paused"


class Tmux:
    def __init__(self, socket: str):
        self.socket = socket

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "soak")

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "soak", *keys)

    def wait(self, predicate, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.screen()):
                return True
            time.sleep(0.1)
        return False


def read_events(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:  # the line being written
                continue
            if "event" in ev:
                out.append(ev)
    return out


def specdash_process(tmux: Tmux) -> psutil.Process:
    pane = int(tmux("display-message", "-p", "-t", "soak", "#{pane_pid}"))
    for _ in range(300):
        kids = [p for p in psutil.Process(pane).children(recursive=True) if "specdash" in " ".join(p.cmdline())]
        if kids:
            return kids[0]
        time.sleep(0.1)
    raise SystemExit("soak: specdash did not start")


class Driver:
    """Random keys, each one a thing an operator does; returns what it did."""

    def __init__(self, tmux: Tmux, rng: random.Random):
        self.tmux, self.rng = tmux, rng
        self.paused = False

    def dialog(self, key: str, title: str, text: str) -> bool:
        self.tmux.keys(key)
        if not self.tmux.wait(lambda s: title in s, 10):
            return False
        self.tmux.keys("-l", text)  # the field's value is selected: typing replaces it
        self.tmux.wait(lambda s: text[:20] in s, 5)
        self.tmux.keys("Enter")
        return True

    def new_prompt(self) -> str:
        prompt = self.rng.choice(PROMPTS)
        self.dialog("n", "New prompt", prompt)
        return "new prompt"

    def pick_draft(self, downs: int | None = None) -> str:
        self.tmux.keys("d")
        if not self.tmux.wait(lambda s: "Draft source" in s, 10):
            return "d (picker did not open)"
        time.sleep(0.3)
        downs = self.rng.randint(0, 5) if downs is None else downs
        if downs:
            self.tmux.keys(*["Down"] * downs)
        self.tmux.keys("Enter")
        return f"d +{downs}"

    def act(self) -> str:
        if self.paused:  # a pause lasts one interval
            self.paused = False
            self.tmux.keys("Space")
            return "resume"
        if PAUSED in self.tmux.screen():
            # Paused though this driver did not mean it (a Space that landed while a
            # dialog was closing): resume, or the soak measures an idle dashboard.
            self.tmux.keys("Space")
            return "resume (resync)"
        choice = self.rng.choices(
            ["k_up", "k_down", "draft", "adaptive", "temp", "pause", "prompt", "experts", "shot"],
            weights=[5, 4, 4, 2, 2, 1, 1, 1, 1])[0]
        if choice == "k_up":
            self.tmux.keys("+")
        elif choice == "k_down":
            self.tmux.keys("-")
        elif choice == "draft":
            return self.pick_draft()
        elif choice == "adaptive":
            self.tmux.keys("a")
        elif choice == "temp":
            value = self.rng.choice(TEMPERATURES)
            self.dialog("t", "Temperature", value)
            return f"t {value}"
        elif choice == "pause":
            self.paused = True
            self.tmux.keys("Space")
        elif choice == "prompt":
            return self.new_prompt()
        elif choice == "experts":
            self.tmux.keys("e")  # a dense target: the dashboard says why not
        elif choice == "shot":
            self.tmux.keys("s")
        return choice


def rss_mb(proc: psutil.Process) -> float:
    return proc.memory_info().rss / 1e6


def rss_by_mapping(proc: psutil.Process) -> dict[str, float]:
    """Resident MB per mapped file, anonymous memory under "[anon]": says where growth is
    (model pages mapped from a GGUF are file-backed and reclaimable; the heap is not)."""
    out: dict[str, float] = {}
    for m in proc.memory_maps(grouped=True):
        path = m.path if m.path.startswith("/") else (m.path or "[anon]")
        out[path] = out.get(path, 0.0) + m.rss / 1e6
    return out


def growth_by_mapping(start: dict[str, float], end: dict[str, float], top: int = 5) -> str:
    diff = {k: end.get(k, 0.0) - start.get(k, 0.0) for k in set(start) | set(end)}
    biggest = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:top]
    return ", ".join(f"{Path(k).name if k.startswith('/') else k} {v:+.1f}" for k, v in biggest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the soak (default 30)")
    ap.add_argument("--target", default=None, help="target model (default: the default pair's)")
    ap.add_argument("--draft", default=None, help="starting draft source (default: the default pair's)")
    ap.add_argument("--interval", default="2,6", help="seconds between keys, MIN,MAX (default 2,6)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("soak: needs tmux (apt-get install tmux)", file=sys.stderr)
        return 2
    try:
        lo, hi = (float(x) for x in args.interval.split(","))
    except ValueError:
        print(f"soak: --interval {args.interval!r}: use MIN,MAX in seconds, e.g. 2,6", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="specdash-soak-"))
    record = work / "soak.jsonl"
    cmd = [sys.executable, "-m", "specdash", "--threads", "2", "--max-tokens", "600", "--record", str(record),
           "--screenshots", str(work / "shots"), "--prompt", PROMPTS[0]]
    if args.target:
        cmd += ["--target", args.target]
    if args.draft:
        cmd += ["--draft", args.draft]
    tmux = Tmux(f"specdash-soak-{os.getpid()}")
    # A long history: if the process dies, its traceback is kept for the report.
    tmux("start-server", ";", "set-option", "-g", "history-limit", "20000", ";",
         "new-session", "-d", "-s", "soak", "-x", "120", "-y", "36",
         " ".join(shlex.quote(c) for c in cmd) + "; echo SOAK-EXIT:$?; sleep 600")
    rng = random.Random(args.seed)
    driver = Driver(tmux, rng)
    actions: list[str] = []
    samples: list[tuple[float, float]] = []
    lost = ""
    try:
        proc = specdash_process(tmux)
        if not tmux.wait(lambda s: "running" in s, 600):
            raise SystemExit(f"soak: the dashboard never started generating\n{tmux.screen()}")
        # Warm-up: every draft source loaded once (the picker's first five rows), so the
        # start figure has the draft model's weights in it, as any later figure will.
        for downs in range(5):
            actions.append(driver.pick_draft(downs))
            time.sleep(4)
        rss_start, maps_start = rss_mb(proc), rss_by_mapping(proc)
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_report = t0 + 60
        while time.monotonic() < end:
            time.sleep(rng.uniform(lo, hi))
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                lost = "the specdash process ended before q"
                break
            screen = tmux.screen()
            actions.append(driver.new_prompt() if DONE in screen else driver.act())
            samples.append((time.monotonic() - t0, rss_mb(proc)))
            if time.monotonic() >= next_report:
                next_report += 60
                steps = sum(e["event"] == "step" for e in read_events(record))
                print(f"[{(time.monotonic() - t0) / 60:4.1f} min] RSS {samples[-1][1]:.0f} MB, steps {steps}, "
                      f"keys {len(actions)}; growth by mapping, MB: {growth_by_mapping(maps_start, rss_by_mapping(proc), 3)}",
                      flush=True)
        rss_end = rss_mb(proc) if proc.is_running() else float("nan")
        maps_end = rss_by_mapping(proc) if proc.is_running() else {}
        screen = tmux.screen()
        if driver.paused:
            tmux.keys("Space")
        tmux.keys("q")
        exited = tmux.wait(lambda s: "SOAK-EXIT:" in s, 30)
        final = tmux.screen()
        history = tmux("capture-pane", "-p", "-S", "-20000", "-t", "soak")
        (work / "pane.txt").write_text(history, encoding="utf-8")
    finally:
        subprocess.run(["tmux", "-L", tmux.socket, "kill-server"], capture_output=True, check=False)

    events = read_events(record)
    steps = sum(e["event"] == "step" for e in events)
    applied = [e["command"] for e in events if e["event"] == "settings" and e.get("command")]
    notices = [e for e in events if e["event"] == "notice"]
    refused = [n["message"] for n in notices if "refused" in n["message"]]
    errors = [n["message"] for n in notices if n["level"] == "error"]
    errors += [f"state error: {e.get('message', '')}" for e in events if e["event"] == "status" and e["state"] == "error"]
    if "Traceback" in screen or "Traceback" in final:
        errors.append("a traceback on screen")
    if lost:
        # What the process printed as it ended (Textual prints a crash's traceback after
        # leaving the alternate screen), then its exit status.
        tail = [ln.rstrip() for ln in history.splitlines() if ln.strip()][-25:]
        errors.append(lost + f"; the pane's last lines (all of it in {work / 'pane.txt'}):\n"
                      + "\n".join(f"      {ln}" for ln in tail))
    if not lost and (not exited or "SOAK-EXIT:0" not in final):
        errors.append(f"q did not end the process with status 0: {final.strip().splitlines()[-1:]}")
    growth = (rss_end - rss_start) / rss_start
    kinds: dict[str, int] = {}
    for a in actions:
        kinds[a.split()[0]] = kinds.get(a.split()[0], 0) + 1
    commands: dict[str, int] = {}
    for c in applied:
        name = re.split(r"[=\s]", c)[0]
        commands[name] = commands.get(name, 0) + 1
    lines = [
        f"# soak: {' '.join(shlex.quote(a) for a in sys.argv)}",
        f"# {platform.processor() or platform.machine()}, {psutil.cpu_count()} cores; recording {record}",
        f"duration {args.minutes:g} min of random keys after the warm-up; keys sent {len(actions)} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})",
        f"RSS start {rss_start:.1f} MB, end {rss_end:.1f} MB, growth {growth:+.2%} (bar < 5%); "
        f"min {min(r for _, r in samples):.1f}, median {statistics.median(r for _, r in samples):.1f}, "
        f"max {max(r for _, r in samples):.1f} MB over {len(samples)} samples",
        f"growth by mapping, MB: {growth_by_mapping(maps_start, maps_end) if maps_end else 'n/a (process gone)'}",
        f"steps {steps}, tokens {sum(len(e.get('tokens', [])) for e in events if e['event'] == 'step')}, "
        f"prompts {sum(e['event'] == 'prompt' for e in events)}",
        f"commands applied {len(applied)} ({', '.join(f'{k} {v}' for k, v in sorted(commands.items()))}), "
        f"refused {len(refused)}",
        f"errors {len(errors)} (bar 0)",
        *(f"  error: {e}" for e in errors[:10]),
        *(f"  refused: {r}" for r in sorted(set(refused))[:5]),
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n", encoding="utf-8")
    return 0 if growth < 0.05 and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
