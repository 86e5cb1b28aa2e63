#!/usr/bin/env python
"""The draft model with and without its joint confidence cut, paired round by round.

    python benchmarks/experiments/draft_joint_cut_ab.py --ks 4,16 --rounds 3 --tokens 64 \
        --out benchmarks/results/draft-p-joint-ab.txt

draft_p_joint stops a draft where the product of the draft model's top probabilities
falls below it (engine/drafters/draft_model.py, JointCut). Arms: "cut" at --p-joint (the
default setting, 0.1) and "no-cut" (0). One Session per K (the default draft pair, fixed
K, greedy) holds both models; the arms set the cut between runs with the engine's own
command (SetCut, the dashboard's `c`) and alternate order from round to round and prompt
to prompt.

Per run and report: benchmarks/experiments/ab_arms.py.
"""

from __future__ import annotations

import sys

from ab_arms import parser, run  # benchmarks/experiments/ is sys.path[0]

from specdash.contract import events as E
from specdash.engine.drafters.base import model_price
from specdash.engine.settings import LIMIT, EngineSettings
from specdash.sources.session import Session

DEFAULT_PROMPTS = "code-generation,code-edit,summarization,json-extraction,edit-js-module,summarize-postmortem," \
                  "dialogue-support"


def arm(p_joint: float):
    def put(session: Session) -> None:
        session.send(E.SetCut(p_joint))
        refused = [ev.message for ev in session.apply_pending() if isinstance(ev, E.NoticeEvent)]
        assert not refused and session.settings.draft_p_joint == p_joint, refused
        # A draft model's cut makes K a ceiling: the drafter took it, not just the settings.
        assert model_price(session.engine.drafter)[1] is (p_joint > 0), session.engine.drafter.label
    return put


def main() -> int:
    ap = parser(__doc__, DEFAULT_PROMPTS, "4,16")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--p-joint", type=float, default=LIMIT["draft_p_joint"].default,
                    help="the cut arm's draft_p_joint (default: the setting's default)")
    args = ap.parse_args()
    if not 0 < args.p_joint <= 1:
        print(f"--p-joint {args.p_joint}: must be in (0, 1]", file=sys.stderr)
        return 2
    return run(args, {"cut": arm(args.p_joint), "no-cut": arm(0.0)},
               lambda k: EngineSettings(target=args.target, draft=args.draft, k=k, adaptive=False,
                                        threads=args.threads, ctx=4096, max_tokens=args.tokens),
               f"draft model with and without draft_p_joint {args.p_joint:g}", "draft_joint_cut_ab.py")


if __name__ == "__main__":
    sys.exit(main())
