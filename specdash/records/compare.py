"""`specdash compare A B`: two sets of runs of the same prompts, figure by figure, and
whether B is worse than A by more than allowed (no Textual; commands/compare.py prints).

Figures per prompt, over every finished run of it in the file (a prompt run twice counts
both): acceptance = accepted / drafted tokens (llama.cpp's), acceptance length = 1 +
accepted / drafts (vLLM's mean accepted length), per position i = the share of drafts
reaching position i whose token i was accepted (the dashboard's, from the step events),
tok/s = each run's own decode rate (its summary's: the engine's generated tokens / decode
seconds, llama-server's predicted_per_second), over several runs weighted by decode time.
Totals come from each run's summary: in drive mode those are the server's own counts.

Limits, both "worse by more than X":
  acceptance_drop  X percentage points of acceptance: fails when B < A - X points
                   (66.7% -> 52.4% is a drop of 14.3 points); a prompt where B drafted
                   nothing and A did fails whatever X is.
  slower           X percent of A's tok/s: fails when B < A * (1 - X/100).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdash.contract.errors import SpecdashError
from specdash.records.runs import PromptRun, RunFile, read_runs

PER_POSITION_SHOWN = 16  # per-position rows in the text report (all of them in JSON)


@dataclass
class Figures:
    """One prompt's runs in one file, added up."""

    runs: int = 0
    generated: int = 0
    decode_s: float = 0.0
    rated: float = 0.0  # sum of tok/s x decode seconds: tokens at each run's own rate
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    per_pos_drafted: list[int] = field(default_factory=list)
    per_pos_accepted: list[int] = field(default_factory=list)
    stop_reasons: list[str] = field(default_factory=list)

    def add(self, run: PromptRun) -> None:
        s = run.summary
        self.runs += 1
        self.generated += s.n_generated
        self.decode_s += s.decode_s
        self.rated += s.tokens_per_s * s.decode_s
        self.drafts += s.num_drafts
        self.drafted += s.num_draft_tokens
        self.accepted += s.num_accepted_tokens
        self.stop_reasons.append(s.stop_reason)
        if run.steps.steps:
            drafted, accepted = run.steps.per_pos_drafted, run.steps.per_pos_accepted
        else:  # no step events: every draft counts as reaching every position (vLLM's rate)
            accepted = list(s.num_accepted_tokens_per_pos)
            drafted = [s.num_drafts] * len(accepted)
        self._add_per_pos(drafted, accepted)

    def _add_per_pos(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        grow = len(drafted) - len(self.per_pos_drafted)
        if grow > 0:
            self.per_pos_drafted.extend([0] * grow)
            self.per_pos_accepted.extend([0] * grow)
        for i, (d, a) in enumerate(zip(drafted, accepted)):
            self.per_pos_drafted[i] += d
            self.per_pos_accepted[i] += a

    def merge(self, other: Figures) -> None:
        self.runs += other.runs
        self.generated += other.generated
        self.decode_s += other.decode_s
        self.rated += other.rated
        self.drafts += other.drafts
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.stop_reasons += other.stop_reasons
        self._add_per_pos(other.per_pos_drafted, other.per_pos_accepted)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def tokens_per_s(self) -> float | None:
        """Each run's own rate (a server counts the first token to prefill: n - 1 over the
        decode time), weighted by its decode time; one run's is its summary's."""
        return self.rated / self.decode_s if self.decode_s > 0 and self.rated > 0 else None

    @property
    def per_position(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.per_pos_accepted, self.per_pos_drafted)]

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "n_generated": self.generated, "decode_s": self.decode_s,
                "num_drafts": self.drafts, "num_draft_tokens": self.drafted, "num_accepted_tokens": self.accepted,
                "acceptance_rate": self.acceptance, "mean_accepted_length": self.acceptance_length,
                "tokens_per_s": self.tokens_per_s, "acceptance_per_pos": self.per_position,
                "num_drafts_per_pos": list(self.per_pos_drafted),
                "num_accepted_tokens_per_pos": list(self.per_pos_accepted), "stop_reasons": self.stop_reasons}


@dataclass(frozen=True)
class Limits:
    acceptance_drop: float | None = None  # percentage points of acceptance rate
    slower: float | None = None  # percent of A's tok/s


