"""Weight repacking decided per machine by trying (issue 30: AMX crashes llama.cpp on some
Intel CPUs at the first multi-token batch).

The decision logic runs on fake children (one that kills itself with SIGSEGV, one that
hangs, one that succeeds), so it is proven on every kind of machine; the real probe runs
too (its child really loads and decodes the probe model), and what it decided must reach
doctor, `run --json`'s settings event and the tools' argument lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_ok, specdash

from specdash.engine import repack
from specdash.models.gguf_header import TensorInfo

# Fake children, by behaviour: each is `python -c CODE`.
SEGV = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
HANG = "import time; time.sleep(60)"
OK = "pass"
FAIL = "import sys; print('llama.cpp could not load it', file=sys.stderr); sys.exit(3)"
AMX_MACHINE = {"AMX": 1, "CPU_REPACK": 2}


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A private cache, no env override, no verdict resolved yet in this process; the
    conftest's verdict is restored afterwards."""
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(repack.ENV, raising=False)
    saved = dict(repack._resolved)
    repack.forget()
    yield tmp_path
    repack.forget()
    repack._resolved.update(saved)
    repack.hooks.child_argv = repack._child_argv
    repack.hooks.timeout = repack.PROBE_TIMEOUT_S
    repack.hooks.announce = None


def fake_children(monkeypatch, tmp_path: Path, behaviour: dict[str, str], bufts=AMX_MACHINE) -> Path:
    """Children that act per mode; each call is logged (one line per mode) in the file returned."""
    log = tmp_path / "children.log"
    monkeypatch.setattr(repack, "extra_bufts", lambda: dict(bufts))

    def argv(mode: str, model: Path) -> list[str]:
        assert model.is_file()  # the real probe model was written for it
        return [sys.executable, "-c", f"open({str(log)!r}, 'a').write({mode!r} + '\\n')\n{behaviour[mode]}"]

    repack.hooks.child_argv = argv
    return log


def calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_amx_crash_in_the_probe_avoids_amx_and_keeps_repacking(fresh, monkeypatch):
    log = fake_children(monkeypatch, fresh, {"on": SEGV, "no-amx": OK, "off": OK})
    said: list[str] = []
    repack.hooks.announce = said.append
    v = repack.resolve()
    assert (v.mode, v.origin) == ("no-amx", "probe")
    assert v.tried == (("on", "killed by SIGSEGV"), ("no-amx", "ok"))
    assert calls(log) == ["on", "no-amx"]
    assert v.label() == "no-amx (AMX crashed in a probe)"
    # Said once, in one line, with the upstream issue and how to override it.
    assert len(said) == 1 and "\n" not in said[0]
    assert "AMX crashed in a probe" in said[0] and "#20824" in said[0] and repack.ENV in said[0]


def test_everything_crashing_but_off_turns_repacking_off(fresh, monkeypatch):
    fake_children(monkeypatch, fresh, {"on": SEGV, "no-amx": SEGV, "off": OK})
    v = repack.resolve()
    assert v.mode == "off" and v.label() == "off (AMX crashed in a probe)"
    assert repack.tool_args(v) == ["--no-repack"]


def test_a_hanging_child_counts_as_failed_after_its_timeout(fresh, monkeypatch):
    log = fake_children(monkeypatch, fresh, {"on": HANG, "no-amx": HANG, "off": OK})
    repack.hooks.timeout = 1.0
    v = repack.resolve()
    assert v.mode == "off"
    assert v.tried[0] == ("on", "timed out after 1 s") and calls(log) == ["on", "no-amx", "off"]
    assert "failed in a probe (timed out after 1 s)" in v.label()


def test_a_child_that_decodes_keeps_llama_cpps_default(fresh, monkeypatch):
    log = fake_children(monkeypatch, fresh, {"on": OK, "no-amx": SEGV, "off": SEGV})
    v = repack.resolve()
    assert (v.mode, v.label(), calls(log)) == ("on", "on", ["on"])
    assert repack.tool_args(v) == []


def test_no_amx_is_only_tried_where_llama_cpp_lists_amx(fresh, monkeypatch):
    log = fake_children(monkeypatch, fresh, {"on": FAIL, "no-amx": OK, "off": OK}, bufts={"CPU_REPACK": 2})
    v = repack.resolve()
    assert v.mode == "off" and calls(log) == ["on", "off"]
    assert v.tried[0] == ("on", "exit 3: llama.cpp could not load it")
    assert v.label() == "off (repack on failed in a probe (exit 3: llama.cpp could not load it))"


