"""The status line: source state, models, K, tok/s, acceptance, fitted to the width."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from textual.widgets import Static

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


def clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


def short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def model_name(spec: str) -> str:
    """A registry name as is; a GGUF path by its file name without .gguf."""
    return Path(spec).stem if spec.endswith(".gguf") else spec


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.line = ""

    def show(self, state: DashState, fallback: tuple[str, str] = ("", "")) -> None:
        st, step = state.settings, state.stats.last_step
        label, style = STATE_LABELS.get(state.state, (state.state, "bold"))
        if state.replay is not None:
            r = state.replay
            label = f"{'▶' if r.playing else '⏸'} replay {r.speed:g}x {clock(r.position)}/{clock(r.duration)}"
            style = "bold $accent" if r.playing else "bold $warning"
        target, draft = (model_name(st.target), st.drafter) if st else fallback
        k_now = state.k_in_force()
        tps = state.stats.tokens_per_s
        acc = state.stats.recent_counters().acceptance_rate
        # Optional parts in the order they give way when the terminal is narrow; the
        # numbers an operator watches (tok/s, acceptance, K) never do.
        optional = {
            "content": step.content if step is not None and step.content else None,
            "temp": f"T {st.temperature:g}" if st is not None and st.temperature is not None else None,
            "experts": f"experts {st.experts_active}/{st.expert_count}"
            if st is not None and st.expert_count else None,
        }
        give_way = [k for k in optional if optional[k]]
        # Tries, widest first: shorter model names, then fewer optional parts.
        tries = [((24, 20), 0), ((18, 14), 0), ((12, 10), 0)]
        tries += [((12, 10), n) for n in range(1, len(give_way) + 1)] + [((8, 6), len(give_way))]
        width = self.app.size.width
        parts: list[str] = []
        for (target_w, draft_w), n_dropped in tries:
            shown = {k: optional[k] for k in give_way[n_dropped:]}
            parts = [label, f"{short(target, target_w)} ← {short(draft, draft_w)}"]
            if st is not None:
                k_text = "?" if k_now is None else str(k_now)
                parts.append(f"K {k_text} {'adaptive' if st.adaptive else 'fixed'}")
            parts += [v for k in ("temp", "experts") if (v := shown.get(k))]
            parts.append(f"{tps:.1f} tok/s" if tps is not None else "– tok/s")
            parts.append(f"acc {acc:.0%}" if acc is not None else "acc –")
            if content := shown.get("content"):
                parts.append(content)
            if len(" │ ".join(parts)) + 2 <= width:
                break
        parts[0] = f"[{style}]{label}[/]"
        parts[1:] = [escape(p) for p in parts[1:]]
        line = " │ ".join(parts)
        if line != self.line:
            self.line = line
            self.update(line, layout=False)
