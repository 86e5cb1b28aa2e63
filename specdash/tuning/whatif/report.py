"""The what-if report: a table per drafter (predicted tok/s, acceptance, mean accepted
length, steps for each K), the oracle best, adaptive K beside it, the default (`auto`)
against the best fixed (drafter, K) chosen without hindsight (crossval.py) and against
the oracle, and the best K per content class; as text and as JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdash.tuning.whatif.crossval import CrossVal
from specdash.costs.profile import Profile
from specdash.tuning.whatif.simulate import SimResult
from specdash.tuning.whatif.transcript import Transcript

AUTO = "auto"  # the default draft source (engine/drafters/auto.py): simulated adaptive only


@dataclass
class Report:
    transcript: Transcript
    profile: Profile
    plain: SimResult
    fixed: list[SimResult]
    adaptive: list[SimResult]
    # The best fixed (drafter, K) chosen without hindsight, to judge auto by; None when
    # auto was not simulated.
    crossval: CrossVal | None = None

    @property
    def auto(self) -> SimResult | None:
        return next((r for r in self.adaptive if r.drafter == AUTO), None)

    def auto_ratios(self) -> dict[str, float] | None:
        """auto's tok/s over the cross-validated fixed choice's and over the oracle's, each
        counting its draft model's prompt feed (SimResult.tokens_per_s_with_feed): auto
        feeds its model the prompt inside decoding and only when it uses the model, a
        fixed draft model is fed it in the prefill; leaving that out would charge auto
        for what the fixed choice gets free."""
        auto = self.auto
        if auto is None:
            return None
        out = {"vs_oracle": auto.tokens_per_s_with_feed / self.best_with_feed.tokens_per_s_with_feed}
        if self.crossval is not None and self.crossval.tokens_per_s > 0:
            out["vs_cross_validated"] = auto.tokens_per_s_with_feed / self.crossval.tokens_per_s
        return out

    @property
    def best_with_feed(self) -> SimResult:
        """The oracle as auto is judged against it: the prompt feed counted."""
        return max([*self.fixed, self.plain], key=lambda r: r.tokens_per_s_with_feed)

    @property
    def best(self) -> SimResult:
        """The oracle: the fastest fixed (drafter, K) on this text, plain decoding (K=0)
        included: where no draft pays, the oracle does not draft."""
        return max([*self.fixed, self.plain], key=lambda r: r.tokens_per_s)

    def drafters(self) -> list[str]:
        return list(dict.fromkeys(r.drafter for r in self.fixed))

    def best_per_class(self) -> dict[str, dict[str, Any]]:
        """Per content label: the fastest fixed (drafter, K) over that label's steps."""
        labels = sorted({label for r in self.fixed for label in r.per_class})
        out: dict[str, dict[str, Any]] = {}
        for label in labels:
            rows = [(r, r.per_class[label]) for r in self.fixed if label in r.per_class and r.per_class[label][1] > 0]
            if not rows:
                continue
            tps = lambda row: row[1][0] / row[1][1] * 1e3  # noqa: E731
            r, _ = max(rows, key=tps)
            plain = self.plain.per_class.get(label)
            by_drafter = {}
            for name in self.drafters():
                mine = [row for row in rows if row[0].drafter == name]
                if mine:
                    rb, _ = max(mine, key=tps)
                    by_drafter[name] = {"k": rb.k, "tokens_per_s": tps((rb, rb.per_class[label]))}
            out[label] = {"drafter": r.drafter, "k": r.k, "tokens_per_s": tps((r, r.per_class[label])),
                          "tokens": int(r.per_class[label][0]),
                          "plain_tokens_per_s": plain[0] / plain[1] * 1e3 if plain and plain[1] else None,
                          "best_k_by_drafter": by_drafter}
        return out

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "profile": self.profile.to_json(),
            "transcript": self.transcript.to_json(),
            "plain": self.plain.to_json(),
            "oracle": {"drafter": best.drafter, "k": best.k, "tokens_per_s": best.tokens_per_s},
            "fixed": [r.to_json() for r in self.fixed],
            "adaptive": [r.to_json(trace=True) for r in self.adaptive],
            "per_class": self.best_per_class(),
            "cross_validated": self.crossval.to_json() if self.crossval is not None else None,
            "auto": self.auto_json(),
        }

    def auto_json(self) -> dict[str, Any] | None:
        auto = self.auto
        if auto is None:
            return None
        return {**auto.to_json(), "drafted_by": sources(auto), **(self.auto_ratios() or {})}

    def text(self) -> str:
        tr, prof, plain = self.transcript, self.profile, self.plain
        best = self.best
        out = [f"what-if on {tr.n_generated} greedy tokens of {tr.target}; profile {prof.name}"
               + (f" ({prof.note})" if prof.note else ""),
               f"plain decoding: {plain.tokens_per_s:.2f} tok/s predicted"
               + (f", {tr.plain['tokens_per_s']:.2f} measured here" if tr.plain.get("tokens_per_s") else "")
               + ("  <- oracle best: no drafter and K beats it" if best is plain else "")]
        ties = tr.near_ties()
        if any(ties.values()):
            out.append("near-ties (top-two gap < 0.5 logits; a real run may differ there): "
                       + "; ".join(f"{name} at {len(pos)} positions" for name, pos in ties.items() if pos))
        for name in self.drafters():
            out.append("")
            out.append(f"{name}:")
            out.append(f"  {'K':>8} {'tok/s':>8} {'vs plain':>8} {'accept':>7} {'mean len':>8} {'steps':>6}")
            rows = [r for r in self.fixed if r.drafter == name]
            rows += [r for r in self.adaptive if r.drafter == name]
            for r in rows:
                acc = "-" if r.acceptance is None else f"{r.acceptance:.1%}"
                mark = "  <- oracle best" if r is best else ""
                k = "adaptive" if r.k is None else str(r.k)
                out.append(f"  {k:>8} {r.tokens_per_s:8.2f} {r.tokens_per_s / plain.tokens_per_s:7.2f}x "
                           f"{acc:>7} {r.mean_accepted_length:8.2f} {r.steps:6d}{mark}")
            ad = next((r for r in self.adaptive if r.drafter == name), None)
            top = max([*(rows[:-1] if ad else rows), plain], key=lambda r: r.tokens_per_s)
            if ad is not None:
                out.append(f"  adaptive / best fixed (K={top.k}{', plain' if top is plain else ''}): "
                           f"{ad.tokens_per_s / top.tokens_per_s:.2f}")
        out.extend(self.auto_text())
        out.append("")
        if best is plain:
            out.append(f"oracle best: plain decoding (K=0), {plain.tokens_per_s:.2f} tok/s: no drafter and K pays here")
        else:
            out.append(f"oracle best: {best.drafter} at K={best.k}: {best.tokens_per_s:.2f} tok/s, "
                       f"{best.tokens_per_s / plain.tokens_per_s:.2f}x plain")
        per = self.best_per_class()
        if per:
            out.append("best K per content class (over that class's steps):")
            for label, row in per.items():
                drafters = ", ".join(f"{d} K={v['k']}" for d, v in row["best_k_by_drafter"].items())
                out.append(f"  {label:>6} ({row['tokens']} tokens): {row['drafter']} K={row['k']} "
                           f"{row['tokens_per_s']:.2f} tok/s; by drafter: {drafters}")
        return "\n".join(out)

    def auto_text(self) -> list[str]:
        auto, ratios = self.auto, self.auto_ratios()
        if auto is None or ratios is None:
            return []
        plain, best = self.plain, self.best_with_feed
        oracle = "plain" if best is plain else f"{best.drafter} K={best.k}"
        out = ["", "auto (the default: each step the fastest of the copies, the draft model and plain decoding, "
               "adaptive K):",
               f"  {auto.tokens_per_s:.2f} tok/s, {auto.tokens_per_s / plain.tokens_per_s:.2f}x plain; steps by "
               "source: " + ", ".join(f"{name} {n}" for name, n in sources(auto).items()),
               "  judged with each run's draft-model prompt feed counted (in the prefill for a fixed "
               f"drafter, inside decoding for auto): auto {auto.tokens_per_s_with_feed:.2f} tok/s"]
        cv = self.crossval
        if cv is not None and "vs_cross_validated" in ratios:
            out.append(f"  auto / best fixed (drafter, K) chosen without hindsight ({cv.describe()}: "
                       f"{cv.tokens_per_s:.2f} tok/s): {ratios['vs_cross_validated']:.2f}")
        out.append(f"  auto / oracle ({oracle}, chosen with hindsight: {best.tokens_per_s_with_feed:.2f} tok/s): "
                   f"{ratios['vs_oracle']:.2f}")
        return out


def sources(run: SimResult) -> dict[str, int]:
    """How many steps each source drafted in a run (none: plain steps)."""
    out: dict[str, int] = {}
    for step in run.trace:
        out[step[4]] = out.get(step[4], 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
