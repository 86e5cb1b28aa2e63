"""Prometheus names operators can import (issue 42): specdash's own `specdash_` series,
vLLM's names under --metrics-names vllm, the Grafana board under docs/ reading only what
is exported, and attach/the fleet reading every naming a fleet may mix (today's, the old
`specdash:` one from a saved exposition, and a specdash exporting vLLM's names, which is
not taken for a vLLM).

The expositions come from a real run (SmolLM2-135M drafting by lookup) fed to the
exporter, once per naming, so histograms and per-position counters have samples."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from specdash.engine.settings import EngineSettings
from specdash.monitor.metrics_exporter import MetricsExporter
from specdash.monitor.remote.backends import snapshot
from specdash.monitor.remote.metrics import parse

ROOT = Path(__file__).resolve().parent.parent
BOARD = ROOT / "docs" / "grafana" / "specdash.json"
OLD = Path(__file__).parent / "fixtures" / "specdash" / "metrics_old_names.txt"
PROMPT = "Repeat this line four times: the cat sat on the mat, the cat sat on the mat."

# The series vLLM's speculative-decoding board queries (its `expr`s and template variables):
# examples/observability/dashboards/grafana/vllm_speculative_decoding.json in
# vllm-project/vllm at commit 8aed4e52b9351d034c652dec96bd94cf8d441711 (the names only; the
# board itself is not copied here).
VLLM_BOARD_SERIES = (
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:generation_tokens_total",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:num_requests_running",
)
# The labels its expressions filter and group by that vLLM (not the scrape) sets.
VLLM_BOARD_LABELS = ("model_name", "engine", "position", "le")


@pytest.fixture(scope="module")
def expositions(smol_path) -> dict[str, str]:
    """One real run, fed to an exporter of each naming: {naming: exposition text}."""
    from specdash.sources.session import Session

    session = Session(EngineSettings(target="smollm2-135m", draft="lookup", k=3, adaptive=False, threads=2,
                                     ctx=1024))
    exporters = {names: MetricsExporter(None, names=names) for names in ("specdash", "vllm")}
    try:
        events = [session.engine.settings_event(), *session.run(PROMPT, 40)]
    finally:
        session.close()
    assert any(getattr(e, "drafted", 0) for e in events), "the run drafted nothing: no spec series to read"
    for ev in events:
        for exporter in exporters.values():
            exporter.feed(ev)
    return {names: generate_latest(e.registry).decode() for names, e in exporters.items()}


def series(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_specdash_names_follow_prometheus_rules(expositions):
    names = series(expositions["specdash"])
    ours = {n for n in names if not n.startswith("process_") and not n.startswith("python_")}
    assert ours and all(n.startswith("specdash_") and ":" not in n for n in ours), ours
    text = expositions["specdash"]
    counters = re.findall(r"^# TYPE (\S+) counter$", text, re.M)
    assert counters and all(c.endswith("_total") and c in names for c in counters)
    assert re.search(r"^# TYPE specdash_time_to_first_token_seconds histogram$", text, re.M)
    assert re.search(r"^# TYPE specdash_inter_token_latency_seconds histogram$", text, re.M)
    # One first token for the run; one inter-token observation per later step.
    ttft = re.search(r'^specdash_time_to_first_token_seconds_count\{[^}]*\} (\S+)$', text, re.M)
    itl = re.search(r'^specdash_inter_token_latency_seconds_count\{[^}]*\} (\S+)$', text, re.M)
    steps = re.search(r'^specdash_decode_steps_total\{[^}]*\} (\S+)$', text, re.M)
    assert ttft and itl and steps and float(ttft.group(1)) == 1.0
    assert float(itl.group(1)) == float(steps.group(1)) - 1
    assert re.search(r'^specdash_build_info\{[^}]*names="specdash"[^}]*\} 1\.0$', text, re.M)


def test_the_grafana_board_queries_only_exported_series(expositions):
    board = json.loads(BOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if isinstance(v.get("query"), dict)]
    assert len(exprs) >= 15
    named = {m for e in exprs for m in re.findall(r"\b(specdash_[a-z_]+)", e)}
    exported = series(expositions["specdash"])
    assert named and named <= exported, sorted(named - exported)
    # The acceptance panels are there, as vLLM's board has them.
    titles = {p["title"] for p in board["panels"]}
    assert {"Draft acceptance rate", "Mean acceptance length", "Acceptance by draft position", "Token flow"} <= titles


def test_metrics_names_vllm_exports_what_vllms_board_reads(expositions):
    text = expositions["vllm"]
    exported = series(text)
    missing = [n for n in VLLM_BOARD_SERIES if n not in exported]
    assert not missing, missing
    for name in VLLM_BOARD_SERIES:
        line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
        labels = set(re.findall(r'(\w+)="', line))
        assert {"model_name", "engine"} <= labels, line
    assert any('position="0"' in ln for ln in text.splitlines()
               if ln.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{"))
    assert any('le="+Inf"' in ln for ln in text.splitlines() if ln.startswith("vllm:inter_token_latency_seconds_bucket{"))
    # specdash's own series keep their names; nothing else is dressed up as vLLM's.
    assert "specdash_decode_steps_total" in exported and "specdash_build_info" in exported
    assert not any(n.startswith("specdash:") for n in exported)


@pytest.mark.parametrize("naming", ["specdash", "vllm", "old"])
def test_attach_reads_every_naming_as_a_specdash(expositions, naming):
    text = OLD.read_text(encoding="utf-8") if naming == "old" else expositions[naming]
    scrape = parse(text)
    assert scrape.backend() == "specdash"
    snap = snapshot(scrape, "specdash")
    assert snap.model == "smollm2-135m" and snap.drafter == "lookup" and snap.k == 3
    c = snap.counters
    assert c.tokens > 0 and c.num_drafts > 0 and c.num_draft_tokens >= c.num_accepted_tokens > 0
    assert c.steps > 0 and sum(c.per_pos) == c.num_accepted_tokens


def test_serve_metrics_names_vllm_on_a_real_server(smol_path, tmp_path):
    """The flag reaches a real server's /metrics (specdash serve --metrics-names vllm)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "specdash", "serve", "--headless", "--port", str(port),
                             "--target", "smollm2-135m", "--draft", "lookup", "--threads", "2", "--ctx", "1024",
                             "--metrics-names", "vllm"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if json.loads(r.read()).get("status") == "ok":
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        proc.terminate()
        proc.wait(30)
    names = series(text)
    assert {"vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:spec_decode_num_drafts_total",
            "specdash_build_info"} <= names
    assert parse(text).backend() == "specdash"
