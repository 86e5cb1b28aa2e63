"""The health rules (specdash/monitor/health.py) on scripted sources: each fires on a stream that
collapses, repeats, stalls or stops paying, says what it read, and stays quiet on a steady
one; the thresholds come from the config; a replayed stream keeps its recorded verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

import health_scripts as S
from specdash.contract import events as E
from specdash.config import HEALTH_LIMITS
from specdash.monitor.health import HealthMonitor, HealthThresholds, alarms, monitored


def judge(stream: list[E.Event], thresholds: HealthThresholds | None = None) -> tuple[HealthMonitor, list[E.Event]]:
    monitor = HealthMonitor(thresholds)
    out: list[E.Event] = []
    for ev in stream:
        out += monitor.feed(ev)
    return monitor, out


def fired(out: list[E.Event]) -> list[str]:
    """Rules in the order they went into alarm."""
    return [name for ev in out if isinstance(ev, E.HealthEvent) for name in ev.changed
            if next(r for r in ev.rules if r.name == name).state == "alarm"]


def rule(monitor: HealthMonitor, name: str) -> E.HealthRule:
    return next(r for r in monitor.current.rules if r.name == name)


@pytest.mark.parametrize("script", [S.engine_steady, lambda: S.server("steady")], ids=["engine", "server"])
def test_a_steady_source_stays_quiet(script) -> None:
    monitor, out = judge(script())
    assert fired(out) == []
    assert monitor.current.verdict == "healthy"
    states = {r.name: r.state for r in monitor.current.rules}
    assert states["acceptance_collapse"] == states["decode_stall"] == states["acceptance_repetition"] == "ok", states
    assert not any(isinstance(ev, E.NoticeEvent) for ev in out)


@pytest.mark.parametrize("script", [S.engine_collapse, lambda: S.server("collapse")], ids=["engine", "server"])
def test_acceptance_collapse(script) -> None:
    monitor, out = judge(script())
    assert fired(out) == ["acceptance_collapse"]
    r = rule(monitor, "acceptance_collapse")
    assert r.value is not None and r.reference is not None and r.value < 0.5 * r.reference
    assert r.message.startswith(f"acceptance length {r.value:.2f}, median {r.reference:.2f} over ")
    assert monitor.current.verdict == "collapse"
    notice = next(ev for ev in out if isinstance(ev, E.NoticeEvent))
    assert notice.level == "warning" and "acceptance collapse: acceptance length" in notice.message
    assert alarms(monitor.current) == [f"acceptance collapse: {r.message}"]


def test_a_collapse_floor_judges_without_history() -> None:
    """A floor set in the config fires as soon as the recent readings are below it (it
    needs no median: what `attach --once` can judge from one interval)."""
    _, out = judge(S.server("collapse", seconds=46)[-13:], HealthThresholds(collapse_floor=1.5))
    assert fired(out) == ["acceptance_collapse"]
    last = [ev for ev in out if isinstance(ev, E.HealthEvent)][-1]
    assert "below the floor 1.5" in next(r for r in last.rules if r.name == "acceptance_collapse").message


@pytest.mark.parametrize("script", [S.engine_repeats, lambda: S.server("repeat")], ids=["engine", "server"])
def test_acceptance_near_one_for_a_sustained_stretch(script) -> None:
    monitor, out = judge(script())
    assert fired(out) == ["acceptance_repetition"]
    r = rule(monitor, "acceptance_repetition")
    assert r.message.startswith("acceptance 100.0% for ") and "draft tokens" in r.message
    assert monitor.current.verdict == "repetitive"
    # Shorter than repeat_seconds: not yet.
    _, out = judge(script(), HealthThresholds(repeat_seconds=600))
    assert fired(out) == []


@pytest.mark.parametrize("script", [S.engine_stalls, lambda: S.server("stall")], ids=["engine", "server"])
def test_decode_stall(script) -> None:
    monitor, out = judge(script())
    assert "decode_stall" in fired(out)
    r = rule(monitor, "decode_stall")
    assert r.value is not None and r.reference is not None and r.value < 0.25 * r.reference
    assert r.message.startswith("decode ") and " tok/s over " in r.message and "median" in r.message
    assert monitor.current.verdict == "stalled"  # the most serious word wins


def test_a_server_that_idles_is_not_stalled() -> None:
    """Polls with nothing generated while no request runs are not decode time."""
    stream = S.server("steady", 40)
    for i in range(30):
        stream += S.poll(60.0 + i, tokens=0, drafts=0, accepted=0, running=0)
    monitor, out = judge(stream)
    assert fired(out) == [] and rule(monitor, "decode_stall").state == "ok"


def test_speculation_not_paying_needs_a_plain_rate() -> None:
    monitor, out = judge(S.engine_not_paying())
    assert fired(out)[:1] == ["speculation_not_paying"] or "speculation_not_paying" in fired(out)
    r = rule(monitor, "speculation_not_paying")
    assert r.state == "alarm" and r.reference == pytest.approx(50.0, rel=0.01)
    assert r.value == pytest.approx(20.0, rel=0.05)  # 1 token per 0.05 s step
    assert "tok/s drafting, plain 50 tok/s (0.40x)" in r.message
    # A server's stream has no plain steps: the rule stays unknown there.
    monitor, _ = judge(S.server("steady"))
    assert rule(monitor, "speculation_not_paying").state == "unknown"
    # Steady speculation at 3.4 tokens per 0.05 s step beats the same plain rate.
    s = S.Steps()
    plain = [s.step(k=0, drafted=0, accepted=0, dt=0.02) for _ in range(600)]
    monitor, out = judge([S.settings(), *plain, *s.varied(20.0)])
    assert rule(monitor, "speculation_not_paying").state == "ok" and fired(out) == []


def test_a_settings_change_starts_the_medians_over() -> None:
    """K 4 -> 1 halves the acceptance length by the operator's choice: not a collapse."""
    s = S.Steps()
    stream = [S.settings(), *s.varied(40.0), S.settings(k=1), *s.run(20.0, k=1, drafted=1, accepted=0)]
    monitor, out = judge(stream)
    assert fired(out) == []
    assert rule(monitor, "acceptance_collapse").state == "unknown"


