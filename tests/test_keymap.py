"""Keys people choose (issue 42): a `[keys]` table remaps any binding by its id, the
remapped key drives the real engine, the footer, help screen and palette show the keys in
force, and a bad id or key name is one line and exit 2 before anything loads; `[ui] mouse =
false` runs the dashboard without the mouse."""

from __future__ import annotations

import subprocess
import sys

import pytest
from textual.widgets import Footer

from specdash.config import load_config
from specdash.contract.events import SettingsEvent
from specdash.tui.keymap import binding_ids, check_keymap
from specdash.tui.screens.help import HelpScreen
from test_tui_engine import real_app, steps, until
from test_tui_support import sync


def specdash(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdash", *args], capture_output=True, text=True, timeout=120)


def test_every_binding_has_an_id_and_the_table_knows_them():
    ids = binding_ids()
    assert {"app.help", "app.quit", "app.screenshot", "k.k_up", "k.k_down", "draft.pick_draft",
            "pause.toggle_pause", "help.close", "requests.close", "fleet.back"} <= set(ids)
    assert check_keymap({"app.help": "f1", "k.k_up": "u, +"}) == {"app.help": "f1", "k.k_up": "u,plus"}


@pytest.mark.parametrize("table, needles", [
    ('"app.hlp" = "f1"', ["[keys] 'app.hlp': no such binding", "app.help"]),
    ('"app.help" = "ctrl+bogus"', ["[keys] app.help = 'ctrl+bogus'", "'ctrl+bogus' is not a key name"]),
    ('"app.help" = 3', ["[keys] app.help = 3", "key names in a string"]),
])
def test_a_bad_key_or_id_is_one_line_and_exit_2(tmp_path, table, needles):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[keys]\n{table}\n", encoding="utf-8")
    proc = specdash("--config", str(cfg), "--target", "smollm2-135m")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]


def test_the_config_reads_keys_and_mouse(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[ui]\nmouse = false\n\n[keys]\n"app.help" = "f1"\n', encoding="utf-8")
    config = load_config(cfg)
    assert config.ui.mouse is False and config.keys == {"app.help": "f1"}


def test_mouse_false_reaches_the_app(monkeypatch):
    """run_app hands [ui] mouse to Textual (False: no mouse reporting, so the terminal's own
    selection works); and the keymap is set before the first frame."""
    from textual.app import App

    from specdash.tui.terminal import run_app

    seen: dict = {}
    monkeypatch.setattr(App, "run", lambda self, **kw: seen.update(kw))
    app = App()
    assert run_app(app, {"app.help": "f1"}, mouse=False) == 0
    assert seen == {"mouse": False} and app._keymap == {"app.help": "f1"}


@sync
async def test_remapped_keys_drive_the_engine_and_show_in_footer_and_help(tmp_path, smol_path):
    app, recs, _ = real_app(tmp_path, smol_path)
    app.set_keymap(check_keymap({"k.k_up": "u", "app.help": "f1"}))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 3, "three steps at K=2")
        await pilot.press("u")
        await until(pilot, lambda: any(isinstance(e, SettingsEvent) and e.k == 3 for e in recs[0].events),
                    "K=3 applied by the remapped key")
        await pilot.press("question_mark")  # no longer help
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        active = app.screen.active_bindings  # what the footer draws from: key -> binding
        assert active["f1"].binding.action == "help" and "question_mark" not in active
        assert active["u"].binding.action == "k_up"
        assert app.query_one(Footer) is not None
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help on f1")
        rows = {description: key for key, description, _ in app.screen._controls}
        assert rows["K up: draft one more token per step"] == "u"
        assert rows["this help"] == "f1"
        assert rows["K down (K=0 is plain decoding)"] == "-"  # unmapped: as the registry says
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert any(t.endswith("(u)") and t.startswith("K up") for t in titles), titles
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "help closed")