@dataclass
class Failure:
    prompt: str  # the prompt's display name
    figure: str  # "acceptance" | "tok/s"
    a: float | None
    b: float | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "figure": self.figure, "a": self.a, "b": self.b, "message": self.message}


@dataclass
class PromptRow:
    text: str
    name: str
    a: Figures
    b: Figures


@dataclass
class SettingRow:
    name: str
    a: str
    b: str
    # From the recording header only: a file without one (`run --json`) does not know it,
    # which is no difference.
    header_only: bool = False

    @property
    def differs(self) -> bool:
        if self.header_only and "-" in (self.a, self.b):
            return False
        return self.a != self.b


@dataclass
class Comparison:
    a: RunFile
    b: RunFile
    prompts: list[PromptRow]
    settings: list[SettingRow]
    limits: Limits
    failures: list[Failure]

    @property
    def total(self) -> PromptRow:
        ta, tb = Figures(), Figures()
        for row in self.prompts:
            ta.merge(row.a)
            tb.merge(row.b)
        return PromptRow("", "all prompts", ta, tb)

    def notes(self) -> list[str]:
        out = []
        for f in (self.a, self.b):
            if f.unfinished:
                out.append(f"{f.path}: {f.unfinished} unfinished run(s) left out (no summary)")
        temps = {row.a for row in self.settings if row.name == "temperature"} | \
                {row.b for row in self.settings if row.name == "temperature"}
        if any(t not in ("0", "-", "") for t in temps):
            out.append("sampled runs (temperature > 0): acceptance differs from run to run; "
                       "compare several runs of each prompt, or temperature 0")
        return out

    def to_json(self) -> dict[str, Any]:
        def rows(row: PromptRow) -> dict[str, Any]:
            return {"prompt": row.text, "name": row.name, "a": row.a.to_json(), "b": row.b.to_json(),
                    "delta": _delta(row.a, row.b)}

        return {
            "a": str(self.a.path), "b": str(self.b.path),
            "limits": {"acceptance_drop_points": self.limits.acceptance_drop, "slower_percent": self.limits.slower},
            "settings": [{"name": r.name, "a": r.a, "b": r.b, "differs": r.differs} for r in self.settings],
            "prompts": [rows(r) for r in self.prompts],
            "total": rows(self.total),
            "failures": [f.to_json() for f in self.failures],
            "notes": self.notes(),
            "passed": not self.failures,
        }

    def text(self) -> str:
        out = [f"A: {self.a.path}", f"B: {self.b.path}", ""]
        width = max([len(r.name) for r in self.settings] + [8])
        out.append(f"  {'settings':<{width}}  {_cut('A', 34):<34}  B")
        for r in self.settings:
            mark = "  <- differs" if r.differs else ""
            out.append(f"  {r.name:<{width}}  {_cut(r.a, 34):<34}  {r.b}{mark}")
        for row in [*self.prompts, self.total] if len(self.prompts) > 1 else self.prompts:
            out.append("")
            out.append(_block(row))
        out.append("")
        out.extend(f"note: {n}" for n in self.notes())
        judged = [name for name, value in (("acceptance drop", self.limits.acceptance_drop),
                                           ("slowdown", self.limits.slower)) if value is not None]
        if not judged:
            out.append("no limits given (--fail-if-acceptance-drops, --fail-if-slower): nothing judged")
        elif not self.failures:
            out.append(f"within limits on {len(self.prompts)} prompt(s): {_limits_text(self.limits)}")
        else:
            out.append(f"B is worse than allowed ({_limits_text(self.limits)}):")
            out.extend(f"  {f.message}" for f in self.failures)
        return "\n".join(out)


def compare(a: RunFile, b: RunFile, limits: Limits) -> Comparison:
    """The comparison; SpecdashError (exit 2) when the two files ran different prompts."""
    fa, fb = by_prompt(a), by_prompt(b)
    for (has, figs), lacks in (((a, fa), b), ((b, fb), a)):
        other = fb if has is a else fa
        missing = [text for text in figs if text not in other]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise SpecdashError(f"the prompts differ: {lacks.path} has no run of {_name(missing[0], figs[missing[0]][0])!r}, "
                                f"which {has.path} has{more}{_closest(missing[0], list(other))}; "
                                "compare runs of the same prompts")
    prompts = [PromptRow(text, _name(text, title), figs, fb[text][1]) for text, (title, figs) in fa.items()]
    failures: list[Failure] = []
    for row in prompts:
        failures.extend(judge(row, limits))
    return Comparison(a, b, prompts, settings_rows(a, b), limits, failures)


