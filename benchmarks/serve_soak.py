"""Serve soak (issue 54): `specdash serve --parallel auto` under an hour of faults.

One headless server on 127.0.0.1 (default SmolLM2-135M drafting with lookup; --target,
--draft), with $SPECDASH_FAULT_FILE set, and --workers clients on 127.0.0.1 only, each
picking its next action at random (seeded) for --minutes:

    stream      a streamed completion to its end (time to first token kept)
    whole       a whole greedy completion of one of the prompts below, compared with the
                same prompt's plain decoding (speculative.n_max 0), asked at the start
    leave       a stream its client leaves after two chunks
    prefill     a long prompt its client leaves before the first token
    stall       a stream its client stops reading (raw socket, closed after 5 s)
    bad         a body that is not JSON (400), and one over --max-body (413)
    flood       30 tiny requests at once: past --max-waiting they are 429s
    steer       k=2, k=4, draft=lookup, draft=none from the steering route
    fault       touch the fault file: the next llama_decode fails (at most every 2 min)

Every request the soak sends ends one way: completed (a finish_reason), errored (an
error event or a 5xx: the engine fault's requests), refused (a 4xx), left (the soak's own
leavers), or lost: no final answer (a stream that ended without [DONE], a reset, a read
that timed out). The bar: lost 0, and the server's RSS at the end within 5% of minute 2.

    python benchmarks/serve_soak.py --minutes 30 --out benchmarks/results/serve-soak.txt
    python benchmarks/serve_soak.py --minutes 2          # a smoke run

Run it on a quiet machine (llama.cpp's threads spin-wait): nothing else decoding. Exit
status 1 when a bar is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

PROMPTS = [
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "def add(a, b):\n    return a + b\n\nRewrite add with type hints.",
    "List three prime numbers and say why each is prime.",
    "Translate to French: The cat sleeps on the warm windowsill.",
    "Give a JSON object with the keys name and age for Ada, 36.",
]
TOKENS = 48


class Tally:
    def __init__(self) -> None:
        self.sent = collections.Counter[str]()
        self.ends = collections.Counter[str]()
        self.refused = collections.Counter[str]()
        self.lost: list[str] = []
        self.ttft: list[float] = []
        self.greedy = [0, 0]  # equal to plain, compared

    def end(self, action: str, how: str, detail: str = "") -> None:
        self.ends[how] += 1
        if how == "lost":
            self.lost.append(f"{action}: {detail}"[:200])


async def stream(http: httpx.AsyncClient, body: dict[str, Any], tally: Tally, action: str,
                 leave_after: int | None = None) -> None:
    t0 = time.monotonic()
    tally.sent[action] += 1
    seen, done, error = 0, False, False
    try:
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            if r.status_code >= 400:
                await r.aread()
                tally.end(action, "refused" if r.status_code < 500 else "errored")
                if r.status_code < 500:
                    tally.refused[str(r.status_code)] += 1
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    done = True
                    break
                item = json.loads(payload)
                if "error" in item:
                    error = True
                    continue
                if seen == 0 and action == "stream":
                    tally.ttft.append(time.monotonic() - t0)
                seen += 1
                if leave_after is not None and seen >= leave_after:
                    tally.end(action, "left")
                    return
    except httpx.HTTPError as exc:
        tally.end(action, "lost", f"{type(exc).__name__}: {exc}")
        return
    if not done:
        tally.end(action, "lost", "the stream ended without [DONE]")
    else:
        tally.end(action, "errored" if error else "completed")


async def whole(http: httpx.AsyncClient, prompt: str, tally: Tally, reference: dict[str, str]) -> None:
    tally.sent["whole"] += 1
    try:
        r = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": TOKENS, "temperature": 0})
    except httpx.HTTPError as exc:
        tally.end("whole", "lost", f"{type(exc).__name__}: {exc}")
        return
    if r.status_code >= 500:
        tally.end("whole", "errored")
    elif r.status_code >= 400:
        tally.end("whole", "refused")
        tally.refused[str(r.status_code)] += 1
    else:
        tally.end("whole", "completed")
        tally.greedy[1] += 1
        tally.greedy[0] += r.json()["choices"][0]["text"] == reference[prompt]


async def prefill_leave(http: httpx.AsyncClient, tally: Tally) -> None:
    tally.sent["prefill"] += 1
    body = {"prompt": "word " * 1500, "max_tokens": 8, "stream": True}
    try:
        async with http.stream("POST", "/v1/completions", json=body, timeout=0.3) as r:
            async for _ in r.aiter_lines():
                pass
        if r.status_code >= 400:
            tally.refused[str(r.status_code)] += 1
        tally.end("prefill", "refused" if 400 <= r.status_code < 500 else "completed")
    except httpx.TimeoutException:
        tally.end("prefill", "left")
    except httpx.HTTPError as exc:
        tally.end("prefill", "lost", f"{type(exc).__name__}: {exc}")


async def stall(url: str, tally: Tally) -> None:
    tally.sent["stall"] += 1
    host, port = url.rsplit("//", 1)[1].split(":")
    body = json.dumps({"prompt": "Count: 1, 2, 3,", "max_tokens": 600, "stream": True}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    await asyncio.sleep(5)
    writer.close()
    tally.end("stall", "left")


async def bad(http: httpx.AsyncClient, tally: Tally, max_body: int) -> None:
    for action, content in (("bad-json", b"{not json"), ("oversize", b'{"prompt": "' + b"x" * max_body + b'"}')):
        tally.sent[action] += 1
        try:
            r = await http.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
            tally.end(action, "refused" if 400 <= r.status_code < 500 else "lost", f"HTTP {r.status_code}")
            tally.refused[str(r.status_code)] += 1
        except httpx.HTTPError as exc:
            tally.end(action, "lost", f"{type(exc).__name__}: {exc}")


async def flood(http: httpx.AsyncClient, tally: Tally, reference: dict[str, str]) -> None:
    await asyncio.gather(*(whole(http, PROMPTS[i % len(PROMPTS)], tally, reference) for i in range(30)))


async def steer(http: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    command = rng.choice(["k=2", "k=4", "draft=lookup", "draft=none", "adaptive=on"])
    tally.sent["steer"] += 1
    try:
        r = await http.post("/v1/specdash/command", json={"command": command})
        tally.end("steer", "completed" if r.status_code == 200 else "refused", command)
        if r.status_code != 200:
            tally.refused[str(r.status_code)] += 1
    except httpx.HTTPError as exc:
        tally.end("steer", "lost", f"{type(exc).__name__}: {exc}")


async def soak(url: str, args: argparse.Namespace, fault: Path, proc: psutil.Process) -> tuple[Tally, dict[str, float]]:
    tally = Tally()
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        reference = {}
        for p in PROMPTS:  # plain decoding of each prompt: what every greedy answer must equal
            r = await http.post("/v1/completions", json={"prompt": p, "max_tokens": TOKENS, "temperature": 0,
                                                         "speculative.n_max": 0})
            r.raise_for_status()
            reference[p] = r.json()["choices"][0]["text"]
        start = time.monotonic()
        end = start + args.minutes * 60
        rss: dict[str, float] = {}
        last_fault = [start]

        async def worker(n: int) -> None:
            wrng = random.Random(args.seed * 100 + n)
            while time.monotonic() < end:
                action = wrng.choices(["stream", "whole", "leave", "prefill", "stall", "bad", "flood", "steer",
                                       "fault"], weights=[30, 30, 8, 5, 3, 4, 2, 6, 2])[0]
                prompt = wrng.choice(PROMPTS)
                if action == "stream":
                    await stream(http, {"prompt": prompt, "max_tokens": TOKENS, "temperature": 0.7}, tally, action)
                elif action == "whole":
                    await whole(http, prompt, tally, reference)
                elif action == "leave":
                    await stream(http, {"prompt": prompt, "max_tokens": 200}, tally, action, leave_after=2)
                elif action == "prefill":
                    await prefill_leave(http, tally)
                elif action == "stall":
                    await stall(url, tally)
                elif action == "bad":
                    await bad(http, tally, args.max_body)
                elif action == "flood":
                    await flood(http, tally, reference)
                elif action == "steer":
                    await steer(http, wrng, tally)
                elif action == "fault" and time.monotonic() - last_fault[0] > 120:
                    last_fault[0] = time.monotonic()
                    tally.sent["fault"] += 1
                    fault.touch()

        async def sample() -> None:
            said = start
            while time.monotonic() < end:
                await asyncio.sleep(5)
                now = time.monotonic()
                if "minute 2" not in rss and now - start >= min(120, args.minutes * 30):
                    rss["minute 2"] = proc.memory_info().rss / 2**20
                if now - said >= 60:  # progress: a long run says how it goes
                    said = now
                    print(f"  {(now - start) / 60:4.1f} min: sent {sum(tally.sent.values())}, "
                          f"{dict(sorted(tally.ends.items()))}, rss {proc.memory_info().rss / 2**20:.0f} MiB",
                          file=sys.stderr, flush=True)

        await asyncio.gather(sample(), *(worker(n) for n in range(args.workers)))
        rss["end"] = proc.memory_info().rss / 2**20
        metrics = (await http.get("/metrics")).text
    refusals = dict(re.findall(r'specdash_http_refusals_total\{[^}]*reason="(\w+)"[^}]*\} ([0-9.e+]+)', metrics))
    tally.refused.update({f"server:{k}": int(float(v)) for k, v in refusals.items() if float(v)})
    return tally, rss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="lookup")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--max-body", type=int, default=262144)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fault = Path(tmp) / "fault"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "specdash", "serve", "--headless", "--port", str(port), "--target", args.target,
               "--draft", args.draft, "--parallel", "auto", "--max-waiting", "16", "--timeout", "120",
               "--send-timeout", "2", "--max-body", str(args.max_body), "--ctx", "4096"]
        log = open(Path(tmp) / "serve.log", "w")
        server = subprocess.Popen(cmd, stderr=log, stdout=subprocess.DEVNULL,
                                  env={**os.environ, "SPECDASH_FAULT_FILE": str(fault)})
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    print((Path(tmp) / "serve.log").read_text(), file=sys.stderr)
                    return 1
                time.sleep(0.5)
            tally, rss = asyncio.run(soak(url, args, fault, psutil.Process(server.pid)))
        finally:
            server.terminate()
            code = server.wait(60)
            log.close()
        said = (Path(tmp) / "serve.log").read_text()
    growth = (rss["end"] - rss["minute 2"]) / rss["minute 2"] * 100
    ttft = sorted(tally.ttft)
    lines = [
        f"# serve soak: {args.minutes:g} min, {args.target} + {args.draft}, --parallel auto, {args.workers} workers, "
        f"seed {args.seed}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        f"sent        {sum(tally.sent.values())}  ({', '.join(f'{k} {v}' for k, v in sorted(tally.sent.items()))})",
        f"ended       {', '.join(f'{k} {v}' for k, v in sorted(tally.ends.items()))}",
        f"lost        {len(tally.lost)}" + "".join(f"\n  {x}" for x in tally.lost[:10]),
        f"refused     {', '.join(f'{k} {v}' for k, v in sorted(tally.refused.items()))}",
        f"greedy      {tally.greedy[0]} of {tally.greedy[1]} equal to plain decoding (a near-tie may flip one)",
        f"rss         minute 2 {rss['minute 2']:.0f} MiB, end {rss['end']:.0f} MiB ({growth:+.1f}%)",
        f"ttft        p50 {statistics.median(ttft) * 1000:.0f} ms, p99 {ttft[int(len(ttft) * 0.99)] * 1000:.0f} ms "
        f"({len(ttft)} streams)" if ttft else "ttft        no streams",
        f"engine      {said.count('the engine reloads')} reloads after faults; server exit {code}",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if not tally.lost and abs(growth) <= 5 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
