"""Cost profiles kept per machine and target (issue 40, specdash/costs): a run saves what
it measured, the next starts from it with no timing pass; the key separates what changes
the costs; a bad file is a notice and a cold start; a wrong prior is corrected by the
run's own verify batches; whatif reads what a run kept; `specdash calibrate`, `check` and
`doctor` say what is kept.

Every test here drops the pinned cost shape (`measured_costs`): keeping this machine's
costs is the subject. Whether drafting then pays is the CPU's business (issue 38), so
nothing below asserts a choice, only what was timed, kept and loaded.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from specdash.contract import events as E
from specdash.costs.key import key_digest, key_for, profile_key
from specdash.costs.store import ProfileStore
from specdash.engine.kept_costs import KeptCosts
from specdash.engine.settings import EngineSettings
from specdash.sources.session import Session
from specdash.costs.profile import load_profile

COPY_PROMPT = "Repeat this line four times: the cat sat on the mat, the cat sat on the mat."
LONG_PROMPT = "List the first twenty prime numbers, one per line, with a short remark on each."


def specdash(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdash", *args], capture_output=True, text=True, timeout=600)


def run_json(*args: str) -> list[dict]:
    proc = specdash("run", "--json", "--target", "smollm2-135m", "--draft", "lookup", "--threads", "1",
                    "--ctx", "1024", "--max-tokens", "32", "--prompt", COPY_PROMPT, *args)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def notices(events: list[dict]) -> list[str]:
    return [e["message"] for e in events if e["event"] == "notice"]


def session(**over) -> Session:
    return Session(EngineSettings(**{"target": "smollm2-135m", "draft": "lookup", "threads": 1, "ctx": 1024,
                                     "adaptive": True, **over}))


def test_a_profile_one_run_kept_is_the_next_runs_start_with_no_timing(smol_path, measured_costs, private_profiles):
    first = run_json()
    assert any("timed by the first verify that needs it" in m for m in notices(first)), notices(first)
    kept = list(private_profiles.glob("*.toml"))
    assert len(kept) == 1 and kept[0].name.startswith("smollm2-135m-"), kept
    profile = load_profile(str(kept[0]))  # whatif's own reader: one format
    assert profile.key["threads"] == 1 and profile.key["target"] == "smollm2-135m.gguf"
    steps = [e for e in first if e["event"] == "step"]
    assert profile.measured is not None and 1 in profile.verify
    assert 2 <= profile.samples[1] <= len(steps)  # one per plain step

    second = run_json()
    said = notices(second)
    assert any("batch costs from the kept profile" in m and str(kept[0]) in m for m in said), said
    assert not any("timed by" in m or "measured target batch costs" in m for m in said), said
    steps = [e for e in second if e["event"] == "step"]
    assert steps and "measuring a plain step" not in steps[0]["decision"]  # s(1) was known from the first token
    again = load_profile(str(kept[0]))
    assert again.samples[1] > min(profile.samples[1], 8)  # refined: loaded counts weigh at most 8, then grow


def test_the_key_changes_with_threads_target_and_repacking(smol_path, gemma_path, measured_costs, private_profiles):
    base = key_for(smol_path, 1, 512, None, "on")
    assert key_digest(base) == key_digest(key_for(smol_path, 1, 512, None, "on"))
    for other in (key_for(smol_path, 2, 512, None, "on"), key_for(gemma_path, 1, 512, None, "on"),
                  key_for(smol_path, 1, 512, None, "off"), key_for(smol_path, 1, 256, None, "on"),
                  key_for(smol_path, 1, 512, 2, "on")):
        assert key_digest(other) != key_digest(base), other
    # And as loaded: two sessions that differ only in threads, or in repacking, keep apart.
    paths = set()
    for over in ({"threads": 1}, {"threads": 2}, {"threads": 1, "repack": "off"}):
        s = session(**over)
        try:
            list(s.run(COPY_PROMPT, max_tokens=6))
            paths.add(ProfileStore().path_for(profile_key(s.engine.target, None)))
        finally:
            s.close()
    assert len(paths) == 3 and all(p.is_file() for p in paths), paths


def _kept_path(**over) -> Path:
    s = session(**over)
    try:
        return ProfileStore().path_for(profile_key(s.engine.target, None))
    finally:
        s.close()


def test_a_corrupt_or_foreign_profile_is_a_notice_and_is_replaced(smol_path, measured_costs, private_profiles):
    path = _kept_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("name = \"half a file\n[verify_ms\n", encoding="utf-8")
    said = notices(run_json())
    warning = next(m for m in said if str(path) in m)
    assert "invalid TOML" in warning and "starting without it" in warning, warning
    assert any("timed by the first verify that needs it" in m for m in said)
    fixed = load_profile(str(path))
    assert fixed.key["threads"] == 1

    # Foreign: a valid profile, measured for other threads (copied from another box, say).
    text = path.read_text(encoding="utf-8").replace("threads = 1", "threads = 64")
    path.write_text(text, encoding="utf-8")
    said = notices(run_json())
    warning = next(m for m in said if str(path) in m)
    assert "measured for another threads" in warning, warning
    assert load_profile(str(path)).key["threads"] == 1


def test_the_run_corrects_a_wrong_prior_with_its_own_verify_batches(smol_path, measured_costs, private_profiles):
    path = _kept_path()
    s = session()
    try:
        key = profile_key(s.engine.target, None)
    finally:
        s.close()
    # A deliberately wrong profile: every batch 100x dearer than a 135M model costs anywhere.
    wrong = {1: 1500.0, 2: 2600.0, 5: 6000.0, 17: 20000.0}
    ProfileStore().save(SimpleNamespace(path=Path(smol_path), n_threads=1, n_batch=key["n_batch"],
                                        repack=SimpleNamespace(mode=key["repack"])), None,
                        KeptCosts(wrong, {n: 8 for n in wrong}))
    assert path.is_file()
    s = session()
    try:
        costs = s.engine.controller.target_costs()
        assert costs.step_cost(1) == 1500.0  # loaded
        events = list(s.run(LONG_PROMPT, max_tokens=48))
        assert any(isinstance(e, E.NoticeEvent) and "kept profile" in e.message for e in events)
        assert sum(isinstance(e, E.StepEvent) for e in events) >= 24
        measured = [e.verify_ms / max(e.steps, 1) for e in events if isinstance(e, E.Summary)][0]
        after = costs.step_cost(1)
    finally:
        s.close()
    assert after < 0.1 * 1500.0, after  # moved most of the way to what the batches measured
    assert after < 10 * measured
    assert load_profile(str(path)).verify[1] < 150.0  # and kept


def test_whatif_reads_a_profile_a_run_kept(smol_path, measured_costs, private_profiles, tmp_path):
    run_json()
    (kept,) = private_profiles.glob("*.toml")
    s1 = load_profile(str(kept)).verify[1]  # whatif's own generation run refines the file after reading it
    out = tmp_path / "whatif.json"
    proc = specdash("whatif", "--target", "smollm2-135m", "--threads", "1", "--ctx", "1024", "--max-tokens", "24",
                    "--prompt", COPY_PROMPT, "--drafters", "lookup", "--ks", "2", "--profile", str(kept),
                    "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["profile"]["source"] == str(kept)
    assert report["profile"]["verify_ms"]["1"] == s1 and report["profile"]["key"]["threads"] == 1


def test_calibrate_keeps_every_size_and_check_and_doctor_say_so(smol_path, measured_costs, private_profiles):
    proc = specdash("calibrate", "--target", "smollm2-135m", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "measured target batch costs" in proc.stdout
    path = Path(proc.stdout.strip().splitlines()[-1].removeprefix("kept in "))
    profile = load_profile(str(path))
    assert {1, 2, 3, 4, 5, 9, 16, 17} <= set(profile.verify), profile.verify  # k_max 16: sizes up to 17
    doctor = specdash("doctor")
    line = next(ln for ln in doctor.stdout.splitlines() if " costs " in ln)
    assert "1 kept cost profile(s); newest smollm2-135m.gguf" in line and str(private_profiles) in line, line
    check = specdash("check", "smollm2-135m", "smollm2-135m")
    assert "costs: " in check.stdout
    # check assumes this machine's physical cores: kept for threads=1 matches only there.
    from specdash.telemetry.cpu import physical_cores

    if physical_cores().count == 1:
        assert str(path) in check.stdout
    else:
        assert "no kept profile for smollm2-135m.gguf" in check.stdout


def _save_many(folder: str, path: str, sizes: list[int]) -> None:
    store = ProfileStore(Path(folder))
    target = SimpleNamespace(path=Path(path), n_threads=1, n_batch=512, repack=SimpleNamespace(mode="on"))
    for n in sizes:
        assert store.save(target, None, KeptCosts({1: 10.0, n: 10.0 * n}, {1: 3, n: 1})) is None


def test_two_processes_saving_at_once_leave_one_whole_file_with_both_sizes(smol_path, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), str(smol_path), sizes))
             for sizes in ([2, 3, 4, 5] * 5, [9, 16, 17] * 5)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    (kept,) = tmp_path.glob("*.toml")
    assert not list(tmp_path.glob(".*.tmp"))
    assert set(load_profile(str(kept)).verify) == {1, 2, 3, 4, 5, 9, 16, 17}
