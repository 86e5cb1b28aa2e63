"""The tuning loop's actions: the K sweep view, export to llama-server, screenshots with
their JSON sidecar, and writing the live settings to TOML. A mixin of SpecdashApp
(tui/app.py)."""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specdash.contract import events as E
from specdash.tui.app_base import DashboardBase
from specdash.engine.settings import LIMIT, EngineSettings
from specdash.engine.stats import SpecCounters
from specdash.contract.errors import SpecdashError
from specdash.contract.events import Event
from specdash.tuning.sweep import Sweep
from specdash.tui.screens.ask import AskScreen
from specdash.tui.screens.export import ExportScreen
from specdash.tui.screens.sweep import SweepScreen


TEMPERATURE = LIMIT["temperature"]


def counters_dict(c: SpecCounters) -> dict[str, Any]:
    return {
        **asdict(c),
        "acceptance_rate": c.acceptance_rate,
        "mean_accepted_length": c.mean_accepted_length,
        "tokens_per_step": c.tokens_per_step,
        "per_pos_rate": c.per_pos_rate,
    }


class TuningActions(DashboardBase):
    # --- K sweep --------------------------------------------------------------------------
    def action_sweep(self) -> None:
        if self._refused("sweep"):
            return
        st = self.state.settings
        assert st is not None
        o = self.options
        sweep = Sweep(self.state.prompt_text, st, ks=o.sweep_ks, rounds=o.sweep_rounds,
                      max_tokens=min(o.sweep_tokens, st.max_tokens or o.sweep_tokens), title=self.state.prompt_title,
                      temps=o.sweep_temps)
        why = sweep.why_not() or ("" if self.state.prompt_text else "no prompt is running yet")
        if why:
            self.notify(why, severity="warning", timeout=6)
            return
        self._start_sweep(sweep)

    def _start_sweep(self, sweep: Sweep) -> None:
        o = self.options
        if o.sweep_predicted is not None and sweep.prompt == o.prompt:  # predicted for this prompt only
            sweep.predicted, sweep.predicted_from = o.sweep_predicted
        self.sweep = sweep
        self.push_screen(SweepScreen(sweep))
        for cmd in sweep.start():
            self._send(cmd)

    def on_sweep_screen_temperatures(self, _message: SweepScreen.Temperatures) -> None:
        """t in the sweep view: ask for the temperatures, then sweep again at them (the
        runs so far are dropped: a sweep's rounds interleave every (K, T) it plans)."""
        old = self.sweep
        if old is None:
            return
        limit = TEMPERATURE

        def parse(text: str) -> list[float] | None:
            try:
                values = [limit.coerce(float(x)) for x in text.split(",") if x.strip()]
            except ValueError:
                return None
            return list(dict.fromkeys(values)) or None

        def check(text: str) -> str | None:
            return None if parse(text) else f"{text!r}: comma-separated temperatures, each {limit.allowed}, e.g. 0,0.7"

        def chosen(text: str | None) -> None:
            temps = parse(text) if text is not None else None
            if temps is None or self.sweep is not old:
                return
            # Still running: the new sweep takes over the engine from here, and its restore
            # is the old one's (the settings found when `k` was pressed). Finished: the
            # settings now in force (a may have applied a K) are the ones to come back to.
            before = old.before if not old.finished else (self.state.settings or old.before)
            old.finished = old.cancelled = True  # without its restore: the new sweep follows at once
            self.options.sweep_temps = tuple(temps)
            if isinstance(self.screen, SweepScreen):
                self.pop_screen()
            self._start_sweep(Sweep(old.prompt, before, ks=old.ks, rounds=old.rounds, max_tokens=old.max_tokens,
                                    title=old.title, temps=temps))

        current = ",".join(f"{t:g}" for t in old.temps)
        self.push_screen(AskScreen("Sweep temperatures", current,
                                   f"comma-separated, each {limit.allowed} (0 = greedy); every K runs at each. "
                                   "Enter restarts the sweep, Esc keeps this one.", check), chosen)

    def _drive_sweep(self, ev: Event) -> None:
        assert self.sweep is not None
        cmds = self.sweep.feed(ev)
        for cmd in cmds:
            self._send(cmd)
        if isinstance(ev, E.Summary) or self.sweep.finished:
            screen = self.screen
            if isinstance(screen, SweepScreen):
                screen.refresh_view()
            if self.sweep.finished and self.sweep.best is not None:
                best = self.sweep.best
                at = f" at T={best.temperature:g}" if len(self.sweep.temps) > 1 else ""
                self.notify(f"best K={best.k}{at}: {best.tokens_per_s:.1f} tok/s; a applies it, w saves it",
                            title="Sweep done", timeout=8)

    def on_sweep_screen_leave(self, _message: SweepScreen.Leave) -> None:
        """Esc in the sweep view: cancel a sweep in progress (settings restored), close."""
        if self.sweep is not None:
            for cmd in self.sweep.cancel():
                self._send(cmd)
        if isinstance(self.screen, SweepScreen):
            self.pop_screen()

    def on_sweep_screen_apply(self, _message: SweepScreen.Apply) -> None:
        best = self.sweep.best if self.sweep else None
        if best is None or not self.sweep or not self.sweep.finished:
            self.notify("the sweep has not finished yet", severity="warning")
            return
        if self.sweep.before.adaptive:
            self._send(E.SetAdaptive(False))
        self._send(E.SetK(best.k))
        self.notify(f"K={best.k} sent", timeout=3)

    def on_sweep_screen_save(self, _message: SweepScreen.Save) -> None:
        best = self.sweep.best if self.sweep else None
        if best is None or not self.sweep or not self.sweep.finished:
            self.notify("the sweep has not finished yet", severity="warning")
            return
        from specdash.config import settings_from_event

        launched = self.options.settings or EngineSettings()
        engine = settings_from_event(self.sweep.before, launched).replace(k=best.k, adaptive=False)
        self._ask_and_write(engine)

    # --- export -----------------------------------------------------------------------------
    def action_export(self) -> None:
        if self._refused("export"):
            return
        from specdash.records.export import command_line, preset_section

        st = self.state.settings
        assert st is not None
        # Before the first step adaptive has chosen nothing: export then says it wrote the
        # starting K, not "the K in force".
        k = self.state.k_in_force() if st.adaptive and self.state.stats.last_step is not None else None
        try:
            command, preset = command_line(st, k=k), preset_section(st, k=k)
        except SpecdashError as exc:
            self.notify(str(exc), severity="error")
            return
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.push_screen(ExportScreen(command, preset, Path(self.options.screenshots_dir).expanduser(),
                                      f"llama-server-{stamp}"))

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """`s`: an SVG of the screen and, beside it, a JSON file of the settings and
        numbers shown (Textual's own screenshot action, extended; its arguments unused)."""
        folder = Path(self.options.screenshots_dir).expanduser()
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            stem, n = f"specdash-{stamp}", 1
            while (folder / f"{stem}.svg").exists():
                n += 1
                stem = f"specdash-{stamp}-{n}"
            svg = Path(self.save_screenshot(filename=f"{stem}.svg", path=str(folder)))
            state = self.state_for_screenshot(svg)
            svg.with_suffix(".json").write_text(json.dumps(state, indent=2, default=str) + "\n", encoding="utf-8")
        except OSError as exc:
            self.notify(f"cannot write a screenshot to {folder}: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"{svg}\n+ {svg.with_suffix('.json').name}", title="Screenshot saved", timeout=5)

    def state_for_screenshot(self, svg: Path) -> dict[str, Any]:
        st, state = self.state.stats, self.state
        plain, tps = st.plain_tokens_per_s, st.tokens_per_s
        return {
            "svg": str(svg),
            "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "source": {"kind": state.source, "label": self.source.label if self.source else ""},
            "replay": {"file": state.replay.file, "offset_s": round(state.replay.position, 3),
                       "duration_s": round(state.replay.duration, 3), "speed": state.replay.speed}
            if state.replay else None,
            "engine_state": state.state,
            "prompt": {"title": state.prompt_title, "text": state.prompt_text},
            "settings": E.to_dict(state.settings) if state.settings else None,
            "stats": {
                "tokens_per_s": tps,
                "plain_tokens_per_s": plain,
                "speedup_vs_plain": tps / plain if tps and plain else None,
                "recent_steps": counters_dict(st.recent_counters()),
                "current_prompt": counters_dict(st.run),
                "session": counters_dict(st.total),
                "last_summary": {k: v for k, v in asdict(st.last_summary).items() if k != "text"}
                if st.last_summary else None,
            },
            "telemetry": E.to_dict(state.telemetry) if state.telemetry else None,
            "dashboard_cpu_percent": state.telemetry.dashboard_cpu if state.telemetry else None,
            "ui": {"theme": self.theme, "refresh": self.options.refresh, "size": list(self.size)},
        }

    def action_write_config(self) -> None:
        if self._refused("write_config"):
            return
        engine = self._last_good_settings()
        if engine is None:
            self.notify("this source's settings are a server's, not an engine's: nothing to write",
                        severity="warning")
            return
        self._ask_and_write(engine)

    def _ask_and_write(self, engine: EngineSettings) -> None:
        from specdash.config import Config, UISettings, save_config

        default = self.options.config_path or Path(
            os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
        ) / "specdash" / "config.toml"

        def check(text: str) -> str | None:
            return None if text.strip() else "type a file path"

        def chosen(text: str | None) -> None:
            if text is None:
                return
            ui = UISettings(theme=self.theme, refresh=self.options.refresh, screenshots_dir=self.options.screenshots_dir)
            try:
                path = save_config(Config(engine=engine, ui=ui), text.strip())
            except SpecdashError as exc:
                self.notify(str(exc), severity="error")
                return
            self.notify(f"load it with --config {path}", title=f"Settings written to {path}", timeout=6)

        self.push_screen(
            AskScreen("Write settings to", str(default), "Enter writes (an existing file is replaced), Esc cancels.", check),
            chosen,
        )

