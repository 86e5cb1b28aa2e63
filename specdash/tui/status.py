"""The status line: source state, models, K, tok/s, acceptance, fitted to the width.

Under `auto` (the default draft source) the draft part names the source that drafted the
last step: "qwen2.5-coder-1.5b ← auto·lookup" ("model" for the draft model, "plain" for
a step without a draft); short of room, the source alone ("← lookup").

What an operator watches (K, tok/s, acceptance) never gives way, nor does a health alarm
(`⚠ collapse`: specdash/monitor/health.py) until the last, most compact form. "healthy" is the
first part to give way as the terminal narrows; then the rest, in this order: weight repacking where it is not on (the help
screen says why), a recurrent target's rollback strategy, the
content class, the experts and the temperature, the model names (shortened, then dropped), the state's word (its icon
stays), then the numbers' wording ("K 3 fixed" -> "K 3", "123.4 tok/s" -> "123 tok/s").
`MIN_COLUMNS` is the narrowest terminal that still holds all three numbers, whatever
they are: at 40 columns the line reads `▶ │ K 3 │ 17.3 tok/s │ acc 45%`.
"""

from __future__ import annotations


from rich.cells import cell_len
from rich.markup import escape
from textual.app import RenderResult
from textual.widgets import Static

from specdash.contract.names import display_name
from specdash.monitor.health import is_alarm
from specdash.tui.reducer import DashState

STATE_LABELS = {
    "running": ("▶ running", "bold $success"),
    "paused": ("⏸ paused", "bold $warning"),
    "loading": ("… loading", "bold $accent"),
    "idle": ("■ done", "bold $text-muted"),
    "error": ("✖ error", "bold $error"),
    "down": ("✖ down", "bold $error"),
    "ended": ("■ ended", "bold $text-muted"),
}
SEPARATOR = " │ "
ALARM_MARK = "⚠"  # a part that starts with it is a health alarm, drawn in the error colour
PADDING = 2  # StatusLine's padding: one column each side
# The widest compact line, "✖ │ K 64 auto │ 99999 tok/s │ acc 100%" (38 cells), and the padding.
MIN_COLUMNS = 40


# A step's source as the status line names it under auto (StepEvent.drafter's words).
SOURCE_WORDS = {"draft": "model", "xvocab": "model", "none": "plain"}


def clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


def short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def short_source(draft: str, width: int) -> str:
    """`short`, but "auto·lookup" short of room keeps the source that drafted ("lookup")."""
    if len(draft) > width and "·" in draft:
        draft = draft.split("·", 1)[1]
    return short(draft, width)


def model_name(spec: str) -> str:
    """A registry name as is; a GGUF path by its file name without .gguf."""
    return display_name(spec)