def _closest(text: str, others: list[str]) -> str:
    """Where the nearest prompt on the other side departs from this one, when they share
    a start (an edited prompt file): the part of the message that says what changed."""
    def shared(other: str) -> int:
        n = 0
        while n < min(len(text), len(other)) and text[n] == other[n]:
            n += 1
        return n

    best = max(others, key=shared, default="")
    n = shared(best)
    if n < 12:
        return ""
    return f" (the closest there departs at character {n + 1}: {text[n:n + 24]!r} vs {best[n:n + 24]!r})"


def by_prompt(f: RunFile) -> dict[str, tuple[str, Figures]]:
    """Prompt text -> (title of its first run, its runs added up), in order of first run."""
    out: dict[str, tuple[str, Figures]] = {}
    for run in f.runs:
        title, figs = out.setdefault(run.prompt, (run.title, Figures()))
        figs.add(run)
    return out


def judge(row: PromptRow, limits: Limits) -> list[Failure]:
    out: list[Failure] = []
    acc_a, acc_b = row.a.acceptance, row.b.acceptance
    if limits.acceptance_drop is not None and acc_a is not None:
        if acc_b is None:
            out.append(Failure(row.name, "acceptance", acc_a, None,
                               f"{row.name!r}: acceptance {acc_a:.1%} in A, but B drafted nothing"))
        elif (acc_a - acc_b) * 100 > limits.acceptance_drop:
            out.append(Failure(row.name, "acceptance", acc_a, acc_b,
                               f"{row.name!r}: acceptance {acc_a:.1%} -> {acc_b:.1%}, down "
                               f"{(acc_a - acc_b) * 100:.1f} points (limit {limits.acceptance_drop:g})"))
    tps_a, tps_b = row.a.tokens_per_s, row.b.tokens_per_s
    if limits.slower is not None and tps_a and tps_b is not None:
        if tps_b < tps_a * (1 - limits.slower / 100):
            out.append(Failure(row.name, "tok/s", tps_a, tps_b,
                               f"{row.name!r}: tok/s {tps_a:.1f} -> {tps_b:.1f}, {(1 - tps_b / tps_a) * 100:.1f}% "
                               f"slower (limit {limits.slower:g}%)"))
    return out


# --- settings side by side ---

