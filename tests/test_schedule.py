"""Scripted hot-swaps: the schedule parser (specdash/tuning/schedule.py) and `specdash run
--schedule/--at` end to end on a small real model (SmolLM2-135M)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import assert_ok, assert_usage_error, specdash

from specdash.contract import events as E
from specdash.contract.errors import SpecdashError
from specdash.tuning.schedule import Entry, Schedule, load_schedule, parse_at, parse_line

SMALL = ["--target", "smollm2-135m", "--threads", "2"]
# smollm2-135m keeps counting for hundreds of tokens without an end-of-sequence.
COUNT = "Write the numbers from 1 to 400, separated by commas."


# --- parsing --------------------------------------------------------------------------


def commands(entries: list[Entry]) -> list[tuple[int, E.Command, float]]:
    return [(e.step, e.command, e.pause_s) for e in entries]


def test_a_line_holds_several_commands_in_order():
    got = parse_line("10: k=8 draft=suffix temp=0.7 adaptive=on experts=2 pause=2s", "f:3")
    assert commands(got) == [
        (10, E.SetK(8), 0.0), (10, E.SetDrafter("suffix"), 0.0), (10, E.SetSampling(temperature=0.7), 0.0),
        (10, E.SetAdaptive(True), 0.0), (10, E.SetExperts(2), 0.0), (10, E.Pause(), 2.0),
    ]
    assert {e.where for e in got} == {"f:3"}


@pytest.mark.parametrize("line, want", [
    ("  5 : k=0   # plain decoding from here", [(5, E.SetK(0), 0.0)]),
    ("7: pause=500ms resume stop", [(7, E.Pause(), 0.5), (7, E.Resume(), 0.0), (7, E.Stop(), 0.0)]),
    ('3: draft="/models/my draft.gguf"', [(3, E.SetDrafter("/models/my draft.gguf"), 0.0)]),
    ("4: draft=none temp=0 adaptive=off k=24", [(4, E.SetDrafter("none"), 0.0), (4, E.SetSampling(temperature=0.0), 0.0),
                                                  (4, E.SetAdaptive(False), 0.0), (4, E.SetK(24), 0.0)]),
    ("6: cut=0.2 cut=0", [(6, E.SetCut(0.2), 0.0), (6, E.SetCut(0.0), 0.0)]),
    ("", []),
    ("   # only a comment", []),
])
def test_line_forms(line, want):
    assert commands(parse_line(line, "f:1")) == want


@pytest.mark.parametrize("line, token", [
    ("k=8", "'k=8'"),  # no step
    ("10 k=8", "'10 k=8'"),
    ("ten: k=8", "step 'ten'"),
    ("0: k=8", "step '0'"),
    ("-3: k=8", "step '-3'"),
    ("10:", "step 10 has no command"),
    ("10: # nothing", "step 10 has no command"),
    ("10: k=eight", "'k=eight'"),
    ("10: k=8 bogus=1", "'bogus=1'"),
    ("10: warp", "'warp'"),
    ("10: adaptive=maybe", "'adaptive=maybe'"),
    ("10: cut", "'cut': cut takes a number"),
    ("10: cut=high", "'cut=high'"),
    ("10: pause=soon", "'pause=soon'"),
    ("10: pause", "'pause'"),  # nothing in a schedule could resume it
    ("10: pause=0s", "'pause=0s'"),
    ("10: draft=", "'draft='"),
    ('10: draft="unclosed', "No closing quotation"),
])
def test_bad_lines_name_the_place_and_the_token(line, token):
    with pytest.raises(SpecdashError) as info:
        parse_line(line, "plan.txt:7")
    message = str(info.value)
    assert message.startswith("plan.txt:7: ") and token in message, message
    assert "\n" not in message


def test_file_lines_are_counted_with_comments_and_blanks(tmp_path):
    plan = tmp_path / "plan.txt"
    plan.write_text("# warm up\n\n10: k=8\n20: draft=suffix  # copy\n\n30: k=2 temp=0.5\n")
    got = load_schedule(plan)
    assert [(e.where, e.command) for e in got] == [
        (f"{plan}:3", E.SetK(8)), (f"{plan}:4", E.SetDrafter("suffix")),
        (f"{plan}:6", E.SetK(2)), (f"{plan}:6", E.SetSampling(temperature=0.5)),
    ]
    plan.write_text("10: k=8\n\n12: k=x\n")
    with pytest.raises(SpecdashError, match=rf"^{plan}:3: 'k=x': 'x' is not a number$"):
        load_schedule(plan)


def test_unreadable_schedule_files(tmp_path):
    with pytest.raises(SpecdashError, match="no such file"):
        load_schedule(tmp_path / "missing.txt")
    with pytest.raises(SpecdashError, match="cannot read it"):
        load_schedule(tmp_path)  # a directory
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"10: k=\xff\n")
    with pytest.raises(SpecdashError, match="cannot read it"):
        load_schedule(binary)


def test_at_flags():
    got = parse_at(["10:k=8", "5: draft=lookup pause=1s"])
    assert [(e.step, e.command, e.where) for e in got] == [
        (10, E.SetK(8), "--at 10:k=8"), (5, E.SetDrafter("lookup"), "--at 5: draft=lookup pause=1s"),
        (5, E.Pause(), "--at 5: draft=lookup pause=1s"),
    ]
    with pytest.raises(SpecdashError, match="^--at k=8: 'k=8': expected STEP: COMMAND"):
        parse_at(["k=8"])


@pytest.mark.parametrize("token", ["k=0", "k=17", "draft=lookup", "draft=suffix", "draft=chain", "draft=none",
                                   "draft=/m/x.gguf", "temp=0.7", "temp=0", "adaptive=on", "adaptive=off",
                                   "experts=2", "cut=0.1", "cut=0", "resume", "stop", "forget"])
def test_command_text_round_trips(token):
    """SettingsEvent.command carries cmd.text(): a schedule's token is found in the output
    as written (canonical forms)."""
    (entry,) = parse_line(f"1: {token}", "f:1")
    assert entry.command.text() == token


# --- the scheduler ----------------------------------------------------------------------


class FakeTimer:
    def __init__(self) -> None:
        self.armed: list[tuple[float, object]] = []

    def __call__(self, seconds, action) -> None:
        self.armed.append((seconds, action))


def test_commands_go_out_after_their_step_in_file_order():
    sent: list[E.Command] = []
    timer = FakeTimer()
    entries = parse_at(["3:k=5", "1:draft=suffix", "3:temp=0.5 pause=2s", "9:k=1"])
    schedule = Schedule(entries, sent.append, timer=timer)
    schedule.after_step(1)
    assert sent == [E.SetDrafter("suffix")]
    schedule.after_step(2)
    assert len(sent) == 1
    schedule.after_step(4)  # a step number skipped: everything due goes out, in order
    assert sent[1:] == [E.SetK(5), E.SetSampling(temperature=0.5), E.Pause()]
    assert [s for s, _ in timer.armed] == [2.0]
    timer.armed[0][1]()  # the timer fires: the engine is resumed
    assert sent[-1] == E.Resume()
    assert [e.command for e in schedule.left] == [E.SetK(1)]
    # The run ended after step 4: the commands sent after it never applied.
    assert [e.command for e in schedule.unapplied()] == [E.SetK(5), E.SetSampling(temperature=0.5), E.Pause(), E.SetK(1)]


def test_pauses_sent_together_share_one_resume_from_the_longest():
    """Two pauses after one step: the engine is paused once, and only the longer one
    resumes it. (A Resume per pause let the shorter one's second Resume end the pause of a
    later step early, and the last Resume arrive after the run had ended: CI saw
    "4 pauses applied but 3 resumes reported".)"""
    sent: list[E.Command] = []
    timer = FakeTimer()
    schedule = Schedule(parse_at(["6:pause=5s pause=1s", "12:pause=2s"]), sent.append, timer=timer)
    schedule.after_step(6)
    for _, fire in timer.armed:  # both fire; the 1 s one is not the owner
        fire()
    assert sent == [E.Pause(), E.Pause(), E.Resume()]
    schedule.after_step(12)  # a later step's pause: a window of its own
    timer.armed[-1][1]()
    assert sent[3:] == [E.Pause(), E.Resume()]


def test_a_scheduled_stop_applies_the_batch_up_to_it():
    schedule = Schedule(parse_at(["2:k=3 stop k=4", "5:k=1"]), lambda cmd: None, timer=FakeTimer())
    schedule.after_step(2)
    assert [e.command for e in schedule.unapplied(stopped=True)] == [E.SetK(4), E.SetK(1)]
    assert [e.command for e in schedule.unapplied(stopped=False)] == [E.SetK(3), E.Stop(), E.SetK(4), E.SetK(1)]


def test_a_real_engine_applies_each_command_before_the_next_step(smol_path):
    """In process, the way `run` drives it: every command appears as a SettingsEvent
    (or a refusal) between step STEP and step STEP + 1."""
    from specdash.engine.settings import EngineSettings
    from specdash.sources.session import Session

    session = Session(EngineSettings(adaptive=False, target=str(smol_path), draft="lookup", k=3, threads=2, ctx=512))
    schedule = Schedule(parse_at(["2:k=6", "3:draft=suffix adaptive=on", "4:adaptive=off k=65", "5:draft=none"]),
                        session.send)
    events: list[E.Event] = []
    try:
        for ev in session.run(COUNT, max_tokens=24):
            events.append(ev)
            if isinstance(ev, E.StepEvent):
                schedule.after_step(ev.step)
    finally:
        session.close()
    between: dict[int, list[str]] = {}
    step = 0
    for ev in events:
        if isinstance(ev, E.StepEvent):
            step = ev.step
        elif isinstance(ev, E.SettingsEvent) and ev.command:
            between.setdefault(step, []).append(ev.command)
        elif isinstance(ev, E.NoticeEvent) and ev.level == "warning":
            between.setdefault(step, []).append(ev.message.split(":")[0])
    assert between == {2: ["k=6"], 3: ["draft=suffix", "adaptive=on"], 4: ["adaptive=off", "k=65 refused"],
                       5: ["draft=none"]}
    steps = {ev.step: ev for ev in events if isinstance(ev, E.StepEvent)}
    assert steps[2].k == 3 and steps[3].k == 6 and not steps[3].adaptive and steps[4].adaptive
    assert steps[4].drafter in ("suffix", "none") and steps[5].k == 6 and not steps[5].adaptive
    assert all(steps[n].drafter == "none" for n in steps if n >= 6)
    assert not schedule.unapplied()


# --- `specdash run` end to end ----------------------------------------------------------


def run_json(*args: str) -> tuple[list[dict], str]:
    proc = specdash("run", *SMALL, "--json", "--prompt", COUNT, *args)
    assert_ok(proc)
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def test_run_schedule_and_at_apply_every_command_in_the_json_lines(tmp_path, smol_path, gemma_path):
    plan = tmp_path / "plan.txt"
    plan.write_text(
        "# a tuning run\n"
        "3: k=8\n"
        "5: draft=suffix   # copy from earlier output\n"
        "7: k=65 experts=2  # both refused: out of range, a dense model\n"
        "8: draft=gemma3-270m  # refused: another tokenizer, with --no-translate\n"
        f"9: draft={tmp_path / 'missing.gguf'}\n"
        "10: adaptive=on\n"
        "12: adaptive=off draft=none k=0\n"
    )
    events, stderr = run_json("--draft", "lookup", "--k", "2", "--max-tokens", "60", "--schedule", str(plan),
                              "--at", "11:k=20", "--at", "13:draft=lookup k=3", "--no-translate")
    assert "Traceback" not in stderr
    from specdash.contract.events import from_dict, to_dict

    assert all(to_dict(from_dict(e)) == e for e in events)  # the contract, unchanged
    step = 0
    said: list[tuple[int, str]] = []
    for e in events:
        if e["event"] == "step":
            step = e["step"]
        elif e["event"] == "settings" and e["command"]:
            said.append((step, e["command"]))
        elif e["event"] == "notice" and e["level"] == "warning":
            said.append((step, e["message"]))
    applied = [(s, c) for s, c in said if " refused" not in c]
    refused = [(s, c) for s, c in said if " refused" in c]
    assert applied == [(3, "k=8"), (5, "draft=suffix"), (10, "adaptive=on"), (11, "k=20"),
                       (12, "adaptive=off"), (12, "draft=none"), (12, "k=0"), (13, "draft=lookup"), (13, "k=3")]
    assert [(s, c.split(" refused")[0]) for s, c in refused] == [
        (7, "k=65"), (7, "experts=2"), (8, "draft=gemma3-270m"), (9, f"draft={tmp_path / 'missing.gguf'}")]
    # Each refusal says why and what stayed in force, and the engine kept going.
    assert "kept k=8" in refused[0][1] and "dense model" in refused[1][1]
    assert "incompatible" in refused[2][1] and "kept draft=suffix" in refused[2][1]
    assert "no such file" in refused[3][1] and "kept draft=suffix" in refused[3][1]
    steps = {e["step"]: e for e in events if e["event"] == "step"}
    assert len(steps) >= 16, "the run must outlast the schedule"
    assert steps[3]["k"] == 2 and steps[4]["k"] == 8 and steps[9]["k"] == 8
    assert all(steps[n]["drafter"] in ("suffix", "none") for n in range(6, 11))
    assert steps[13]["k"] == 0 and steps[13]["drafter"] == "none"
    assert all(steps[n]["k"] <= 3 and steps[n]["drafter"] in ("lookup", "none") for n in steps if n > 13)
    summary = events[-1]
    assert summary["event"] == "summary" and summary["n_generated"] == 60 and summary["stop_reason"] == "max_tokens"
    assert summary["text"] == "".join("".join(e["pieces"]) for e in steps.values())


def test_run_pause_pauses_then_resumes(smol_path):
    events, _ = run_json("--draft", "lookup", "--k", "2", "--max-tokens", "12", "--at", "3:pause=2s k=4")
    settings = [e for e in events if e["event"] == "settings" and e["command"]]
    assert [(s["command"], s["paused"]) for s in settings] == [("pause", True), ("k=4", True), ("resume", False)]
    order = [e["event"] if e["event"] != "settings" else e["command"] for e in events]
    at = order.index("pause")
    assert order[at - 1] == "step" and order[at:at + 3] == ["pause", "k=4", "resume"] and order[at + 3] == "step"
    steps = [e for e in events if e["event"] == "step"]
    # The Resume comes from a 2 s timer started after step 3 ended: a lower bound.
    assert settings[2]["t"] - steps[2]["t"] >= 1.999
    assert steps[2]["k"] == 2 and steps[3]["k"] == 4 and events[-1]["n_generated"] == 12


def test_commands_the_run_never_reached_are_noted(smol_path):
    proc = specdash("run", *SMALL, "--draft", "none", "--max-tokens", "5", "--prompt", COUNT,
                    "--at", "5:k=3", "--at", "40:k=2")
    assert_ok(proc)
    note = [line for line in proc.stderr.splitlines() if "note:" in line]
    assert note == ["specdash: note: the run ended before these scheduled commands applied: "
                    "--at 5:k=3 (k=3 after step 5), --at 40:k=2 (k=2 after step 40)"]


def test_a_scheduled_stop_ends_the_run(smol_path):
    events, stderr = run_json("--draft", "lookup", "--max-tokens", "30", "--at", "4:stop")
    assert events[-1]["stop_reason"] == "stopped" and max(e["step"] for e in events if e["event"] == "step") == 4
    assert "note:" not in stderr


@pytest.mark.parametrize("line, token", [
    ("12: k=eight", "'k=eight'"),
    ("12: draft=suffix warp=9", "'warp=9'"),
    ("twelve: k=3", "step 'twelve'"),
    ("12: pause", "'pause'"),
])
def test_a_bad_schedule_line_is_one_line_and_exit_2(tmp_path, line, token):
    plan = tmp_path / "plan.txt"
    plan.write_text(f"# fine\n3: k=4\n{line}\n20: k=2\n")
    proc = specdash("run", *SMALL, "--prompt", "x", "--schedule", str(plan))
    assert_usage_error(proc, f"{plan}:3:", token)


def test_bad_at_and_missing_schedule_are_usage_errors(tmp_path):
    assert_usage_error(specdash("run", *SMALL, "--prompt", "x", "--at", "3:k=1.5"), "--at 3:k=1.5", "'k=1.5'")
    assert_usage_error(specdash("run", *SMALL, "--prompt", "x", "--schedule", str(tmp_path / "nope.txt")),
                       "nope.txt", "no such file")


def test_text_mode_shows_refusals_on_stderr(smol_path):
    proc = specdash("run", *SMALL, "--draft", "lookup", "--max-tokens", "10", "--prompt", COUNT, "--at", "2:k=-1")
    assert_ok(proc)
    assert "specdash: warning: k=-1 refused: must be an integer 0..64; kept k=4" in proc.stderr
    assert proc.stdout.strip()