def test_a_recorded_verdict_is_replayed_not_judged_again() -> None:
    recorded = E.HealthEvent(verdict="collapse", rules=[E.HealthRule("acceptance_collapse", "alarm", "as recorded")])
    stream = [S.settings(), recorded, *S.engine_steady()[1:]]
    monitor, out = judge(stream)
    assert out == [] and monitor.current is recorded
    # A seek starts over: the recording's events come again.
    assert monitor.feed(E.ReplayEvent("f", 0.0, 10.0, 1.0, True, rewind=True)) == []
    assert not monitor.external


def test_monitored_emits_after_each_event() -> None:
    seen: list[E.Event] = []
    emit = monitored(seen.append, label="http://x")
    for ev in S.server("collapse"):
        emit(ev)
    # The first verdict right after the first decoding event (not the settings: a recording
    # has its own verdict there).
    assert isinstance(seen[2], E.HealthEvent) and seen[2].verdict == "unknown"
    assert isinstance(seen[1], E.CountersEvent)
    notices = [ev for ev in seen if isinstance(ev, E.NoticeEvent)]
    assert notices and notices[0].message.startswith("http://x: health: acceptance collapse: ")
    kinds = [type(ev).__name__ for ev in seen]
    i = kinds.index("NoticeEvent")
    assert kinds[i - 1] == "HealthEvent" and kinds[i - 2] == "CountersEvent"


def test_health_events_round_trip_the_contract() -> None:
    monitor, out = judge(S.engine_collapse())
    ev = [e for e in out if isinstance(e, E.HealthEvent)][-1]
    assert E.to_dict(E.from_dict(E.to_dict(ev))) == E.to_dict(ev)  # (floats keep 6 decimals)


def test_config_health_section(tmp_path: Path) -> None:
    from specdash.config import load_config, save_config
    from specdash.contract.errors import SpecdashError

    path = tmp_path / "c.toml"
    path.write_text("[health]\ncollapse_floor = 1.5\nrecent = 5\n")
    config = load_config(path)
    assert config.health == HealthThresholds(collapse_floor=1.5, recent=5)
    save_config(config, tmp_path / "back.toml")
    assert load_config(tmp_path / "back.toml").health == config.health
    path.write_text("[health]\nstall_ratio = 2\n")
    with pytest.raises(SpecdashError, match=r"\[health\] stall_ratio = 2: must be a number 0..1"):
        load_config(path)
    path.write_text("[health]\nstall = 0.3\n")
    with pytest.raises(SpecdashError, match=r"unknown key \[health\] stall: did you mean stall_ratio"):
        load_config(path)
    example = (Path(__file__).parent.parent / "config.example.toml").read_text()
    for lim in HEALTH_LIMITS:
        assert f"\n{lim.name} = {lim.default!r}\n".replace("'", '"') in example, lim.name