# (row name, SettingsEvent field); each shown as its distinct values over the file's runs.
SETTING_FIELDS = (("target", "target"), ("drafter", "drafter"), ("K", "k"), ("adaptive K", "adaptive"),
                  ("temperature", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"), ("seed", "seed"),
                  ("draft_p_joint", "draft_p_joint"), ("draft_p_min", "draft_p_min"), ("max tokens", "max_tokens"),
                  ("threads", "threads"), ("context", "ctx"), ("source", "source"))


def settings_rows(a: RunFile, b: RunFile) -> list[SettingRow]:
    rows = [SettingRow(name, _values(a, key), _values(b, key)) for name, key in SETTING_FIELDS]
    for role in ("target", "draft"):
        (name_a, sha_a), (name_b, sha_b) = _model_file(a, role), _model_file(b, role)
        if sha_a and sha_b:  # the same name can hold another file: the hash tells
            name_a, name_b = f"{name_a} sha256 {sha_a[:12]}", f"{name_b} sha256 {sha_b[:12]}"
        rows.append(SettingRow(f"{role} file", name_a, name_b))
    for name, get in (("server build", _server_build), ("specdash", lambda f: str((f.header or {}).get("specdash") or "-")),
                      ("machine", _machine)):
        rows.append(SettingRow(name, get(a), get(b), header_only=True))
    return [r for r in rows if (r.a, r.b) != ("-", "-")]


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _values(f: RunFile, key: str) -> str:
    seen = list(dict.fromkeys(_show(getattr(r.settings, key, None)) if r.settings else "-" for r in f.runs))
    return " / ".join(seen)


def _model_file(f: RunFile, role: str) -> tuple[str, str]:
    """(file name, sha256 or "") of the GGUF the runs used: the header's entry for a
    recording (hashed when recorded), else the settings' path."""
    entry = f.models.get(role)
    if entry is not None:
        return Path(str(entry.get("path"))).name, str(entry.get("sha256") or "")
    key = "target_path" if role == "target" else "draft_path"
    paths = list(dict.fromkeys(getattr(r.settings, key, None) for r in f.runs if r.settings))
    return " / ".join(Path(p).name for p in paths if p) or "-", ""


def _server_build(f: RunFile) -> str:
    server = (f.header or {}).get("server")
    if isinstance(server, dict) and server.get("build_info"):
        return str(server["build_info"])
    return "-"


def _machine(f: RunFile) -> str:
    m = (f.header or {}).get("machine")
    if not isinstance(m, dict):
        return "-"
    return f"{m.get('cpu_model') or '?'}, {m.get('logical_cpus') or '?'} CPUs"


# --- text ---

def _name(text: str, title: str) -> str:
    """How a prompt is named in the report: its title when it has one of its own (a file
    name, a workload entry), else its opening words."""
    if title and title != "prompt" and not title.startswith("prompt "):
        return title
    flat = " ".join(text.split())
    return flat if len(flat) <= 40 else flat[:39] + "…"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _points(a: float | None, b: float | None) -> str:
    return "" if a is None or b is None else f"{(b - a) * 100:+.1f} pt"


def _delta(a: Figures, b: Figures) -> dict[str, float | None]:
    acc = None if a.acceptance is None or b.acceptance is None else (b.acceptance - a.acceptance) * 100
    length = None if a.acceptance_length is None or b.acceptance_length is None \
        else b.acceptance_length - a.acceptance_length
    speed = None if not a.tokens_per_s or b.tokens_per_s is None else (b.tokens_per_s / a.tokens_per_s - 1) * 100
    return {"acceptance_points": acc, "acceptance_length": length, "tokens_per_s_percent": speed}


def _block(row: PromptRow) -> str:
    a, b = row.a, row.b
    d = _delta(a, b)
    head = f"{row.name}" + ("" if row.name == "all prompts" else f"  ({a.runs} run(s) in A, {b.runs} in B)")
    lines = [head, f"  {'':<18} {'A':>10} {'B':>10}   B - A"]
    lines.append(f"  {'acceptance':<18} {_pct(a.acceptance):>10} {_pct(b.acceptance):>10}   "
                 f"{_points(a.acceptance, b.acceptance)}")
    lines.append(f"  {'acceptance length':<18} {_num(a.acceptance_length, '.2f'):>10} "
                 f"{_num(b.acceptance_length, '.2f'):>10}   "
                 + ("" if d["acceptance_length"] is None else f"{d['acceptance_length']:+.2f}"))
    lines.append(f"  {'tok/s':<18} {_num(a.tokens_per_s, '.1f'):>10} {_num(b.tokens_per_s, '.1f'):>10}   "
                 + ("" if d["tokens_per_s_percent"] is None else f"{d['tokens_per_s_percent']:+.1f}%"))
    lines.append(f"  {'tokens generated':<18} {a.generated:>10} {b.generated:>10}")
    pa, pb = a.per_position, b.per_position
    n = max(len(pa), len(pb))
    if n:
        lines.append("  per position (share of drafts reaching it that were accepted)")
        for i in range(min(n, PER_POSITION_SHOWN)):
            va = pa[i] if i < len(pa) else None
            vb = pb[i] if i < len(pb) else None
            lines.append(f"  {i + 1:>18} {_pct(va):>10} {_pct(vb):>10}   {_points(va, vb)}")
        if n > PER_POSITION_SHOWN:
            lines.append(f"  {'':>18} positions {PER_POSITION_SHOWN + 1}-{n} in --json")
    return "\n".join(lines)


def _limits_text(limits: Limits) -> str:
    parts = []
    if limits.acceptance_drop is not None:
        parts.append(f"acceptance may drop {limits.acceptance_drop:g} points")
    if limits.slower is not None:
        parts.append(f"tok/s may drop {limits.slower:g}%")
    return ", ".join(parts)


__all__ = ["Comparison", "Figures", "Limits", "Failure", "compare", "read_runs"]
