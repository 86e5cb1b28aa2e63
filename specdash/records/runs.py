"""Finished runs read back from a file, one per prompt: a recording (specdash/records/recording.py:
`run --record`, the dashboard's `--record`, `attach --record`) or the JSON lines of
`run --json` / `attach --prompt --json`, which are the same events without the header.

Strict, unlike a replay: a comparison that silently lost the end of a file would judge
half a run, so any line that is not a contract event is an error naming the file and the
line. A run is the events from its prompt to its summary; its prompt text comes from its
`prompt` event, or, for a `run --record` file, from the header.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdash.contract import events as E
from specdash.engine.stats import SpecCounters
from specdash.contract.errors import SpecdashError
from specdash.records.recording import HEADER, check_header_schema, numbered_lines

MADE_BY = "record one with `specdash run --record FILE` or `attach URL --prompt TEXT --headless --record FILE`, " \
          "or save `specdash run --json` output"


@dataclass
class PromptRun:
    """One prompt run to its summary."""

    prompt: str
    title: str
    settings: E.SettingsEvent | None  # what it started with (a server's, as known by its summary)
    steps: SpecCounters  # totals over its step events (per-position drafts need them)
    summary: E.Summary
    line: int  # the summary's line in the file


@dataclass
class RunFile:
    path: Path
    header: dict[str, Any] | None  # None: `run --json` output
    runs: list[PromptRun] = field(default_factory=list)
    unfinished: int = 0  # prompts that never reached a summary (a dashboard quit mid-prompt)

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        """The header's model entries by role (target, draft): path, size, sha256."""
        out: dict[str, dict[str, Any]] = {}
        for entry in (self.header or {}).get("models", []) or []:
            if isinstance(entry, dict) and isinstance(entry.get("role"), str):
                out[entry["role"]] = entry
        return out


@dataclass
class _Open:
    prompt: str | None
    title: str
    settings: E.SettingsEvent | None
    steps: SpecCounters = field(default_factory=SpecCounters)
    started: bool = False  # a step or the prefill came: the settings in force are known


def read_runs(path: str | Path) -> RunFile:
    """Every finished run in the file; SpecdashError (one line, file and line named) on a
    missing or unreadable file, a bad line, a run whose prompt is unknown, or no run."""
    path = Path(path).expanduser()
    try:
        handle = path.open("r", encoding="utf-8", errors="strict")
    except FileNotFoundError:
        raise SpecdashError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SpecdashError(f"{path}: is a directory, not a recording") from None
    except OSError as exc:
        raise SpecdashError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    out = RunFile(path, None)
    settings: E.SettingsEvent | None = None
    run: _Open | None = None
    with handle:
        for n, text in numbered_lines(handle):
            data = _json_line(path, n, text)
            if n == 1 and isinstance(data, dict) and data.get("event") == HEADER:
                check_header_schema(data, path)
                out.header = data
                continue
            try:
                ev = E.from_dict(data)
            except E.ContractError as exc:
                raise SpecdashError(f"{path}: line {n}: {exc}") from None
            if isinstance(ev, E.SettingsEvent):
                settings = ev
                # Before its first step: what the run starts with. During it, only what
                # refines that (no command: a server telling what its slot drafted with
                # once a request ran); a hot-swap mid-run does not rename its settings.
                if run is not None and (not run.started or not ev.command):
                    run.settings = ev
            elif isinstance(ev, E.PromptEvent):
                if run is not None and (run.started or run.steps.steps):
                    out.unfinished += 1
                run = _Open(ev.text, ev.title, settings)
            elif isinstance(ev, (E.PrefillEvent, E.StepEvent)):
                if run is None:  # `run` output before prompt events existed, or a header-only prompt
                    run = _Open(None, "", settings)
                run.started = True
                if isinstance(ev, E.StepEvent):
                    run.steps.add(ev)
            elif isinstance(ev, E.Summary):
                if run is None:
                    run = _Open(None, "", settings)
                out.runs.append(_finish(path, n, run, ev, out.header))
                run = None
    if run is not None and (run.started or run.steps.steps):
        out.unfinished += 1
    if not out.runs:
        raise SpecdashError(f"{path}: no finished run in it (no summary line){'; ' + MADE_BY if out.header is None else ''}")
    return out


def _json_line(path: Path, n: int, text: str | None) -> Any:
    if text is None:
        raise SpecdashError(f"{path}: line {n}: not UTF-8 text")
    try:
        return json.loads(text)
    except ValueError:
        if not text.endswith("\n"):
            raise SpecdashError(f"{path}: line {n}: the line is cut off (a truncated file)") from None
        raise SpecdashError(f"{path}: line {n}: not a JSON line ({MADE_BY})") from None


def _finish(path: Path, n: int, run: _Open, summary: E.Summary, header: dict[str, Any] | None) -> PromptRun:
    prompt, title = run.prompt, run.title
    if prompt is None and header is not None and isinstance(header.get("prompt"), str):
        prompt, title = header["prompt"], title or "prompt"
    if prompt is None:
        raise SpecdashError(f"{path}: line {n}: a run whose prompt text is not in the file (made by an older "
                            "specdash?); the prompts cannot be checked: make it again")
    return PromptRun(prompt, title or "prompt", run.settings, run.steps, summary, n)
