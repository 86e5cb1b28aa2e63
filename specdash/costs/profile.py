"""Cost profiles: what a target step, a drafted token and a step's bookkeeping cost on
some machine, so a simulated run can be timed in a regime we cannot run here.

A profile is a TOML file:

    name = "epyc-32b"
    note = "where the numbers came from"
    step_overhead_ms = 0.4          # per step, outside drafting and the target batch
    [verify_ms]                     # target batch of n tokens -> ms (points to interpolate)
    1 = 346.0
    25 = 450.0
    [draft]
    ms_per_token = 12.0             # one single-token draft-model decode
    pair_ms = 20.0                  # optional: a 2-token batch, its usual sync before drafting
    batch_ms_per_token = 4.0        # optional: per token of a multi-token catch-up batch
    relative_cost = 0.035           # optional: what the engine prices a drafted token at
    free_ms = 0.1                   # optional: a lookup/suffix proposal (default: timed here)
    [checkpoint]                    # optional, for targets that restore state on rejection
    restore_ms = 5.0
    replay_ms_per_token = 1.0
    [mtp]                           # optional: the target's own MTP head (`mtp`)
    ms_per_token = 9.0              # one head decode (a drafted token)
    batch_ms_per_token = 0.5        # per committed token fed to the head in a batch

A profile a run keeps (specdash/costs/store.py) adds what says whose costs they are:

    measured = 2026-11-28T07:30:00Z # when it was last saved (a TOML date-time)
    [key]                           # what the costs depend on (costs/key.py); strings and integers
    cpu = "AMD EPYC"
    threads = 2
    [samples]                       # timings behind each [verify_ms] point
    1 = 412
    5 = 8
    [draft_models]                  # ms per drafted token, by draft model
    "qwen2.5-coder-0.5b" = 21.5

whatif reads all of it and simulates with [verify_ms] and [draft] as in any profile.

Without [mtp] the head is priced from its share of the target's weights (the relative
cost the session gives it): a head decode at that share of a one-token step, a fed token
at that share of what one more token adds to a target batch.

Between verify points the cost is interpolated linearly; beyond the last it follows the
slope of the last two (a CPU's curve is close to linear, a GPU's nearly flat).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from specdash.contract.errors import SpecdashError

BUILTIN = ("epyc-32b", "gpu-like", "ci-box")  # shipped in specdash/costs/profiles/
_TOP = {"name", "note", "step_overhead_ms", "verify_ms", "draft", "checkpoint", "mtp",
        "measured", "key", "samples", "draft_models"}
_DRAFT = {"ms_per_token", "pair_ms", "batch_ms_per_token", "relative_cost", "free_ms"}
_CHECKPOINT = {"restore_ms", "replay_ms_per_token"}
_MTP = {"ms_per_token", "batch_ms_per_token"}


@dataclass
class Profile:
    name: str
    verify: dict[int, float]  # target batch size -> ms
    draft_ms: float = 0.0  # per single-token draft-model decode
    batch_ms: float | None = None  # per token of a catch-up batch (None: draft_ms)
    # A 2-token batch (None: draft_ms + batch_ms). Measured on its own: on a 2-core CPU
    # it cost 1.7-2x a single decode, where a 16-token batch's per-token price (batch_ms)
    # made it 1.3x, and that difference was a fifth of a K=2 step.
    pair_ms: float | None = None
    relative_cost: float | None = None  # None: draft_ms / verify(1)
    free_ms: float | None = None  # None: the real proposal's time on this machine
    overhead_ms: float = 0.0
    restore_ms: float = 0.0
    replay_ms: float = 0.0
    mtp_ms: float | None = None  # one MTP head decode (None: from its relative cost)
    mtp_batch_ms: float | None = None  # per token fed to the head in a batch
    note: str = ""
    source: str = ""  # where it was read from ("here" when measured now)
    # What a kept profile adds (specdash/costs): when, for whom, how many timings.
    measured: datetime | None = None
    key: dict[str, str | int] = field(default_factory=dict)
    samples: dict[int, int] = field(default_factory=dict)
    draft_models: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # measured context, for the report

    def verify_ms(self, n: int) -> float:
        """ms of a target batch of n tokens, interpolated between the profile's points."""
        pts = sorted(self.verify.items())
        if n in self.verify:
            return self.verify[n]
        if len(pts) == 1:
            return pts[0][1]
        if n < pts[0][0]:
            (n0, v0), (n1, v1) = pts[0], pts[1]
        elif n > pts[-1][0]:
            (n0, v0), (n1, v1) = pts[-2], pts[-1]
        else:
            i = next(i for i, (m, _) in enumerate(pts) if m > n)
            (n0, v0), (n1, v1) = pts[i - 1], pts[i]
        return max(v0 + (v1 - v0) * (n - n0) / (n1 - n0), 0.05 * pts[0][1])

    def feed_ms(self, m: int) -> float:
        """A draft-model batch of m tokens (its sync before drafting: 1-2 tokens normally,
        more after sitting out steps)."""
        if m <= 0:
            return 0.0
        batch = self.draft_ms if self.batch_ms is None else self.batch_ms
        if m == 1:
            return self.draft_ms
        pair = self.draft_ms + batch if self.pair_ms is None else self.pair_ms
        return pair + (m - 2) * batch

    def mtp_costs(self, relative_cost: float | None) -> tuple[float, float]:
        """(ms of one head decode, ms per token fed to it): the [mtp] table's, else the
        head's share of the target's weights applied to a one-token step and to what one
        more token adds to a target batch."""
        share = relative_cost if relative_cost is not None else 0.1
        head = self.mtp_ms if self.mtp_ms is not None else share * self.verify_ms(1)
        batch = self.mtp_batch_ms if self.mtp_batch_ms is not None else \
            share * max(self.verify_ms(2) - self.verify_ms(1), 0.0)
        return head, batch

    def draft_price(self) -> float | None:
        """What the engine is told a drafted token costs relative to a target step."""
        if self.relative_cost is not None:
            return self.relative_cost
        return self.draft_ms / self.verify_ms(1) if self.draft_ms > 0 else None

    def to_toml(self) -> str:
        lines = [f"name = {_q(self.name)}", f"note = {_q(self.note)}",
                 f"step_overhead_ms = {self.overhead_ms:.4f}"]
        if self.measured is not None:  # a top-level key: before the first table
            lines.append(f"measured = {self.measured.astimezone(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}")
        lines += ["", "[verify_ms]"]
        lines += [f"{n} = {v:.4f}" for n, v in sorted(self.verify.items())]
        lines += ["", "[draft]", f"ms_per_token = {self.draft_ms:.4f}"]
        for key, value in (("pair_ms", self.pair_ms), ("batch_ms_per_token", self.batch_ms),
                           ("relative_cost", self.relative_cost), ("free_ms", self.free_ms)):
            if value is not None:
                lines.append(f"{key} = {value:.6g}")
        if self.restore_ms or self.replay_ms:
            lines += ["", "[checkpoint]", f"restore_ms = {self.restore_ms:.4f}",
                      f"replay_ms_per_token = {self.replay_ms:.4f}"]
        if self.mtp_ms is not None:
            lines += ["", "[mtp]", f"ms_per_token = {self.mtp_ms:.4f}"]
            if self.mtp_batch_ms is not None:
                lines.append(f"batch_ms_per_token = {self.mtp_batch_ms:.4f}")
        lines += self._kept_toml()
        return "\n".join(lines) + "\n"

    def _kept_toml(self) -> list[str]:
        lines: list[str] = []
        if self.key:
            lines += ["", "[key]"]
            lines += [f"{k} = {v}" if isinstance(v, int) else f"{k} = {_q(str(v))}" for k, v in self.key.items()]
        if self.samples:
            lines += ["", "[samples]", *(f"{n} = {c}" for n, c in sorted(self.samples.items()))]
        if self.draft_models:
            lines += ["", "[draft_models]", *(f"{_q(m)} = {v:.4f}" for m, v in sorted(self.draft_models.items()))]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "note": self.note, "source": self.source,
                "verify_ms": {str(n): v for n, v in sorted(self.verify.items())},
                "draft_ms_per_token": self.draft_ms, "pair_ms": self.pair_ms, "batch_ms_per_token": self.batch_ms,
                "relative_cost": self.relative_cost, "free_ms": self.free_ms,
                "step_overhead_ms": self.overhead_ms, "restore_ms": self.restore_ms,
                "replay_ms_per_token": self.replay_ms, "mtp_ms_per_token": self.mtp_ms,
                "mtp_batch_ms_per_token": self.mtp_batch_ms,
                **({"measured": self.measured.isoformat(), "key": self.key,
                    "samples": {str(n): c for n, c in sorted(self.samples.items())}} if self.measured else {}),
                **self.extra}


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _number(where: str, key: str, value: Any, *, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        need = "a number > 0" if positive else "a number >= 0"
        raise SpecdashError(f"{where}: {key} = {value!r}: must be {need} (milliseconds)")
    return float(value)


def _unknown(where: str, table: str, doc: dict[str, Any], valid: set[str]) -> None:
    for key in doc:
        if key not in valid:
            prefix = f"[{table}] " if table else ""
            raise SpecdashError(f"{where}: unknown key {prefix}{key!r}; valid keys: {', '.join(sorted(valid))}")


def parse_profile(text: str, where: str) -> Profile:
    """A profile from TOML text; every problem is a one-line SpecdashError naming `where`
    (the file), the key and what is valid."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecdashError(f"{where}: invalid TOML: {exc}") from None
    _unknown(where, "", doc, _TOP)
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SpecdashError(f"{where}: name = {name!r}: must be a non-empty string (the profile's name)")
    note = doc.get("note", "")
    if not isinstance(note, str):
        raise SpecdashError(f"{where}: note = {note!r}: must be a string (where the numbers came from)")
    points = doc.get("verify_ms")
    if not isinstance(points, dict) or not points:
        raise SpecdashError(f"{where}: [verify_ms] missing or empty: need points like `1 = 346.0` "
                            "(target batch of n tokens = ms)")
    verify: dict[int, float] = {}
    for key, value in points.items():
        if not key.isdigit() or not 1 <= int(key) <= 512:
            raise SpecdashError(f"{where}: [verify_ms] key {key!r}: must be a batch size 1..512")
        verify[int(key)] = _number(where, f"[verify_ms] {key}", value, positive=True)
    draft = doc.get("draft", {})
    if not isinstance(draft, dict):
        raise SpecdashError(f"{where}: draft must be a table [draft] with keys {', '.join(sorted(_DRAFT))}")
    _unknown(where, "draft", draft, _DRAFT)
    ckpt = doc.get("checkpoint", {})
    if not isinstance(ckpt, dict):
        raise SpecdashError(f"{where}: checkpoint must be a table [checkpoint] with keys "
                            f"{', '.join(sorted(_CHECKPOINT))}")
    _unknown(where, "checkpoint", ckpt, _CHECKPOINT)
    mtp = doc.get("mtp", {})
    if not isinstance(mtp, dict):
        raise SpecdashError(f"{where}: mtp must be a table [mtp] with keys {', '.join(sorted(_MTP))}")
    _unknown(where, "mtp", mtp, _MTP)

    measured = doc.get("measured")
    if measured is not None and not (isinstance(measured, datetime) and measured.tzinfo is not None):
        raise SpecdashError(f"{where}: measured = {measured!r}: must be a TOML date-time with a zone, "
                            "like 2026-11-28T07:30:00Z")
    key = doc.get("key", {})
    if not isinstance(key, dict) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in key.values()):
        raise SpecdashError(f"{where}: [key] must be a table of strings and integers (what the costs depend on)")
    samples = _counts(where, doc.get("samples", {}), verify)
    models = doc.get("draft_models", {})
    if not isinstance(models, dict):
        raise SpecdashError(f"{where}: draft_models must be a table [draft_models] of model = ms per drafted token")
    draft_models = {str(m): _number(where, f"[draft_models] {m}", v, positive=True) for m, v in models.items()}

    def opt(table: dict[str, Any], tname: str, key: str) -> float | None:
        return None if key not in table else _number(where, f"[{tname}] {key}", table[key])

    return Profile(
        name=name.strip(), note=note, verify=verify,
        draft_ms=opt(draft, "draft", "ms_per_token") or 0.0,
        batch_ms=opt(draft, "draft", "batch_ms_per_token"),
        pair_ms=opt(draft, "draft", "pair_ms"),
        relative_cost=opt(draft, "draft", "relative_cost"),
        free_ms=opt(draft, "draft", "free_ms"),
        overhead_ms=_number(where, "step_overhead_ms", doc.get("step_overhead_ms", 0.0)),
        restore_ms=opt(ckpt, "checkpoint", "restore_ms") or 0.0,
        replay_ms=opt(ckpt, "checkpoint", "replay_ms_per_token") or 0.0,
        mtp_ms=opt(mtp, "mtp", "ms_per_token"),
        mtp_batch_ms=opt(mtp, "mtp", "batch_ms_per_token"),
        source=where,
        measured=measured, key=dict(key), samples=samples, draft_models=draft_models,
    )


def _counts(where: str, table: Any, verify: dict[int, float]) -> dict[int, int]:
    """[samples]: a count >= 1 for points of [verify_ms]."""
    if not isinstance(table, dict):
        raise SpecdashError(f"{where}: samples must be a table [samples] of batch size = timings")
    out = {}
    for k, v in table.items():
        if not k.isdigit() or int(k) not in verify:
            raise SpecdashError(f"{where}: [samples] key {k!r}: must be a batch size of [verify_ms]")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise SpecdashError(f"{where}: [samples] {k} = {v!r}: must be a count >= 1")
        out[int(k)] = v
    return out


def load_profile(spec: str) -> Profile:
    """`spec`: a shipped profile's name (BUILTIN) or a TOML file's path."""
    if spec in BUILTIN:
        text = resources.files("specdash.costs").joinpath("profiles", f"{spec}.toml").read_text("utf-8")
        return parse_profile(text, f"profile {spec}")
    path = Path(spec).expanduser()
    if not path.is_file():
        raise SpecdashError(f"--profile {spec}: no such file; give a TOML profile, `here`, "
                            f"or a shipped one: {', '.join(BUILTIN)}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecdashError(f"--profile {path}: cannot read it ({exc.__class__.__name__})") from None
    return parse_profile(text, str(path))


def save_profile(profile: Profile, path: str | Path) -> None:
    path = Path(path).expanduser()
    try:
        path.write_text(profile.to_toml(), encoding="utf-8")
    except OSError as exc:
        raise SpecdashError(f"--save-profile {path}: cannot write it ({exc.strerror or exc})") from None
