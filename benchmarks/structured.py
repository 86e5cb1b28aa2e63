"""Schema-bound output and agents' tool calls: `specdash serve` against llama-server (started
with `--jinja`) on the same requests: the same `response_format` json_schema, the same
`tools`, and a recorded agent loop of 8 turns replayed (read a file, run the tests, edit the
file, run them again, read and edit the README, then the summary).

Arms (one process each, started once; llama.cpp's threads sleep when idle):
    llama-plain         llama-server --jinja, no speculation
    llama-ngram         llama-server --jinja --spec-type ngram-simple
    llama-draft         llama-server --jinja -md DRAFT --spec-type draft-simple --spec-draft-n-max 4
    specdash            specdash serve --headless, its defaults (auto drafter, adaptive K)
    specdash-nogrammar  another specdash serve, each request sent `speculative.grammar: false`
                        (the grammar's fixed text not drafted: what the grammar drafter adds)
    specdash-plain      a third, each request sent `speculative.n_max: 0` (speculation off)

Each request streams (temperature 0). Per request: decode tok/s (completion tokens over the
time from the first streamed delta, content or a call's, to the end) and wall time. Rounds
are paired: each round runs every request on every arm, the arms' order rotating, and a
ratio is taken within a round, then its median over rounds with the spread (min..max).
specdash is started afresh each round (two processes, one per specdash arm); llama-server
runs with --cache-ram 0.

    python benchmarks/structured.py --rounds 3 --out benchmarks/results/structured.txt
    python benchmarks/structured.py --rounds 1 --only extract-invoice --tokens 64   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serve_vs_llamaserver import Arm, free_port, med, spread  # noqa: E402

from specdash.engine.repack import tool_args  # noqa: E402
from specdash.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, model_path  # noqa: E402
from specdash.tuning.llamacpp_tools import ensure_built  # noqa: E402


def schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


INVOICE = {"type": "object", "additionalProperties": False,
           "required": ["invoice_number", "customer_billing_name", "customer_billing_address", "invoice_issue_date",
                        "payment_due_date", "currency_code", "line_items", "total_amount_including_tax"],
           "properties": {
               "invoice_number": {"type": "string"}, "customer_billing_name": {"type": "string"},
               "customer_billing_address": {"type": "string"}, "invoice_issue_date": {"type": "string"},
               "payment_due_date": {"type": "string"}, "currency_code": {"enum": ["EUR", "USD", "GBP"]},
               "line_items": {"type": "array", "items": {
                   "type": "object", "additionalProperties": False,
                   "required": ["item_description", "quantity_ordered", "unit_price_excluding_tax"],
                   "properties": {"item_description": {"type": "string"}, "quantity_ordered": {"type": "integer"},
                                  "unit_price_excluding_tax": {"type": "number"}}}},
               "total_amount_including_tax": {"type": "number"}}}
INVOICE_TEXT = ("Extract the invoice as JSON.\n\nINVOICE 2024-0117\nBilled to: Northwind Traders Ltd, 12 Harbour "
                "Street, Bristol BS1 4QA\nIssued 3 March 2024, payment due 2 April 2024. Amounts in GBP.\n"
                "- 4 x Ergonomic office chair at 189.00\n- 2 x Standing desk frame at 310.50\n- 10 x Monitor arm "
                "at 42.75\nTotal including VAT: 2065.50")

TICKETS = {"type": "object", "additionalProperties": False, "required": ["tickets"], "properties": {
    "tickets": {"type": "array", "items": {
        "type": "object", "additionalProperties": False,
        "required": ["ticket_title", "affected_component", "severity_level", "steps_to_reproduce"],
        "properties": {"ticket_title": {"type": "string"},
                       "affected_component": {"enum": ["frontend", "backend", "database", "infrastructure"]},
                       "severity_level": {"enum": ["low", "medium", "high", "critical"]},
                       "steps_to_reproduce": {"type": "array", "items": {"type": "string"}}}}}}}
TICKETS_TEXT = ("Turn these bug reports into tickets (JSON).\n1. The login page spins forever on Safari after "
                "entering a password; open the page, type credentials, press Enter.\n2. Nightly backup job "
                "fails with disk full on the replica; wait for 02:00, check the job log.\n3. Search API returns "
                "500 for queries with an apostrophe; call /search?q=o'brien.")

PROFILE = {"type": "object", "additionalProperties": False,
           "required": ["full_name", "employment_status", "preferred_contact_method", "spoken_languages",
                        "is_newsletter_subscriber"],
           "properties": {"full_name": {"type": "string"},
                          "employment_status": {"enum": ["employed", "self_employed", "unemployed", "retired",
                                                         "student"]},
                          "preferred_contact_method": {"enum": ["email", "phone", "post"]},
                          "spoken_languages": {"type": "array", "items": {"type": "string"}},
                          "is_newsletter_subscriber": {"type": "boolean"}}}
PROFILE_TEXT = ("Fill the customer profile as JSON: Maria Gonzalez runs her own bakery, speaks Spanish, English "
                "and Catalan, prefers to be phoned, and said yes to the newsletter.")

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Replace a file's whole content",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "content": {"type": "string"}},
                                          "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "run_command", "description": "Run a shell command",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"},
                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"]}}},
]

UTILS = '''"""Small helpers for the report tool."""


def mean(values):
    """The arithmetic mean of a list of numbers."""
    return sum(values) / len(values)


def median(values):
    """The middle value of a list of numbers."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return ordered[middle - 1] + ordered[middle] / 2


