"""The dashboard's keys that steer the source: K, drafter, temperature, the draft cut,
pause, adaptive, experts, a new prompt, and a replay's speed and position. Each sends a
command; none decides anything about decoding. A mixin of SpecdashApp (tui/app.py),
split out to keep the app about the event path."""

from __future__ import annotations

from collections.abc import Callable

from specdash.contract import events as E
from specdash.tui.app_base import DashboardBase
from specdash.engine.settings import LIMIT, Limit
from specdash.contract.events import SPEEDS
from specdash.sources.embedded import PromptQueue, WorkItem
from specdash.tui.screens.ask import AskScreen
from specdash.sources.base import Preset
from specdash.tui.screens.draft_picker import DraftPicker, PresetPicker
from specdash.tui.status import short


TEMPERATURE = LIMIT["temperature"]
CUT = LIMIT["draft_p_joint"]


class SourceControls(DashboardBase):
    def action_k_up(self) -> None:
        if self._refused("k_up"):
            return
        k = self._current_k()
        if k >= LIMIT["k"].hi:  # type: ignore[operator]
            self.notify(f"K is already {k}, the most the engine takes", severity="warning")
            return
        self._k_request = k + 1
        self._send(E.SetK(self._k_request))

    def action_k_down(self) -> None:
        if self._refused("k_down"):
            return
        k = self._current_k()
        if k <= 0:
            self.notify("K is already 0 (plain decoding); it cannot go lower", severity="warning")
            return
        self._k_request = k - 1
        self._send(E.SetK(self._k_request))

    def action_pick_draft(self) -> None:
        if self._refused("pick_draft"):
            return
        st = self.state.settings
        launched = self.options.settings
        current = (st.draft or st.drafter) if st else launched.draft if launched else ""

        def chosen(spec: str | None) -> None:
            if spec:
                self._send(E.SetDrafter(spec))
                self.notify(f"switching draft to {spec}…", timeout=2)

        presets = self._router_presets()
        if presets is not None:  # a llama-server router: its presets are the draft sources
            self.push_screen(PresetPicker(presets), chosen)
            return
        self.push_screen(DraftPicker(current, st.target_path if st else None,
                                     model_dirs=self.options.model_dirs), chosen)

    def _router_presets(self) -> list[Preset] | None:
        """The presets a server offers as draft sources (a llama-server router), None when
        the source offers none (the draft picker then lists models and drafter kinds)."""
        return (self.source.presets() or None) if self.source is not None else None

    def action_set_temperature(self) -> None:
        if self._refused("set_temperature"):
            return
        st = self.state.settings
        launched = self.options.settings
        current = st.temperature if st and st.temperature is not None else \
            launched.sampling.temperature if launched else 0.0
        self._ask_number("Temperature", "temperature", TEMPERATURE, current, f"use 0 (greedy) to {TEMPERATURE.hi:g}",
                         f"0 = greedy, up to {TEMPERATURE.hi:g}.", lambda t: E.SetSampling(temperature=t))

    def action_set_cut(self) -> None:
        if self._refused("set_cut"):
            return
        st = self.state.settings
        launched = self.options.settings
        current = st.draft_p_joint if st and st.draft_p_joint is not None else \
            launched.draft_p_joint if launched else CUT.default
        self._ask_number("Joint confidence cut", "cut", CUT, current, f"use 0 (off) to {CUT.hi:g}",
                         "A draft stops where the product of the draft model's top-token probabilities falls "
                         f"below this. 0 = off, {CUT.default:g} the default.", E.SetCut)

    def _ask_number(self, title: str, noun: str, limit: Limit, current: float, valid: str, note: str,
                    command: Callable[[float], E.Command]) -> None:
        """A dialog for one number setting: checked against its limit before it is sent."""
        def check(text: str) -> str | None:
            try:
                value = float(text)
            except ValueError:
                return f"{noun} {text!r} is not a number; {valid}"
            try:
                limit.coerce(value)
            except ValueError:
                return f"{noun} {value:g} is out of range; {valid}"
            return None

        def chosen(text: str | None) -> None:
            if text is not None:
                self._send(command(float(text)))

        self.push_screen(AskScreen(title, f"{current:g}", f"{note} Enter applies, Esc cancels.", check), chosen)

    def action_toggle_pause(self) -> None:
        if self._refused("toggle_pause"):
            return
        if self.state.replay is not None:
            self._send(E.Pause() if self.state.replay.playing else E.Resume())
            return
        st = self.state.settings
        self._send(E.Resume() if st and st.paused else E.Pause())

    # --- replay ---------------------------------------------------------------------------
    def _replay(self, action: str, cmd: E.Command) -> None:
        if not self._refused(action):
            self._send(cmd)

    def _speed_step(self, direction: int) -> float:
        # From the speed asked for last, until the replay confirms it: quick presses add up.
        now = self._speed_request or (self.state.replay.speed if self.state.replay else 1.0)
        i = min(range(len(SPEEDS)), key=lambda j: abs(SPEEDS[j] - now))
        self._speed_request = SPEEDS[min(max(i + direction, 0), len(SPEEDS) - 1)]
        return self._speed_request

    def action_slower(self) -> None:
        self._replay("slower", E.SetSpeed(self._speed_step(-1)))

    def action_faster(self) -> None:
        self._replay("faster", E.SetSpeed(self._speed_step(+1)))

    def action_toggle_adaptive(self) -> None:
        if self._refused("toggle_adaptive"):
            return
        st = self.state.settings
        on = st.adaptive if st else bool(self.options.settings and self.options.settings.adaptive)
        self._send(E.SetAdaptive(not on))

    def action_set_experts(self) -> None:
        if self._refused("set_experts"):
            return
        st = self.state.settings
        if st is None or not st.expert_count:
            return
        count = st.expert_count

        def check(text: str) -> str | None:
            if not text.strip().isdigit() or not 1 <= int(text) <= count:
                return f"experts {text!r} refused: use a whole number 1..{count}"
            return None

        def chosen(text: str | None) -> None:
            if text is not None:
                self._send(E.SetExperts(int(text)))

        self.push_screen(
            AskScreen("Active experts", str(st.experts_active or count), f"1..{count}; the target reloads and continues where it was.", check),
            chosen,
        )

    def action_new_prompt(self) -> None:
        if self._refused("new_prompt"):
            return

        def check(text: str) -> str | None:
            return None if text.strip() else "the prompt is empty"

        def chosen(text: str | None) -> None:
            if text is None:
                return
            item = self._typed = WorkItem(short(text.strip().splitlines()[0], 50), text)
            if self.state.alive or self.state.state == "loading":
                self._send(E.NewPrompt(item.text, item.title))
            else:  # the source died: a new prompt restarts it
                queue = PromptQueue()
                queue.push(item)
                self._restart_with(queue)

        self.push_screen(
            AskScreen("New prompt", "", "Enter starts it (the current prompt stops). For long prompts use --prompt-file.", check),
            chosen,
        )

