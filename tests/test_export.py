"""Export: the settings as a llama-server launch, accepted by a real llama-server built
from the same llama.cpp (specdash.tuning.llamacpp_tools)."""

from __future__ import annotations

import os
import subprocess
import time

import httpx
import pytest

from cli_helpers import assert_ok, assert_usage_error, specdash
from specdash.contract import events as E
from specdash.records.export import command_line, preset_name, preset_section, server_args
from specdash.tuning.llamacpp_tools import is_built, tool_command, tool_path


def settings(**kw) -> E.SettingsEvent:
    base = dict(source="engine", target="smollm2-135m", drafter="lookup", draft="lookup", k=8, threads=2,
                ctx=1024, temperature=0.0, lookup_max_ngram=4, target_path="/m/smol.gguf")
    return E.SettingsEvent(**{**base, **kw})


def test_each_drafter_maps_to_llama_servers_own_flags():
    args, _ = server_args(settings())
    assert args[:2] == ["-m", "/m/smol.gguf"]
    assert "--spec-type ngram-simple" in " ".join(args) and "--spec-ngram-simple-size-m 8" in " ".join(args)
    args, _ = server_args(settings(draft="qwen", drafter="qwen", draft_path="/m/draft.gguf", draft_p_min=0.75))
    line = " ".join(args)
    assert "-md /m/draft.gguf --spec-draft-n-max 8 --spec-draft-p-min 0.75 --spec-type draft-simple" in line
    # specdash's joint confidence cut has no llama-server flag: said, not silently dropped
    args, notes = server_args(settings(draft="qwen", drafter="qwen", draft_path="/m/draft.gguf", draft_p_joint=0.1))
    assert "p-joint" not in " ".join(args) and any("draft_p_joint 0.1" in n and "no llama-server flag" in n
                                                    for n in notes)
    args, _ = server_args(settings(draft="chain", draft_path="/m/draft.gguf"))
    assert "--spec-type ngram-simple,draft-simple" in " ".join(args)
    # auto (the default) exports what llama-server can run of it, and says what it left out
    args, notes = server_args(settings(draft="auto", drafter="auto: lookup, suffix, qwen", draft_path="/m/draft.gguf"))
    assert "--spec-type ngram-simple,draft-simple" in " ".join(args) and "-md /m/draft.gguf" in " ".join(args)
    assert any("auto chose each step's source" in n and "suffix copies left out" in n for n in notes), notes
    args, notes = server_args(settings(draft="auto", drafter="auto: lookup, suffix"))
    assert "--spec-type ngram-simple" in " ".join(args) and "-md" not in args
    assert "the auto ran without a draft model: exported its lookup part only" in notes
    args, notes = server_args(settings(draft="none"))
    assert "--spec-type" not in args and not notes
    args, notes = server_args(settings(k=0))
    assert "--spec-type" not in args and notes == ["K=0: plain decoding, no speculation flags"]
    args, notes = server_args(settings(adaptive=True), k=11)
    assert "--spec-ngram-simple-size-m 11" in " ".join(args) and "adaptive" in notes[0]
    assert " ".join(server_args(settings())[0]).endswith("-t 2 -c 1024 --temp 0")


def test_an_expert_override_names_the_models_architecture(tmp_path):
    from moe_fixture import cached_tiny_moe

    moe = cached_tiny_moe(n_expert=4, n_expert_used=2)
    args, _ = server_args(settings(target_path=str(moe), experts=1))
    assert args[args.index("--override-kv") + 1] == "llama.expert_used_count=int:1"


def test_a_source_without_files_cannot_be_exported():
    from specdash.contract.errors import SpecdashError

    with pytest.raises(SpecdashError, match="did not report the target's file"):
        server_args(settings(target_path=None))


def test_preset_section_uses_long_argument_names():
    text = preset_section(settings(draft="qwen", draft_path="/m/draft.gguf"))
    assert text.splitlines()[0] == "[smol@draft-k8]" == f"[{preset_name(settings(draft='qwen'))}]"
    assert "model = /m/smol.gguf" in text and "model-draft = /m/draft.gguf" in text
    assert "spec-draft-n-max = 8" in text and "ctx-size = 1024" in text