def status_parts(state: DashState, fallback: tuple[str, str], width: int) -> tuple[list[str], str]:
    """The status line's parts (plain text; the first is the state) for a terminal
    `width` columns wide, and the state's style. The widest form that fits wins; below
    MIN_COLUMNS the compact form is returned anyway (the screen clips it)."""
    st, step = state.settings, state.stats.last_step
    label, style = STATE_LABELS.get(state.state, (state.state, "bold"))
    if state.state == "idle" and state.queue is not None:
        label = "◦ serving"  # a server between requests is not done: it waits for the next
    if state.replay is not None:
        r = state.replay
        label = f"{'▶' if r.playing else '⏸'} replay {r.speed:g}x {clock(r.position)}/{clock(r.duration)}"
        style = "bold $accent" if r.playing else "bold $warning"
    icon = label.split()[0] if label.split() else label
    target, draft = (model_name(st.target), st.drafter) if st else fallback
    if st is not None and st.draft == "auto":
        # auto chooses each step: name the source that drafted the last one.
        source = SOURCE_WORDS.get(step.drafter, step.drafter) if step is not None else ""
        draft = f"auto·{source}" if source else "auto"
    k_now = state.k_in_force()
    k_text = "?" if k_now is None else str(k_now)
    tps = state.stats.tokens_per_s
    acc = state.stats.recent_counters().acceptance_rate
    word = state.health.verdict if state.health is not None else ""
    alarm = f"{ALARM_MARK} {word}" if is_alarm(word) else ""
    optional = {
        "health": word if word == "healthy" else None,  # says nothing new: gives way first
        # Only where it is not llama.cpp's default: "repack off" says the machine is slower on purpose.
        "repack": f"repack {st.repack_verdict.split(' (')[0]}"
        if st is not None and st.repack_verdict and not st.repack_verdict.startswith("on") else None,
        # A recurrent/hybrid target's way back from rejected drafts; nothing for a KV cache.
        "rollback": f"rollback: {st.rollback}" if st is not None and st.rollback else None,
        "content": step.content if step is not None and step.content else None,
        "temp": f"T {st.temperature:g}" if st is not None and st.temperature is not None else None,
        "experts": f"experts {st.experts_active}/{st.expert_count}"
        if st is not None and st.expert_count else None,
        # Several requests in one target batch (serve --parallel): the last step's width.
        "batch": f"batch {step.batch}" if step is not None and step.batch > 1 else None,
    }
    give_way = [k for k in optional if optional[k]]

    queue = state.queue  # serving: requests running and waiting, kept at every width

    def numbers(compact: bool) -> list[str]:
        out = []
        if st is not None:
            if compact:
                out.append(f"K {k_text} auto" if st.adaptive else f"K {k_text}")
            else:
                out.append(f"K {k_text} {'adaptive' if st.adaptive else 'fixed'}")
        if tps is None:
            out.append("– tok/s")
        else:
            out.append(f"{tps:.0f} tok/s" if compact and tps >= 100 else f"{tps:.1f} tok/s")
        out.append(f"acc {acc:.0%}" if acc is not None else "acc –")
        if queue is not None:
            run, wait = len(queue.running), len(queue.waiting)
            out.append(f"req {run}+{wait}" if compact else f"{run} running, {wait} waiting")
        return out

    def full(names: tuple[int, int], n_dropped: int) -> list[str]:
        shown = {k: optional[k] for k in give_way[n_dropped:]}
        k_part, *rest = numbers(False) if st is not None else ["", *numbers(False)]
        parts = [label]
        if target or draft:  # none before a source that brings its own settings reports them
            parts.append(f"{short(target, names[0])} ← {short_source(draft, names[1])}")
        if st is not None:
            parts.append(k_part)
        parts += [v for k in ("temp", "experts") if (v := shown.get(k))]
        parts += rest
        if batch := shown.get("batch"):
            parts.append(batch)
        if alarm:
            parts.append(alarm)
        elif healthy := shown.get("health"):
            parts.append(healthy)
        if content := shown.get("content"):
            parts.append(content)
        if rollback := shown.get("rollback"):
            parts.append(rollback)
        if repacked := shown.get("repack"):
            parts.append(repacked)
        return parts

    # Tries, widest first: shorter model names, then fewer optional parts, then no names,
    # then the state's icon alone, then the numbers' short wording.
    tries = [full(names, 0) for names in ((24, 20), (18, 14), (12, 10))]
    tries += [full((12, 10), n) for n in range(1, len(give_way) + 1)] + [full((8, 6), len(give_way))]
    tail = [alarm] if alarm else []
    tries += [[label, *numbers(False), *tail], [icon, *numbers(False), *tail], [icon, *numbers(True), *tail]]
    if alarm:
        tries.append([icon, *numbers(True)])
    for parts in tries:
        if cell_len(SEPARATOR.join(parts)) + PADDING <= width:
            return parts, style
    return tries[-1], style


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.line = ""
        self._shown: tuple[DashState, tuple[str, str]] | None = None

    def show(self, state: DashState, fallback: tuple[str, str] = ("", "")) -> None:
        self._shown = (state, fallback)
        line = self._fit(self._width())
        if line != self.line:
            self.line = line
            self.update(line, layout=False)

    def _width(self) -> int:
        # The width the line is drawn at: its own, once laid out (the terminal's before).
        return self.outer_size.width or self.app.size.width

    def _fit(self, width: int) -> str:
        assert self._shown is not None
        parts, style = status_parts(*self._shown, width)
        return SEPARATOR.join([f"[{style}]{escape(parts[0])}[/]",
                               *(f"[bold $error]{escape(p)}[/]" if p.startswith(ALARM_MARK) else escape(p)
                                 for p in parts[1:])])

    def render(self) -> RenderResult:
        # Fitted when drawn, for the width it is drawn at: a resize handler would leave a
        # frame (or a test's look) between the new layout and its handler with the old fit.
        if self._shown is not None:
            line = self._fit(self._width())
            if line != self.line:
                self.line = line
                self.update(line, layout=False)
        return super().render()
