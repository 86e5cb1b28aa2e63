"""How big a recording gets: bytes per step, per telemetry sample, and a 30-minute estimate.

Records a real run of the small model (`specdash run --record`, telemetry sampled at 1 Hz
as the dashboard does) and measures the file line by line.

    python benchmarks/recording_size.py [--tokens 400] [--target smollm2-135m] [--draft lookup]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

PROMPT = "Write a Python module with a class for a bank account: deposit, withdraw, a history of transactions, and tests."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="lookup")
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rec.jsonl"
        cmd = [sys.executable, "-m", "specdash", "run", "--target", args.target, "--draft", args.draft,
               "--k", str(args.k), "--threads", "2", "--max-tokens", str(args.tokens), "--prompt", PROMPT,
               "--record", str(path)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sizes: dict[str, list[int]] = defaultdict(list)
        times: list[float] = []
        lines = path.read_bytes().splitlines(keepends=True)
        for line in lines[1:]:
            d = json.loads(line)
            sizes[d["event"]].append(len(line))
            if d["event"] == "step":
                times.append(d["t"])
        header = len(lines[0])
    steps = sizes["step"]
    step_bytes = sum(steps) / len(steps)
    tel = sizes.get("telemetry", [])
    tel_bytes = sum(tel) / len(tel) if tel else 0.0
    span = times[-1] - times[0]
    steps_per_s = (len(steps) - 1) / span if span > 0 else 0.0
    per_30min = 1800 * (steps_per_s * step_bytes + tel_bytes)  # telemetry: 1 sample/s
    print(f"recording of {len(steps)} steps ({args.target}, {args.draft} K={args.k}, {args.tokens} tokens):")
    print(f"  header {header} bytes; step {step_bytes:.0f} bytes on average "
          f"(min {min(steps)}, max {max(steps)}); telemetry sample {tel_bytes:.0f} bytes")
    print(f"  {steps_per_s:.1f} steps/s here -> 30 minutes of decoding: {per_30min / 1e6:.1f} MB "
          f"({1800 * steps_per_s * step_bytes / 1e6:.1f} MB of steps, {1800 * tel_bytes / 1e6:.1f} MB of telemetry)")
    for kind, rows in sorted(sizes.items()):
        print(f"  {kind:<10} {len(rows):6d} lines {sum(rows):9d} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
