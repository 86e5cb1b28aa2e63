"""Does the dashboard slow the engine it watches? Headless vs the real dashboard in tmux.

Each round, alternately: (a) headless, what `specdash run` does (a Session on the main
thread) plus the dashboard's 12 K=0 calibration steps so both sides do the same work;
(b) `specdash` in a tmux pane on the same prompt and settings, its decode tok/s read from
the JSON that the `s` key writes. Prints the ratio of medians and the dashboard's CPU.

    python benchmarks/dashboard_overhead.py [--target M] [--draft M] [--k 4] [--tokens 200] [--rounds 6]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from specdash.prompts import by_name

CALIBRATE_STEPS = 12  # what commands/dashboard.py runs at the start of a session

HEADLESS = """
import sys
from specdash.engine.session import Session
from specdash.engine.settings import EngineSettings
target, draft, k, n, prompt_file = sys.argv[1:6]
s = Session(EngineSettings(target=target, draft=draft, k=int(k), threads=2, max_tokens=int(n)))
s.engine.calibrate_steps = {calibrate}
for ev in s.run(open(prompt_file).read()):
    last = ev
print(last.tokens_per_s)
s.close()
""".format(calibrate=CALIBRATE_STEPS)


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", "specdash-overhead", *args], capture_output=True, text=True).stdout


def headless(args, prompt_file: str) -> float:
    out = subprocess.run([sys.executable, "-c", HEADLESS, args.target, args.draft, str(args.k),
                          str(args.tokens), prompt_file], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def attached(args, prompt_file: str, shots: str) -> tuple[float, float]:
    cmd = (f"{sys.executable} -m specdash --target {args.target} --draft {args.draft} --k {args.k} "
           f"--threads 2 --max-tokens {args.tokens} --prompt-file {prompt_file} --screenshots {shots}; sleep 30")
    tmux("new-session", "-d", "-s", "a", "-x", "100", "-y", "30", cmd)
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
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="specdash-overhead-")
    prompt_file = os.path.join(work, "prompt.txt")
    with open(prompt_file, "w") as f:
        f.write(by_name("code-edit").text)
    head, dash, cpu = [], [], []
    for r in range(args.rounds):
        shots = os.path.join(work, f"shots{r}")
        os.makedirs(shots)
        pair = [("h", None), ("d", shots)] if r % 2 == 0 else [("d", shots), ("h", None)]
        for kind, where in pair:
            if kind == "h":
                head.append(headless(args, prompt_file))
            else:
                tps, c = attached(args, prompt_file, where)
                dash.append(tps)
                cpu.append(c)
        print(f"round {r + 1}: headless {head[-1]:.2f} tok/s, dashboard {dash[-1]:.2f} tok/s, "
              f"dashboard CPU {cpu[-1]:.1f}%", flush=True)
    print(f"\nmedian: headless {statistics.median(head):.2f}, dashboard {statistics.median(dash):.2f} tok/s, "
          f"ratio {statistics.median(dash) / statistics.median(head):.3f}; "
          f"dashboard's own CPU median {statistics.median(cpu):.1f}% of one core")
    # Each round's pair ran back to back: its ratio cancels slow drifts of the machine.
    paired = sorted(d / h for d, h in zip(dash, head))
    print(f"per-round ratios {' '.join(f'{r:.3f}' for r in paired)}; median {statistics.median(paired):.3f}, "
          f"geometric mean {statistics.geometric_mean(paired):.3f}")


if __name__ == "__main__":
    main()