def test_the_verdict_is_cached_per_cpu_and_llama_cpp_version(fresh, monkeypatch):
    import llama_cpp

    log = fake_children(monkeypatch, fresh, {"on": SEGV, "no-amx": OK, "off": OK})
    first = repack.resolve()
    assert repack.cache_file().is_file() and calls(log) == ["on", "no-amx"]
    # A new process (forget) on the same machine reads the cache: no child runs.
    repack.forget()
    again = repack.resolve()
    assert (again.mode, again.origin, again.tried) == (first.mode, "cache", first.tried)
    assert calls(log) == ["on", "no-amx"]
    # Another CPU, or another llama-cpp-python, is another key: the probe runs again.
    monkeypatch.setattr(repack, "cpu_identity", lambda: ("Some Other CPU", "f00"))
    repack.forget()
    assert repack.resolve().origin == "probe" and calls(log) == ["on", "no-amx"] * 2
    monkeypatch.setattr(llama_cpp, "__version__", "9.9.9")
    repack.forget()
    assert repack.resolve().origin == "probe" and len(calls(log)) == 6
    assert len(list(repack.cache_file().parent.glob("*.json"))) == 3


def test_each_override_wins_over_the_probe(fresh, monkeypatch):
    log = fake_children(monkeypatch, fresh, {"on": OK, "no-amx": OK, "off": OK})
    # An explicit setting (config key or flag) runs no probe.
    for setting in ("on", "no-amx", "off"):
        v = repack.resolve(setting)
        assert (v.mode, v.origin) == (setting, "setting") and v.label().endswith(f"(repack = {setting})")
    # The environment variable stands in for "auto".
    monkeypatch.setenv(repack.ENV, "off")
    v = repack.resolve()
    assert (v.mode, v.origin, v.label()) == ("off", "env", f"off ({repack.ENV}=off)")
    assert repack.resolve("on").mode == "on"  # an explicit setting beats the variable
    assert calls(log) == []


def test_bad_values_are_one_line_errors(fresh, monkeypatch):
    monkeypatch.setenv(repack.ENV, "sometimes")
    with pytest.raises(repack.SpecdashError, match=r'SPECDASH_REPACK="sometimes": must be one of auto, on, no-amx, off'):
        repack.resolve()
    proc = specdash("doctor", "--repack", "maybe")
    assert proc.returncode == 2 and proc.stderr.strip().endswith('--repack "maybe": must be one of auto, on, no-amx, off')
    proc = specdash("run", "--repack", "maybe", "--prompt", "hi")
    assert proc.returncode == 2 and '--repack "maybe": must be one of auto, on, no-amx, off' in proc.stderr


def test_no_amx_points_exactly_the_weights_cpu_repack_takes_at_it(monkeypatch):
    monkeypatch.setattr(repack, "_cpu_has", lambda feature: feature == "avx2")
    q4k, q6k, q4_0, q2k, q8_0 = 12, 14, 2, 10, 8
    tensors = [
        TensorInfo("blk.0.attn_q.weight", q4k, (1536, 1536), 0),  # in
        TensorInfo("blk.0.ffn_down.weight", q6k, (8960, 1536), 0),  # Q6_K: NEON only
        TensorInfo("blk.1.ffn_up.weight", q4_0, (1536, 8960), 0),  # in
        TensorInfo("blk.1.attn_k.weight", q4k, (1536, 250), 0),  # rows not a multiple of 8
        TensorInfo("token_embd.weight", q4k, (1536, 151936), 0),  # GET_ROWS, never repacked
        TensorInfo("output.weight", q8_0, (1536, 151936), 0),  # Q8_0: NEON only
        TensorInfo("blk.2.ffn_gate_exps.weight", q4k, (512, 1024, 8), 0),  # experts, 3-D: in
        TensorInfo("blk.2.ffn_gate.weight", q2k, (512, 1024), 0),  # Q2_K wants AVX-512
        TensorInfo("blk.2.attn_norm.weight", 0, (1536,), 0),
    ]
    assert repack.repack_overrides(tensors) == ["blk.0.attn_q.weight", "blk.1.ffn_up.weight",
                                                "blk.2.ffn_gate_exps.weight"]
    monkeypatch.setattr(repack, "_cpu_has", lambda feature: True)
    assert "blk.2.ffn_gate.weight" in repack.repack_overrides(tensors)