def clamp(value, low, high):
    """value limited to the range [low, high]."""
    return max(low, min(value, high))
'''
TEST = '''from utils import clamp, mean, median


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_median_even():
    assert median([1, 2, 3, 4]) == 2.5


def test_clamp():
    assert clamp(5, 0, 3) == 3
'''
FAIL = ("F.\n=================================== FAILURES ===================================\n"
        "_______________________________ test_median_even _______________________________\n"
        "    def test_median_even():\n>       assert median([1, 2, 3, 4]) == 2.5\nE       assert 4.0 == 2.5\n"
        "E        +  where 4.0 = median([1, 2, 3, 4])\ntests/test_utils.py:9: AssertionError\n"
        "1 failed, 2 passed in 0.02s")
FIXED = UTILS.replace("return ordered[middle - 1] + ordered[middle] / 2",
                      "return (ordered[middle - 1] + ordered[middle]) / 2")
README = "# report tool\n\nHelpers for the weekly report: `mean`, `median` and `clamp` in `utils.py`.\n\nRun the tests with `pytest -q`.\n"
README_NEW = README + "\n## Changes\n\n- `median` of an even number of values is now the mean of the two middle values.\n"


def _call(i: int, name: str, args: dict[str, str]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _result(i: int, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{i}", "content": text}


# The recorded loop: each turn's request is the conversation up to the tool result before it;
# the answer measured is whatever the model writes next (a call, or at the end the summary).
LOOP: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent. Use the tools to inspect and change the repository. "
                                  "Call one tool at a time."},
    {"role": "user", "content": "The test test_median_even fails. Read utils.py and tests/test_utils.py, fix the "
                                "bug, check the tests pass, then note the change in README.md."},
    _call(1, "read_file", {"path": "utils.py"}), _result(1, UTILS),
    _call(2, "read_file", {"path": "tests/test_utils.py"}), _result(2, TEST),
    _call(3, "run_command", {"command": "pytest -q tests/test_utils.py"}), _result(3, FAIL),
    _call(4, "write_file", {"path": "utils.py", "content": FIXED}), _result(4, "wrote utils.py (21 lines)"),
    _call(5, "run_command", {"command": "pytest -q tests/test_utils.py"}), _result(5, "...\n3 passed in 0.01s"),
    _call(6, "read_file", {"path": "README.md"}), _result(6, README),
    _call(7, "write_file", {"path": "README.md", "content": README_NEW}), _result(7, "wrote README.md (9 lines)"),
]
# The turns: the model answers after the user's message and after each tool result.
LOOP_TURNS = [i + 1 for i, m in enumerate(LOOP) if m["role"] in ("user", "tool")]


@dataclass
class Request:
    name: str
    kind: str  # schema | tools | agent
    body: dict[str, Any]


def requests(tokens: int) -> list[Request]:
    out = [Request(name, "schema", {"messages": [{"role": "user", "content": text}],
                                    "response_format": schema_format(name, schema), "max_tokens": tokens})
           for name, schema, text in (("extract-invoice", INVOICE, INVOICE_TEXT),
                                      ("tickets-nested", TICKETS, TICKETS_TEXT),
                                      ("profile-enums", PROFILE, PROFILE_TEXT))]
    out += [Request("weather-call", "tools", {"messages": [{"role": "user", "content": "Is it raining in Lisbon? "
                                                            "Answer in celsius."}], "tools": TOOLS,
                                              "max_tokens": tokens}),
            Request("read-call", "tools", {"messages": [{"role": "user", "content": "Show me what is in "
                                                         "src/config/settings_production.yaml"}], "tools": TOOLS,
                                           "max_tokens": tokens}),
            # Forced: both servers hold the call to the tools' grammar (Qwen2.5-Coder writes
            # its calls fenced under auto, where no grammar engages on either side).
            Request("run-required", "tools", {"messages": [{"role": "user", "content": "List the Python files "
                                                            "under src/ sorted by size."}], "tools": TOOLS,
                                              "tool_choice": "required", "max_tokens": tokens}),
            Request("weather-named", "tools", {"messages": [{"role": "user", "content": "Weather in Oslo, "
                                                             "please, in fahrenheit."}], "tools": TOOLS,
                                               "tool_choice": {"type": "function",
                                                               "function": {"name": "get_weather"}},
                                               "max_tokens": tokens})]
    # The loop's turns may write whole files: room for the edit.
    out += [Request(f"agent-turn-{n}", "agent", {"messages": LOOP[:end], "tools": TOOLS,
                                                 "max_tokens": max(tokens, 320)})
            for n, end in enumerate(LOOP_TURNS, 1)]
    return out


@dataclass
class Result:
    arm: str
    name: str
    rnd: int
    first: float  # seconds to the first delta (content or a call's)
    wall: float
    tokens: int
    text: str  # the content, or the calls as name(arguments)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def decode_tps(self) -> float:
        """The server's own decode rate (its timings: predicted_n over predicted_ms). Not the
        client's time from the first delta: specdash holds a call's text until it knows it is
        a call, llama-server streams a fenced call as content, so first deltas differ."""
        ms = self.timings.get("predicted_ms", 0)
        return self.timings.get("predicted_n", 0) / ms * 1e3 if ms > 0 else 0.0

    @property
    def e2e_tps(self) -> float:
        """Completion tokens over the whole request, prefill included, as the client waits."""
        return self.tokens / self.wall if self.wall > 0 else 0.0


def send(url: str, body: dict[str, Any], extra: dict[str, Any]) -> tuple[float, float, int, str, dict[str, float]]:
    """One streamed request: (first delta s, wall s, completion tokens, what it said, draft counts)."""
    body = {**body, **extra, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, text, calls, usage, timings = 0.0, [], {}, {}, {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"{url}: {r.status_code} {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if (delta.get("content") or delta.get("tool_calls")) and not first:
                    first = time.perf_counter() - t0
                text.append(delta.get("content") or "")
                for c in delta.get("tool_calls") or []:
                    call = calls.setdefault(c.get("index", 0), ["", ""])
                    call[0] += (c.get("function") or {}).get("name") or ""
                    call[1] += (c.get("function") or {}).get("arguments") or ""
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    wall = time.perf_counter() - t0
    said = "".join(text) + "".join(f"{n}({a})" for n, a in calls.values())
    return first, wall, int(usage.get("completion_tokens") or 0), said, \
        {k: float(timings.get(k) or 0) for k in ("draft_n", "draft_n_accepted", "predicted_n", "predicted_ms")}


def grammar_drafted(url: str) -> float:
    """specdash's count of tokens its grammars drafted (/metrics, drafter="grammar")."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("specdash_source_draft_tokens_total{") and 'drafter="grammar"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def arms(ctx: int, threads: int) -> list[Arm]:
    bin_dir = ensure_built(["llama-server"])
    target, draft = model_path(DEFAULT_TARGET), model_path(DEFAULT_DRAFT)
    base = [str(bin_dir / "llama-server"), *tool_args(), "-m", str(target), "--host", "127.0.0.1", "--jinja",
            "-c", str(2 * ctx), "-np", "2", "-t", str(threads), "--cache-ram", "0"]
    out = [Arm("llama-plain", base, free_port()),
           Arm("llama-ngram", [*base, "--spec-type", "ngram-simple"], free_port()),
           Arm("llama-draft", [*base, "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", "4"],
               free_port()),
           *(Arm(name, [sys.executable, "-m", "specdash", "serve", "--headless", "--ctx", str(ctx),
                        "--threads", str(threads)], free_port()) for name in SPECDASH)]
    for arm in out:
        arm.argv = [*arm.argv, "--port", str(arm.port)]
    return out


# An arm as the rounds run it: a server, and what each request to it adds.
RUNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("llama-plain", {}), ("llama-ngram", {}), ("llama-draft", {}), ("specdash", {}),
    ("specdash-nogrammar", {"speculative.grammar": False}), ("specdash-plain", {"speculative.n_max": 0}))
SPECDASH = ("specdash", "specdash-nogrammar", "specdash-plain")
LLAMA = ("llama-plain", "llama-ngram", "llama-draft")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128, help="max_tokens per request (agent turns: at least 320)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", help="comma-separated request names (default: all)")
    ap.add_argument("--no-concurrent", action="store_true", help="skip the two-client rounds")
    ap.add_argument("--out", type=Path, help="write the report here too")
    args = ap.parse_args()

    todo = requests(args.tokens)
    if args.only:
        todo = [r for r in todo if r.name in args.only.split(",")]
    servers = {a.name: a for a in arms(args.ctx, args.threads)}
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "structured-bench"
    log_dir.mkdir(exist_ok=True)
    results: list[Result] = []
    pairs: list[tuple[str, int, float, int]] = []  # (arm, round, span s, tokens of both)

    def start(arm: Arm) -> None:
        print(f"starting {arm.name} ...", file=sys.stderr, flush=True)
        arm.start(log_dir)
        send(arm.url, requests(8)[0].body, {"max_tokens": 8})  # first-request costs are no arm's speed

    try:
        for arm in servers.values():
            if arm.name in LLAMA:
                start(arm)
        for rnd in range(args.rounds):
            # specdash starts afresh each round: its suffix memory would otherwise recall the
            # round before's answers to the same requests (`forget` is not steerable over
            # HTTP, issue 56); within a round it keeps what an agent's earlier turns taught it.
            for name in SPECDASH:
                start(servers[name])
            order = RUNS[rnd % len(RUNS):] + RUNS[:rnd % len(RUNS)]
            for req in todo:
                for name, extra in order:
                    arm = servers[name]
                    before = grammar_drafted(arm.url) if name in SPECDASH else 0.0
                    first, wall, n, said, timings = send(arm.url, req.body, extra)
                    if name in SPECDASH:  # the server's own count, per source (its steps precede the answer)
                        timings["grammar_n"] = grammar_drafted(arm.url) - before
                    results.append(Result(name, req.name, rnd, first, wall, n, said, timings))
                    print(f"round {rnd + 1} {req.name:16s} {name:18s} {n:4d} tok {results[-1].decode_tps:6.1f} "
                          f"tok/s decode {results[-1].e2e_tps:6.1f} e2e  drafted {timings['draft_n']:.0f}/"
                          f"{timings['draft_n_accepted']:.0f}", file=sys.stderr, flush=True)
            if not args.no_concurrent:  # two clients: the schemas and the tool calls, two at a time
                two = [r for r in todo if r.kind != "agent"]
                for i in range(0, len(two) - 1, 2):
                    for name, extra in order:
                        arm = servers[name]
                        got: list[int] = []
                        t0 = time.perf_counter()

                        def one(req: Request, arm: Arm = arm, extra: dict[str, Any] = extra) -> None:
                            got.append(send(arm.url, req.body, extra)[2])

                        threads = [threading.Thread(target=one, args=(r,)) for r in two[i:i + 2]]
                        for t in threads:
                            t.start()
                        for t in threads:
                            t.join()
                        pairs.append((name, rnd, time.perf_counter() - t0, sum(got)))
            for name in SPECDASH:
                servers[name].stop()
    finally:
        for arm in servers.values():
            arm.stop()

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    names = [n for n, _ in RUNS]
    say(f"# structured output and tool calls: specdash serve vs llama-server --jinja: {platform.node()} "
        f"{platform.machine()}, {args.threads} threads, {args.rounds} paired rounds, max_tokens {args.tokens} "
        f"(agent turns {max(args.tokens, 320)}), temperature 0, streamed")
    say(f"# command: python benchmarks/structured.py {' '.join(sys.argv[1:])}")
    say(f"# target {DEFAULT_TARGET}, draft {DEFAULT_DRAFT}")
    say("")
    by_kind: dict[str, list[float]] = {}
    for metric, title in (("decode_tps", "decode tok/s (each server's own timings: predicted_n / predicted_ms)"),
                          ("e2e_tps", "end-to-end tok/s (completion tokens / the request's wall time, prefill "
                                      "included)")):
        say(f"## One client: {title}, median over rounds; specdash / the best llama-server arm and / specdash "
            "without grammar drafts (median of per-round ratios, spread)")
        say(f"{'request':16s} " + " ".join(f"{n[:12]:>12s}" for n in names) + "   vs best llama (spread)        "
            "vs no-grammar       vs plain        drafted/accepted  grammar share")
        for req in todo:
            per = {n: [r for r in results if r.arm == n and r.name == req.name] for n in names}
            tps = {n: med([getattr(r, metric) for r in per[n]]) for n in names}
            best = max(LLAMA, key=lambda n: tps[n])

            def ratio(a: str, b: str) -> list[float]:
                return [getattr(x, metric) / getattr(y, metric) for x in per[a] for y in per[b]
                        if x.rnd == y.rnd and getattr(y, metric)]

            vs_best, vs_off = ratio("specdash", best), ratio("specdash", "specdash-nogrammar")
            vs_plain = ratio("specdash", "specdash-plain")
            if metric == "decode_tps":
                by_kind.setdefault(req.kind, []).append(med(vs_best))
            s0 = per["specdash"][0].timings if per["specdash"] else {}
            share = med([r.timings.get("grammar_n", 0) / r.tokens for r in per["specdash"] if r.tokens])
            say(f"{req.name:16s} " + " ".join(f"{tps[n]:12.1f}" for n in names)
                + f"   {med(vs_best):.2f}x {best:11s} ({spread(vs_best)})   {med(vs_off):.2f}x ({spread(vs_off)})"
                + f"   {med(vs_plain):.2f}x ({spread(vs_plain)})"
                + f"   {s0.get('draft_n', 0):.0f}/{s0.get('draft_n_accepted', 0):.0f}   {share:.0%}")
        say("")
    agent = [r for r in todo if r.kind == "agent"]
    if agent:
        say("## The agent loop: total wall seconds over its turns, per round (median), and specdash / each arm")
        totals = {n: [sum(r.wall for r in results if r.arm == n and r.rnd == rnd and r.name.startswith("agent-"))
                      for rnd in range(args.rounds)] for n in names}
        for n in names:
            ratio_s = [t / s for t, s in zip(totals[n], totals["specdash"]) if s > 0]
            say(f"{n:18s} {med(totals[n]):8.1f} s   specdash is {med(ratio_s):.2f}x faster ({spread(ratio_s)})")
        say("")
    say("## Median decode ratio specdash / best llama-server arm, by kind")
    for kind, xs in by_kind.items():
        say(f"{kind:8s} {med(xs):.2f}x over {len(xs)} requests (min {min(xs):.2f}x)")
    if pairs:
        say("")
        say("## Two clients at once (schemas and tool calls in pairs): total tok/s, median over pairs and rounds")
        for arm_name in names:
            totals = [tok / span for a, _, span, tok in pairs if a == arm_name and span > 0]
            say(f"{arm_name:18s} {med(totals):8.1f} tok/s ({spread(totals)})")
    say("")
    say("## Same answer? (round 1, each arm against llama-plain)")
    for req in todo:
        ref = next((r for r in results if r.arm == "llama-plain" and r.name == req.name and r.rnd == 0), None)
        same = [n for n in names[1:] if ref and any(r.arm == n and r.name == req.name and r.rnd == 0
                                                      and r.text == ref.text for r in results)]
        say(f"{req.name:16s} identical: {', '.join(same) or 'none'}")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