def test_a_hostile_path_cannot_write_keys_of_its_own_into_a_preset():
    """A remote server's /props names the files: a line break there stays in its line."""
    text = preset_section(settings(target_path="/m/smol.gguf\n[evil]\nmodel = /tmp/x.gguf"))
    assert "[evil]" not in text.splitlines() and "model = /tmp/x.gguf" not in text.splitlines()
    assert "model = /m/smol.gguf\\x0a[evil]\\x0amodel = /tmp/x.gguf" in text


def test_cli_export_from_flags_and_from_a_recording(tmp_path, smol_path):
    proc = specdash("export", "--target", "smollm2-135m", "--draft", "lookup", "--k", "6", "--threads", "2")
    assert_ok(proc)
    assert proc.stdout.startswith(f"llama-server -m {smol_path} ") and "--spec-ngram-simple-size-m 6" in proc.stdout
    rec = tmp_path / "r.jsonl"
    run = specdash("run", "--target", "smollm2-135m", "--draft", "lookup", "--threads", "2", "--max-tokens", "6",
                   "--prompt", "Count to ten.", "--record", str(rec), "--at", "2:k=5", "--no-adaptive")
    assert run.returncode == 0, run.stderr
    proc = specdash("export", "--recording", str(rec), "--format", "preset", "--name", "mine")
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == "[mine]"
    assert "spec-ngram-simple-size-m = 5" in proc.stdout  # the last recorded settings: k=5
    assert_usage_error(specdash("export", "--recording", str(tmp_path / "nope.jsonl")), "no such file")


def test_cli_export_of_the_default_adaptive_settings_says_which_fixed_k_it_wrote(smol_path):
    """Adaptive K is the default and llama-server has none: an export from flags that
    never ran writes adaptive's starting K and says so; --k alone is that K, fixed, and
    then there is nothing to explain."""
    proc = specdash("export", "--target", "smollm2-135m", "--draft", "lookup", "--threads", "2")
    assert_ok(proc)
    note, command = proc.stdout.splitlines()
    assert note == ("# these settings use adaptive K; llama-server has none: exported fixed K=4, "
                    "the K adaptive starts at (choose it with --k N)")
    assert command.startswith(f"llama-server -m {smol_path} ") and "--spec-ngram-simple-size-m 4" in command
    proc = specdash("export", "--target", "smollm2-135m", "--draft", "lookup", "--k", "7", "--threads", "2")
    assert proc.returncode == 0 and not proc.stdout.startswith("#")
    assert "--spec-ngram-simple-size-m 7" in proc.stdout


def _server_accepts(args: list[str], tmp_path, *, probe: str = "/health") -> httpx.Response:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / f"server-{port}.log").open("w")
    proc = subprocess.Popen([*tool_command("llama-server"), *args, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"llama-server exited {proc.returncode}: "
                                     + (tmp_path / f"server-{port}.log").read_text()[-2000:])
            try:
                r = httpx.get(f"http://127.0.0.1:{port}{probe}", timeout=2)
                if r.status_code == 200:
                    return r
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("llama-server did not become healthy")
    finally:
        proc.terminate()
        proc.wait(30)


# A checkout without the tools skips these; CI (SPECDASH_REQUIRE_LLAMA_SERVER=1, set by
# .ci/run after building them) fails instead, so they cannot silently stop running.
needs_server = pytest.mark.skipif(
    not is_built(["llama-server"]) and not os.environ.get("SPECDASH_REQUIRE_LLAMA_SERVER"),
    reason="llama-server not built: python -m specdash.tuning.llamacpp_tools build")


@needs_server
def test_the_exported_command_line_starts_a_real_llama_server(tmp_path, smol_path):
    # prompt lookup
    for st in (settings(target_path=str(smol_path)),
               # auto: lookup and a draft model (the target itself: always compatible)
               settings(target_path=str(smol_path), draft="auto", draft_path=str(smol_path), k=4,
                        draft_p_min=0.5)):
        line = command_line(st).splitlines()[-1].split()
        assert line[0] == "llama-server"
        _server_accepts(line[1:], tmp_path)


@needs_server
def test_the_exported_preset_is_read_by_llama_server_router_mode(tmp_path, smol_path):
    ini = tmp_path / "presets.ini"
    ini.write_text("version = 1\n\n" + preset_section(settings(target_path=str(smol_path)), name="smol@lookup-k8") + "\n")
    r = _server_accepts(["--models-preset", str(ini)], tmp_path, probe="/models")
    names = [m.get("id") or m.get("name") for m in r.json().get("data", r.json().get("models", []))]
    assert "smol@lookup-k8" in names, r.json()