def test_the_real_probe_decides_and_doctor_says_so(tmp_path, pytestconfig):
    """The real child on this machine, from a clean cache, through `specdash doctor`: the
    check names the mode, what the probe tried and where the verdict is cached; a second
    run reads the cache."""
    env = {k: v for k, v in os.environ.items() if k != repack.ENV}
    env["SPECDASH_CACHE"] = str(tmp_path / "cache")
    first = subprocess.run([sys.executable, "-m", "specdash", "doctor", "--json"], capture_output=True, text=True,
                           env=env, timeout=600)
    assert_ok(first)
    (hint,) = [h for h in json.loads(first.stdout)["hints"] if h["key"] == "repack"]
    expected = pytestconfig._repack_verdict.mode  # what this run's conftest resolved
    assert hint["message"].startswith(f"repack {expected}")
    assert "probe: on: " in hint["evidence"] and str(tmp_path / "cache" / "repack") in hint["evidence"]
    # The first time, one line on stderr says what was decided.
    assert f"specdash: weight repacking {expected}:" in first.stderr
    cached = json.loads(next((tmp_path / "cache" / "repack").glob("*.json")).read_text())
    assert cached["mode"] == expected and cached["tried"][0][0] == "on"
    if expected != "on":
        assert hint["level"] == "warn" and "crashed in a probe" in hint["message"] + hint["evidence"]
    again = subprocess.run([sys.executable, "-m", "specdash", "doctor"], capture_output=True, text=True,
                           env=env, timeout=600)
    assert_ok(again)
    assert "weight repacking" not in again.stderr  # said only the first time
    assert f"repack {expected}" in again.stdout


def test_the_first_settings_event_and_the_tools_carry_the_verdict(smol_path, pytestconfig):
    from specdash.tuning.llamacpp_tools import tool_command

    mode = pytestconfig._repack_verdict.mode
    proc = specdash("run", "--json", "--target", str(smol_path), "--draft", "none", "--k", "0",
                    "--max-tokens", "4", "--threads", "2", "--prompt", "Repeat this line four times: the cat")
    assert_ok(proc)
    settings = next(json.loads(line) for line in proc.stdout.splitlines() if '"settings"' in line)
    assert settings["repack"] == "auto" and settings["repack_verdict"].split(" ")[0] == mode
    # The tools get --no-repack exactly when this process does not repack as llama.cpp would.
    argv = tool_command("llama-server", "-m", "x.gguf") if _tools_built() else None
    if argv is not None:
        assert ("--no-repack" in argv) == (mode != "on")
    for v, want in ((repack.Verdict("on", "on", "setting"), []),
                    (repack.Verdict("no-amx", "auto", "probe"), ["--no-repack"]),
                    (repack.Verdict("off", "off", "setting"), ["--no-repack"])):
        assert repack.tool_args(v) == want


def _tools_built() -> bool:
    from specdash.tuning.llamacpp_tools import is_built

    return is_built(["llama-server"])


def test_each_mode_loads_and_decodes_a_verify_batch_where_the_probe_allows(pytestconfig, monkeypatch):
    """The engine's loader, on the probe model, with every mode the verdict considers safe
    here (never "on" where the probe saw it crash): batches of 5 decode to finite logits,
    and "no-amx" really moves the eligible weights to CPU_REPACK."""
    import collections

    import numpy as np

    from specdash.models import llamalog
    from specdash.engine.llm import LLM
    from specdash.engine.repack_model import probe_model

    v = pytestconfig._repack_verdict
    safe = repack.MODES[repack.MODES.index(v.mode):]
    for mode in safe:
        monkeypatch.setattr(llamalog, "_TAIL", collections.deque(maxlen=100_000))  # the whole load log
        llm = LLM(probe_model(), n_ctx=256, n_threads=2, repack_setting=mode)
        repacked = any("CPU_REPACK model buffer size" in line for line in llamalog._TAIL)
        try:
            logits = llm.decode([1, 2, 3, 4, 5], 0, "all")
            assert np.isfinite(logits).all()
        finally:
            llm.close()
        if mode == "off":
            assert not repacked
        elif mode == "no-amx" and repack._cpu_has("avx2") and "CPU_REPACK" in repack.extra_bufts():
            assert repacked, "no-amx keeps the Q4_K and Q4_0 weights repacked"
