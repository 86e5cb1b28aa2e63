"""The command registry is the one vocabulary: a command added there alone is parsed, bound
to a key, shown in the help, and refused by every source that does not list it in its
`supports`; a source that lists it gets it from the key with no dashboard code."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from pilot_helpers import bounded
from specdash.contract import events as E
from specdash.contract.vocabulary import (COMMAND_NAMES, COMMANDS, CommandSpec, Key, parse_command, register,
                                        schedule_syntax, unregister)
from specdash.contract.events import ContractError
from specdash.sources.replay import ReplaySource
from specdash.records.recording import Recorder
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.controls import controls
from test_tui_support import load_replay, sync


@dataclass(frozen=True, slots=True)
class Ping:
    """A command no source knows."""

    loud: bool = False

    def text(self) -> str:
        return "ping=loud" if self.loud else "ping"


def _parse_ping(word: str, value: str | None, token: str) -> tuple[E.Command, float]:
    if value not in (None, "loud"):
        raise ContractError(f"{token!r}: ping takes nothing or loud")
    return Ping(value == "loud"), 0.0  # type: ignore[return-value]


@pytest.fixture
def ping():
    spec = register(CommandSpec("ping", "ask the source to answer", (Ping,), ("ping",), "ping[=loud]", _parse_ping,
                                keys=(Key("z", "z", "ping", "ping", "ping the source", send=Ping),)))
    try:
        yield spec
    finally:
        unregister("ping")
    assert "ping" not in COMMANDS and Ping not in COMMAND_NAMES


class Listening:
    """A source that takes `ping` (and says so in its settings) and records commands."""

    kind = "scripted"
    label = "listening"
    telemetry = "none"
    supports = frozenset({"ping"})
    thread: threading.Thread | None = None

    def __init__(self) -> None:
        self.sent: list[object] = []

    def presets(self) -> list:
        return []

    def start(self, emit) -> None:
        emit(E.SettingsEvent(source="scripted", target="t", drafter="none", supports=["ping"], t=E.now()))
        emit(E.StatusEvent("running", t=E.now()))

    def send(self, cmd) -> None:
        self.sent.append(cmd)

    def close(self) -> None:
        pass


def app_on(source) -> SpecdashApp:
    app = SpecdashApp(DashboardOptions(screenshots_dir="/nonexistent"),
                      source_factory=lambda settings, prompts: source, local_telemetry=False, hints=list)
    app.notes = []  # type: ignore[attr-defined]
    app.notify = lambda message, *a, **k: app.notes.append(str(message))  # type: ignore[method-assign]
    return app


until = bounded(400)


def test_a_registered_command_is_parsed_and_named(ping):
    assert parse_command("ping") == (Ping(), 0.0)
    assert parse_command(" PING=loud ") == (Ping(True), 0.0)
    with pytest.raises(ContractError, match="ping takes nothing or loud"):
        parse_command("ping=twice")
    assert "ping[=loud]" in schedule_syntax()
    assert COMMAND_NAMES[Ping] == "ping"
    assert any(c.action == "ping" and c.key == "z" and c.command == "ping" for c in controls())


@sync
async def test_a_source_that_does_not_list_it_refuses_it(ping, tmp_path):
    path = tmp_path / "run.jsonl"
    rec = Recorder(path)
    for ev in load_replay():
        rec(ev)
    rec.close()
    source = ReplaySource(path)
    sent: list[object] = []
    real_send = source.send
    source.send = lambda cmd: (sent.append(cmd), real_send(cmd))  # type: ignore[method-assign]
    app = app_on(source)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.settings is not None, "the recording's settings")
        assert "z" in app._bindings.key_to_bindings, "not bound"
        assert app.check_action("ping", ()) is False, "shown although the source does not list it"
        await pilot.press("z")
        await until(pilot, lambda: any("does not take 'ping'" in n for n in app.notes), "why not")
        assert not any(isinstance(cmd, Ping) for cmd in sent), "the UI sent what the source does not take"
        # Sent anyway (a schedule, a script): the source itself refuses it, with a notice.
        real_send(Ping())
        await until(pilot, lambda: any("ping refused" in n for n in app.notes), "the replay's refusal")


@sync
async def test_a_source_that_lists_it_gets_it_from_its_key(ping):
    source = Listening()
    app = app_on(source)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.settings is not None and app.state.alive, "running")
        assert app.check_action("ping", ()) is True
        await pilot.press("z")
        await until(pilot, lambda: source.sent == [Ping()], "the key sent the command")


def test_every_registry_key_has_an_action_on_the_dashboard():
    app = SpecdashApp(DashboardOptions(), source_factory=lambda settings, prompts: Listening(),
                      local_telemetry=False, hints=list)
    for spec in COMMANDS.values():
        for key in spec.keys:
            assert callable(getattr(app, f"action_{key.action}", None)), (spec.name, key.action)
            assert any(b.action == key.action for bs in app._bindings.key_to_bindings.values() for b in bs)
