"""`speculation not paying` on the real embedded engine: SmolLM2-135M as target, drafted
for by Gemma-3-270M (twice its size, another vocabulary: every draft is translated), at a
fixed K=4. The engine's leading K=0 steps (as the dashboard runs them) give the plain
rate; speculating with a draft bigger than the target is slower than that, and the rule
says so with what it read. Greedy, so the text is the same as plain decoding's."""

from __future__ import annotations

import re

from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.monitor.health import HealthMonitor, HealthThresholds
from specdash.sources.session import Session
from specdash.tui.live_stats import LiveStats

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def test_a_draft_bigger_than_its_target_is_not_paying(smol_path, gemma_path) -> None:
    settings = EngineSettings(target=str(smol_path), draft=str(gemma_path), k=4, adaptive=False, threads=2,
                              ctx=1024, max_tokens=160, draft_p_joint=0.0)
    session = Session(settings)
    session.engine.calibrate_steps = 24  # plain decoding first, as the dashboard does (its reference)
    monitor = HealthMonitor(HealthThresholds(reading_seconds=1.0, recent=3, plain_steps=8))
    stats = LiveStats()  # what the dashboard draws its plain reference line from
    emitted: list[E.Event] = []
    try:
        for ev in session.run(PROMPT):
            emitted += monitor.feed(ev)
            stats.feed(ev)
    finally:
        session.close()
    rule = next(r for r in monitor.current.rules if r.name == "speculation_not_paying")
    assert rule.state == "alarm", (rule, monitor.current)
    assert rule.value is not None and rule.reference is not None and rule.value < 0.9 * rule.reference
    # The rule's plain rate is the one the tok/s chart's reference line shows: one estimator.
    assert rule.reference == stats.plain_tokens_per_s
    m = re.fullmatch(r"(\S+) tok/s drafting, plain (\S+) tok/s \((\S+)x\) over (\d+) s", rule.message)
    assert m, rule.message
    assert monitor.current.verdict in ("losing", "stalled", "collapse")  # losing unless worse
    notices = [ev for ev in emitted if isinstance(ev, E.NoticeEvent)]
    assert any("health: speculation not paying: " in n.message for n in notices)
