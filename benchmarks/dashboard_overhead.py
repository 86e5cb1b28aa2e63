"""Does the dashboard slow the engine it watches? Headless vs the real dashboard in tmux.

Each round, alternately: (a) headless, what `specdash run` does (a Session on the main
thread) plus the dashboard's 12 K=0 calibration steps so both sides do the same work;
(b) `specdash` in a tmux pane on the same prompt and settings, its decode tok/s read from
the JSON that the `s` key writes. Prints the ratio of medians and the dashboard's CPU.

--arm NAME=CODE adds a dashboard variant that runs CODE in the process before specdash
starts, so a change can be A/B tested in one run, e.g. the default GIL switch interval:

    python benchmarks/dashboard_overhead.py --rounds 4 \
        --arm "switch-5ms=import sys; sys.setswitchinterval = lambda v: None"

    python benchmarks/dashboard_overhead.py [--target M] [--draft M] [--k 4] [--tokens 200] [--rounds 6]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from specdash.tuning.prompts import by_name

CALIBRATE_STEPS = 12  # what commands/dashboard.py runs at the start of a session

HEADLESS = """
import sys
from specdash.sources.session import Session
from specdash.engine.settings import EngineSettings
target, draft, k, n, prompt_file = sys.argv[1:6]
s = Session(EngineSettings(target=target, draft=draft, k=int(k), adaptive=False, threads=2, max_tokens=int(n)))
s.engine.calibrate_steps = {calibrate}
for ev in s.run(open(prompt_file).read()):
    last = ev
print(last.tokens_per_s)
s.close()
""".format(calibrate=CALIBRATE_STEPS)


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", "specdash-overhead", *args], capture_output=True, text=True).stdout


def start_session(cmd: str) -> None:
    """A new tmux server with one 100x30 pane running `cmd`. kill-server returns before
    the old server is gone, and a new-session that reaches the dying server dies with
    it: wait for the socket to go, and retry until the session is really there."""
    for _ in range(50):
        if subprocess.run(["tmux", "-L", "specdash-overhead", "has-session"], capture_output=True).returncode:
            break
        time.sleep(0.1)
    for _ in range(5):
        tmux("new-session", "-d", "-s", "a", "-x", "100", "-y", "30", cmd)
        time.sleep(0.5)
        if subprocess.run(["tmux", "-L", "specdash-overhead", "has-session", "-t", "a"],
                          capture_output=True).returncode == 0:
            return
    raise RuntimeError("tmux would not start a session")


def headless(args, prompt_file: str) -> float:
    out = subprocess.run([sys.executable, "-c", HEADLESS, args.target, args.draft, str(args.k),
                          str(args.tokens), prompt_file], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def attached(args, prompt_file: str, shots: str, prelude: str = "") -> tuple[float, float]:
    argv = ["specdash", "--target", args.target, "--draft", args.draft, "--k", str(args.k), "--threads", "2",
            "--max-tokens", str(args.tokens), "--prompt-file", prompt_file, "--screenshots", shots]
    code = f"import sys\n{prelude}\nfrom specdash.cli import main\nsys.argv = {argv!r}\nsys.exit(main())"
    start_session(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}; sleep 30")
    try:
        deadline = time.time() + 600
        while "■ done" not in tmux("capture-pane", "-p", "-t", "a"):  # the status line when the run ends
            if time.time() > deadline:
                raise TimeoutError("the dashboard did not finish its prompt in 10 minutes")
            time.sleep(0.5)
        tmux("send-keys", "-t", "a", "s")
        while not glob.glob(os.path.join(shots, "*.json")):
            time.sleep(0.2)
        time.sleep(0.5)
        d = json.load(open(glob.glob(os.path.join(shots, "*.json"))[0]))
        tmux("send-keys", "-t", "a", "q")
        time.sleep(1)
    finally:
        tmux("kill-server")
    return d["stats"]["last_summary"]["tokens_per_s"], d["dashboard_cpu_percent"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=CODE",
                    help="an extra dashboard variant: CODE runs before specdash starts (repeatable)")
    args = ap.parse_args()
    arms = {"dashboard": ""}
    for arm in args.arm:
        name, sep, code = arm.partition("=")
        if not sep or not name:
            ap.error(f"--arm {arm!r}: expected NAME=CODE")
        arms[name] = code
    work = tempfile.mkdtemp(prefix="specdash-overhead-")
    prompt_file = os.path.join(work, "prompt.txt")
    with open(prompt_file, "w") as f:
        f.write(by_name("code-edit").text)
    names = ["headless", *arms]
    tps: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in arms}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
            if name == "headless":
                tps[name].append(headless(args, prompt_file))
            else:
                shots = os.path.join(work, f"shots-{r}-{name}")
                os.makedirs(shots)
                t, c = attached(args, prompt_file, shots, arms[name])
                tps[name].append(t)
                cpu[name].append(c)
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.2f} tok/s" for n, v in tps.items())
              + "; dashboard CPU " + ", ".join(f"{n} {v[-1]:.1f}%" for n, v in cpu.items()), flush=True)
    base = statistics.median(tps["headless"])
    print(f"\nheadless median {base:.2f} tok/s")
    for name in arms:
        # Each round's runs ran back to back: their ratio cancels slow drifts of the machine.
        paired = sorted(d / h for d, h in zip(tps[name], tps["headless"]))
        print(f"{name}: median {statistics.median(tps[name]):.2f} tok/s, ratio of medians "
              f"{statistics.median(tps[name]) / base:.3f}; per-round ratios {' '.join(f'{x:.3f}' for x in paired)}, "
              f"median {statistics.median(paired):.3f}; its own CPU median {statistics.median(cpu[name]):.1f}% of one core")


if __name__ == "__main__":
    main()
