"""How long does `specdash models scan` take over 100 GGUF files? (Target: under 2 s.)

Makes N distinct files in a temp directory, each a copy of a small registry model's
header (tokenizer and all) followed by a hole up to the model's real size: a sparse
file, so 100 of them cost the headers' disk space only, yet each is a whole, separate
GGUF to the scanner (symlinks would not do: the scan lists a linked file once). The
models cycle through SmolLM2-135M (49k-token BPE + merges), Gemma-3-270M (262k-token
SPM) and Qwen2.5-Coder-0.5B (152k-token BPE + merges), so the token lists, which are
most of a header, come in all three sizes.

Then scans the directory with the scan cache off, --runs times in this process (after
one warm-up), and reports the median wall time; and once more in a fresh Python process,
imports included, the way `specdash models scan DIR` runs. Page cache is warm (the
copies were just written): this measures header parsing, not the disk.

    python benchmarks/scan_headers.py [--files 100] [--runs 5] [--models a,b,c] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdash.models.gguf_header import read_gguf_header
from specdash.models.resolve import resolve_model
from specdash.models.scan import scan

TARGET_S = 2.0
DEFAULT_MODELS = "smollm2-135m,gemma3-270m,qwen2.5-coder-0.5b"


def make_files(directory: Path, sources: list[Path], n: int) -> int:
    """n sparse header copies; returns the bytes really written."""
    headers = {src: (read_gguf_header(src).data_offset, src.stat().st_size) for src in sources}
    written = 0
    for i in range(n):
        src = sources[i % len(sources)]
        data_offset, size = headers[src]
        with open(src, "rb") as f:
            head = f.read(data_offset)
        with open(directory / f"m{i:03d}-{src.name}", "wb") as out:
            out.write(head)
            out.truncate(size)  # a hole: the scanner never reads past the header
        written += len(head)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"registry names (default {DEFAULT_MODELS})")
    ap.add_argument("--keep", type=Path, help="make the files in this directory and keep them")
    args = ap.parse_args()

    sources = [resolve_model(name) for name in args.models.split(",")]
    directory = args.keep or Path(tempfile.mkdtemp(prefix="specdash-scan-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        written = make_files(directory, sources, args.files)
        print(f"{args.files} GGUF files in {directory} ({written / 1e6:.0f} MB of headers, "
              f"{', '.join(s.name for s in sources)})", file=sys.stderr)

        warm = scan([directory], use_cache=False)
        assert len(warm.models) == args.files and not warm.problems, warm.problems[:3]
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            scan([directory], use_cache=False)
            times.append(time.perf_counter() - start)

        code = (
            "import time; t = time.perf_counter(); from specdash.models.scan import scan; "
            f"r = scan([{str(directory)!r}], use_cache=False); "
            "print(time.perf_counter() - t, len(r.models))"
        )
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        process_s = time.perf_counter() - start
        in_process = float(proc.stdout.split()[0])
    finally:
        if args.keep is None:
            shutil.rmtree(directory, ignore_errors=True)

    median = statistics.median(times)
    result = {
        "files": args.files,
        "runs": args.runs,
        "median_s": round(median, 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "fresh_process_scan_s": round(in_process, 3),
        "fresh_process_total_s": round(process_s, 3),
        "per_file_ms": round(1000 * median / args.files, 2),
        "target_s": TARGET_S,
        "ok": median < TARGET_S,
    }
    print(
        f"scan of {args.files} headers: median {median:.2f} s over {args.runs} runs "
        f"(min {min(times):.2f}, max {max(times):.2f}; {result['per_file_ms']} ms/file); "
        f"fresh process {in_process:.2f} s scanning, {process_s:.2f} s with Python start-up. "
        f"Target {TARGET_S:.0f} s: {'met' if result['ok'] else 'MISSED'}",
        file=sys.stderr,
    )
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
