"""Where adaptive K loses to the oracle, read off the texts whatif_controller.py cached.

    python benchmarks/whatif_controller.py --tokens 384 --cache /tmp/tr384.pkl   # once: generates the texts
    python benchmarks/whatif_traces.py trace /tmp/tr384.pkl x-refactor gpu-like   # adaptive's steps vs the oracle's
    python benchmarks/whatif_traces.py hazard /tmp/tr384.pkl                      # rejection rate by draft position
    python benchmarks/whatif_traces.py classes /tmp/tr384.pkl mixed               # best K per content class

trace: the oracle's fixed K and its (drafted, accepted) per step, then adaptive K's steps
with the controller's reasons. hazard: at a fixed K, P(token j rejected | tokens before it
accepted) per prompt and pooled; a falling curve means drafts that start well go on well.
classes: the best fixed K for each content class in hindsight, against the best single K
and adaptive K (the headroom a per-class K could win on a mixed text).
"""

from __future__ import annotations

import argparse
import pickle

from specdash.engine.controller import CostModelController
from specdash.engine.drafters.base import NoDrafter
from specdash.engine.settings import EngineSettings
from specdash.costs.profile import load_profile
from specdash.tuning.whatif.simulate import SimResult, make_drafter, simulate

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def _settings(tr) -> EngineSettings:
    return EngineSettings(target=TARGET, draft=DRAFT, threads=1, ctx=2048, max_tokens=tr.max_tokens, k_max=32)


def _fixed(tr, kind: str, profile, k: int) -> SimResult:
    base = _settings(tr)
    return simulate(tr, make_drafter(kind, tr, profile, base), profile, base, name=kind, k=k)


def _adaptive(tr, kind: str, profile) -> SimResult:
    base = _settings(tr)
    return simulate(tr, make_drafter(kind, tr, profile, base), profile, base, name=kind,
                    controller=CostModelController(k_min=0, k_max=32, k_init=4))


def trace(trs: dict, name: str, profile_name: str, kind: str, steps: int) -> None:
    tr, profile = trs[name], load_profile(profile_name)
    base = _settings(tr)
    plain = simulate(tr, NoDrafter(), profile, base, name="none", k=0)
    best = max((_fixed(tr, kind, profile, k) for k in range(1, 33)), key=lambda r: r.tokens_per_s)
    ad = _adaptive(tr, kind, profile)
    print(f"{name} on {profile_name}, {tr.n_generated} tokens: plain {plain.tokens_per_s:.2f} tok/s, oracle K={best.k} "
          f"{best.tokens_per_s:.2f}, adaptive {ad.tokens_per_s:.2f} ({ad.tokens_per_s / best.tokens_per_s:.3f} of the oracle)")
    print("oracle (drafted, accepted):", [(t[1], t[2]) for t in best.trace][:steps])
    for i, (k, drafted, accepted, why, source) in enumerate(ad.trace[:steps]):
        print(f"{i:3d} K={k:2d} drafted {drafted:2d} accepted {accepted:2d} {source:8s} {why}")


def hazard(trs: dict, profile_name: str, kind: str, k: int) -> None:
    profile = load_profile(profile_name)
    reached_all, rejected_all = [0] * (k + 1), [0] * (k + 1)
    for name, tr in trs.items():
        reached, rejected = [0] * (k + 1), [0] * (k + 1)
        for _, drafted, accepted, _, _ in _fixed(tr, kind, profile, k).trace:
            for j in range(1, min(accepted + 1, drafted) + 1):
                reached[j] += 1
            if accepted < drafted:
                rejected[accepted + 1] += 1
        reached_all = [a + b for a, b in zip(reached_all, reached)]
        rejected_all = [a + b for a, b in zip(rejected_all, rejected)]
        print(f"{name:16s}", " ".join(f"{rejected[j] / reached[j]:.2f}" if reached[j] else "  - " for j in range(1, k + 1)))
    print(f"{'pooled':16s}", " ".join(f"{rejected_all[j] / reached_all[j]:.2f}" for j in range(1, k + 1)))
    print(f"{'drafts reaching':16s}", " ".join(str(n) for n in reached_all[1:]))


def classes(trs: dict, name: str, profiles: list[str], kind: str) -> None:
    tr = trs[name]
    for profile_name in profiles:
        profile = load_profile(profile_name)
        runs = {k: _fixed(tr, kind, profile, k) for k in range(1, 33)}
        best = max(runs.values(), key=lambda r: r.tokens_per_s)
        labels = sorted({label for r in runs.values() for label in r.per_class})
        # Each class at its own best K (tokens / ms within that class's steps).
        rate = {label: max((r.per_class[label][0] / r.per_class[label][1], k) for k, r in runs.items()
                           if label in r.per_class and r.per_class[label][1] > 0) for label in labels}
        tokens = {label: best.per_class.get(label, [0.0, 0.0])[0] for label in labels}
        per_class = sum(tokens.values()) / sum(tokens[label] / rate[label][0] for label in labels) * 1e3
        ad = _adaptive(tr, kind, profile)
        print(f"{name} on {profile_name}: best fixed K={best.k} {best.tokens_per_s:.2f} tok/s; each class at its best K "
              f"{per_class:.2f} ({per_class / best.tokens_per_s:.3f}x); adaptive {ad.tokens_per_s:.2f} "
              f"({ad.tokens_per_s / best.tokens_per_s:.3f}x)")
        for label in labels:
            got = ad.per_class.get(label)
            mine = f"{got[0] / got[1] * 1e3:.2f}" if got and got[1] else "-"
            print(f"   {label}: {int(tokens[label])} tokens, best K={rate[label][1]} at {rate[label][0] * 1e3:.2f} tok/s, "
                  f"adaptive {mine} tok/s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("trace")
    t.add_argument("cache")
    t.add_argument("prompt")
    t.add_argument("profile")
    t.add_argument("--steps", type=int, default=40)
    h = sub.add_parser("hazard")
    h.add_argument("cache")
    h.add_argument("--profile", default="epyc-32b")
    h.add_argument("--k", type=int, default=16)
    c = sub.add_parser("classes")
    c.add_argument("cache")
    c.add_argument("prompt")
    c.add_argument("--profiles", default="epyc-32b,gpu-like")
    for p in (t, h, c):
        p.add_argument("--drafter", default=DRAFT, help="lookup, suffix, chain or the draft model (default)")
    args = ap.parse_args(argv)
    with open(args.cache, "rb") as f:
        trs = pickle.load(f)
    if args.what == "trace":
        trace(trs, args.prompt, args.profile, args.drafter, args.steps)
    elif args.what == "hazard":
        hazard(trs, args.profile, args.drafter, args.k)
    else:
        classes(trs, args.prompt, args.profiles.split(","), args.drafter)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
