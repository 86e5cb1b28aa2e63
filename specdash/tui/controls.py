"""Which controls exist, and whether each can run now: one table, one rule. No Textual.

The footer (dim or hide), the help screen and the command palette (why not) and the
key handlers (refuse with a notification) all ask `why_unavailable`, so they cannot
disagree. A source states what it cannot do in SettingsEvent.unavailable, by command
name; the rules here add what follows from the source's state.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdash.tui.reducer import DashState


@dataclass(frozen=True, slots=True)
class Control:
    action: str  # the app's action_<name>
    key: str  # as shown
    description: str
    command: str | None = None  # the command name a source may refuse (events.COMMAND_NAMES)
    needs_source: bool = True  # only while the source takes commands


CONTROLS: tuple[Control, ...] = (
    Control("k_up", "+", "K up: draft one more token per step", "k"),
    Control("k_down", "-", "K down (K=0 is plain decoding)", "k"),
    Control("pick_draft", "d", "choose the draft source (model, prompt lookup, suffix, chain, none)", "draft"),
    Control("set_temperature", "t", "set the sampling temperature (0 = greedy)", "temp"),
    Control("toggle_pause", "space", "pause / resume generation", "pause"),
    Control("new_prompt", "n", "type a new prompt (replaces the one running)", "prompt", needs_source=False),
    Control("toggle_adaptive", "a", "adaptive K on/off: the engine picks K (and K=0) from measured costs", "adaptive"),
    Control("set_experts", "e", "MoE target: number of active experts (reloads the target)", "experts"),
    Control("slower", "[", "replay: slower (down to 0.5x)", "speed"),
    Control("faster", "]", "replay: faster (up to 16x)", "speed"),
    Control("seek_back", "←", "replay: back 10 s", "seek"),
    Control("seek_forward", "→", "replay: forward 10 s", "seek"),
    Control("seek_start", "home", "replay: to the start", "seek"),
    Control("seek_end", "end", "replay: to the end", "seek"),
    Control("sweep", "k", "K sweep: plain and each K on this prompt, plotted; apply or save the best", "sweep"),
    Control("export", "x", "the settings as a llama-server command line and router preset", "export",
            needs_source=False),
    Control("screenshot", "s", "save an SVG screenshot and a JSON file of settings and stats", needs_source=False),
    Control("write_config", "w", "write the live settings to a TOML config (load it with --config)",
            needs_source=False),
    Control("restart", "r", "restart the engine after an error", needs_source=False),
    Control("help", "?", "this help", needs_source=False),
    Control("quit", "q", "quit", needs_source=False),
)
BY_ACTION: dict[str, Control] = {c.action: c for c in CONTROLS}


def why_unavailable(action: str, state: DashState) -> str:
    """"" when `action` can run now, else the reason."""
    control = BY_ACTION.get(action)
    if control is None:
        return ""
    st = state.settings
    if action == "restart":
        return "" if state.state == "error" else "the engine is running"
    if action in ("write_config", "export") and st is None:
        return "no settings reported yet"
    if action == "export" and st is not None and not st.target_path:
        return "this source does not report its model files"
    if action == "sweep" and st is not None and st.source != "engine":
        return "a sweep reruns the prompt: it needs the embedded engine"
    if control.needs_source and not state.alive:
        return {"loading": "the engine is loading", "down": "the server is down"}.get(
            state.state, "the engine is not running")
    if st is not None and control.command in st.unavailable:
        return st.unavailable[control.command]
    if action in ("k_up", "k_down") and st is not None and st.adaptive:
        return "adaptive K is on (press a to fix K)"
    return ""


def footer_state(action: str, state: DashState) -> bool | None:
    """For Textual's check_action: True shows the key, None dims it, False hides it.
    Hidden where that leaves room for what can run (after an error the footer shows
    restart instead of dead controls; a dense target hides the expert key)."""
    control = BY_ACTION.get(action)
    if control is None:
        return True
    if action == "restart":
        return state.state == "error"
    if control.needs_source and state.state == "error":
        return False
    st = state.settings
    if control.command is not None and (st is None or control.command in st.unavailable):
        # What this source cannot do at all (K on a recording, experts on a dense model,
        # seeking a live engine) leaves the footer; the help screen says why.
        if control.command in ("experts", "seek", "speed") or st is not None:
            return False
    if control.needs_source and not state.alive:
        return None  # dimmed while loading
    return True  # other refusals (K under adaptive) are explained when pressed
