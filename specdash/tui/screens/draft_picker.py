"""`d`: choose the draft source: a model-free one, or a model found on this machine.

The models come from the last `specdash models scan` (specdash's cache, the configured
model_dirs, llama.cpp / LM Studio / Ollama caches), judged against the running target
with `specdash check`'s rules (specdash.models.pairs): the compatible ones ranked and
selectable, the others greyed with the rule they fail, so the operator sees why. `r`
scans again (headers only, a second or two for a hundred files) in a named thread worker.
The engine swaps the drafter between steps; if it refuses one anyway (the model did not
load), a notice says why and the old drafter stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from specdash.engine.drafters import KINDS
from specdash.sources.base import Preset
from specdash.contract.errors import SpecdashError


@dataclass(frozen=True, slots=True)
class DraftChoice:
    spec: str  # what SetDrafter takes
    label: str  # what the list shows first
    description: str
    available: bool
    reason: str = ""  # why not available


def _tilde(path: str) -> str:
    """Home as ~: shorter, and the same on every machine for the same layout."""
    home = str(Path.home())
    return "~" + path[len(home):] if path == home or path.startswith(home + "/") else path


def draft_choices(target_path: str | None, scan_result: object | None) -> list[DraftChoice]:
    """Model-free sources, then the scanned models judged as drafts for `target_path`
    (compatible first, best first, then those that draft through translation, then the
    incompatible ones with their failed rule),
    then registry models that are not downloaded yet."""
    from specdash.models.pairs import rank_drafts
    from specdash.models.registry import list_models
    from specdash.models.scan import ScanResult

    choices = [DraftChoice(spec, spec, kind.help, True) for spec, kind in KINDS.items() if spec != "mtp"]
    head = _mtp_choice(target_path)
    if head is not None:  # listed only for a target that carries a head
        choices.insert(len(choices) - 2, head)  # before chain and none
    registry = {str(e.path): e.name for e in list_models()}
    listed: set[str] = set()
    if target_path and isinstance(scan_result, ScanResult):
        try:
            verdicts = rank_drafts(target_path, scan_result)
        except SpecdashError as exc:
            verdicts = []
            choices.append(DraftChoice("", "(scan)", f"cannot judge drafts for this target: {exc}", False))
        for v in verdicts:
            path = str(v.draft.path)
            name = registry.get(path)
            listed.add(path)
            size = f"{v.draft.size / 1e6:.0f} MB" if v.draft.size < 1e9 else f"{v.draft.size / 1e9:.1f} GB"
            what = f"{v.draft.quant} · {size} · {_tilde(str(v.draft.source or v.draft.root))}"
            if v.compatible:
                tag = "SELF " if v.self_speculative else ""
                desc = f"#{v.rank} {tag}score {v.score:.0f} · {what}"
                choices.append(DraftChoice(name or path, name or v.draft.label, desc, True))
            elif v.translation:  # another vocabulary: it drafts through translation, exactly
                slow = " · slower than plain" if (v.size_ratio or 0) >= 1 else ""
                desc = f"#{v.rank} translated ({v.failed_rule} differs) score {v.score:.0f}{slow} · {what}"
                choices.append(DraftChoice(name or path, name or v.draft.label, desc, True))
            else:
                choices.append(DraftChoice(name or path, name or v.draft.label, what, False, v.reason))
    for entry in list_models():
        if str(entry.path) in listed or entry.path == Path(target_path or ""):
            continue
        reason = "" if entry.cached else f"not cached: run `specdash models fetch {entry.name}`"
        choices.append(DraftChoice(entry.name, entry.name, entry.description, entry.cached, reason))
    return choices


def _mtp_choice(target_path: str | None) -> DraftChoice | None:
    """`mtp` for a target whose GGUF keeps an MTP head (read from its header), else None."""
    from specdash.models.mtp_info import mtp_head

    if not target_path:
        return None
    try:
        head = mtp_head(target_path)
    except SpecdashError:
        return None
    if not head.layers:
        return None
    from specdash.engine.drafters.mtp import MtpUnavailable, staging_api

    try:
        staging_api()  # the bindings this llama-cpp-python has (the head's hand-off is a staging API)
    except MtpUnavailable as exc:
        return DraftChoice("mtp", "mtp", f"{KINDS['mtp'].help} · {head.describe()}", False, f"unavailable: {exc}")
    return DraftChoice("mtp", "mtp", f"{KINDS['mtp'].help} · {head.describe()}", True)


class DraftPicker(ModalScreen[str | None]):
    DEFAULT_CSS = """
    DraftPicker { align: center middle; }
    DraftPicker > Vertical {
        width: 90%; max-width: 120; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    DraftPicker OptionList { height: auto; max-height: 18; border: none; }
    DraftPicker .hint { color: $text-muted; }
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="picker.cancel"),
        Binding("r", "rescan", "scan again", id="picker.rescan"),
    ]

    def __init__(self, current: str, target_path: str | None, *, model_dirs: tuple[str, ...] = (),
                 scan_result: object | None = None, scan_on_open: bool | None = None):
        """scan_result: what to list first (default: the last stored scan); scan_on_open:
        scan at once (default: when there is no stored scan)."""
        super().__init__()
        from specdash.models.scan import cached_scan

        self._current = current
        self._target = target_path
        self._dirs = model_dirs
        self._result = scan_result if scan_result is not None else cached_scan()
        self._scan_on_open = self._result is None if scan_on_open is None else scan_on_open
        self.choices = draft_choices(target_path, self._result)

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"Draft source (now: {escape(self._current)}) · r scans for models again"
            yield OptionList(*self._options(), id="draft-options")
            yield Label(self._scan_note(), id="scan-note", classes="hint")
            yield Label("or a GGUF file path (Enter to use it):", classes="hint")
            yield Input(placeholder="/path/to/draft.gguf", id="draft-path")

    def _options(self) -> list[Option]:
        width = max((len(c.label) for c in self.choices), default=10)
        width = min(max(width, 10), 34)
        options = []
        for c in self.choices:
            line = Text()
            label = c.label if len(c.label) <= width else c.label[: width - 1] + "…"
            line.append(f"{label:<{width}}  ", "bold" if c.spec == self._current else "")
            line.append(c.description if c.available else f"{c.description} · {c.reason}",
                        "" if c.available else "dim")
            options.append(Option(line, disabled=not c.available))
        return options

    def _scan_note(self) -> str:
        from specdash.models.scan import ScanResult

        if not isinstance(self._result, ScanResult):
            return "no scan of this machine's models yet: scanning…" if self._scan_on_open else "no scan yet: r scans"
        found = sum(1 for c in self.choices if c.spec not in KINDS and c.available)
        translated = sum(1 for c in self.choices if c.available and " translated (" in c.description)
        models, dirs = len(self._result.models), len(self._result.dirs)
        via = f" ({translated} through translation)" if translated else ""
        return (f"{models} model{'s' * (models != 1)} found in {dirs} folder{'s' * (dirs != 1)}, "
                f"{found} usable as draft{'s' * (found != 1)} here{via}")

    def on_mount(self) -> None:
        option_list = self.query_one(OptionList)
        specs = [c.spec for c in self.choices]
        if self._current in specs:
            option_list.highlighted = specs.index(self._current)
        option_list.focus()
        if self._scan_on_open:
            self.action_rescan()

    def action_rescan(self) -> None:
        self.query_one("#scan-note", Label).update("scanning for GGUF models…")
        self._scan()

    @work(thread=True, exclusive=True, name="model-scan", group="model-scan")
    def _scan(self) -> None:
        from specdash.models.scan import ScanProgress, scan

        worker = get_current_worker()

        def progress(p: ScanProgress) -> None:
            if p.done and not worker.is_cancelled:
                self.app.call_from_thread(self._progress, p.done, p.total)

        result = scan(extra_dirs=self._dirs, progress=progress)
        if not worker.is_cancelled:
            self.app.call_from_thread(self._show, result)

    def _progress(self, done: int, total: int) -> None:
        self.query_one("#scan-note", Label).update(f"scanning: {done}/{total} files")

    def _show(self, result: object) -> None:
        self._result = result
        self.choices = draft_choices(self._target, result)
        option_list = self.query_one(OptionList)
        option_list.clear_options()
        option_list.add_options(self._options())
        self.query_one("#scan-note", Label).update(self._scan_note())

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.choices[event.option_index].spec)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        path = event.value.strip()
        if not path:
            self.notify("type a GGUF path, or pick a source above", severity="warning")
            return
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)


class PresetPicker(ModalScreen[str | None]):
    """`d` on a llama-server router: its presets (model@draft-k8, model@ngram...). The
    source unloads the running one and loads the chosen one; its panels follow."""

    DEFAULT_CSS = DraftPicker.DEFAULT_CSS.replace("DraftPicker", "PresetPicker")
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="presets.cancel")]

    def __init__(self, presets: list[Preset]):
        super().__init__()
        self.presets = presets

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Router presets · Enter switches (the server reloads)"
            options = []
            for p in self.presets:
                line = Text(f"{p.id:<40}", "bold" if p.active else "")
                line.append(f"{p.status}{' · running' if p.active else ''}", "dim")
                options.append(Option(line))
            if not options:
                options.append(Option(Text("the router offers no presets", "dim"), disabled=True))
            yield OptionList(*options)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.presets[event.option_index].id)

    def action_cancel(self) -> None:
        self.dismiss(None)
