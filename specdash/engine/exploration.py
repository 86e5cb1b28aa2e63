"""The exploration budget: what adaptive K tried on hope and lost is not tried again in
the same request until the evidence for it changes.

Some of adaptive K's copies rest on a prior, not on measurements: a copy whose match
length has almost no measured trials (its bucket's price is the prior's), or one verified
in a batch size never timed (a cold start prices it as hoped). Each is an exploration,
judged when its step is observed: it lost when its accepted tokens plus the target's own
took longer than that many plain steps would have. A lost exploration is not repeated in
the request while the evidence is the same: the source's bucket waits for a longer match
than the one that lost, or another kind of text (the content label). The longest bucket
(32+ matching tokens) is never an exploration: no longer match could lift its block.

The draft model's probes from K = 0 are not kept here: they are already paid from a
budget of their own (ControllerSettings.probe_budget, 1.5% of the time at K = 0), and a
text that turns predictable later in the same request must still be found.

Kept per request (CostModelController.new_prompt starts a new one) and told in the
reason line: "explored 3, 2 lost".
"""

from __future__ import annotations

from specdash.engine.draft_pricing import CopyPricing


class ExplorationBudget:
    def __init__(self) -> None:
        self._lost: dict[tuple[str, int], int] = {}  # (source, bucket) -> longest match that lost
        self._pending: set[tuple[str, int]] = set()  # (source, evidence): this step's explorations, if they draft
        self._content: str | None = None
        self.explored = 0
        self.lost_count = 0

    @staticmethod
    def _key(source: str, evidence: int) -> tuple[str, int]:
        return (source, CopyPricing.bucket(evidence))

    def look(self, content: str) -> None:
        """The step's content label: new text is new evidence for everything that lost."""
        if content != self._content:
            if self._content is not None:
                self._lost.clear()
            self._content = content

    def lost(self, source: str, evidence: int) -> bool:
        """Whether exploring `source` after a match of `evidence` tokens lost in this
        request on the same evidence or better."""
        at = self._lost.get(self._key(source, evidence))
        return at is not None and evidence <= at

    def trying(self, source: str, evidence: int) -> None:
        """This step's draft, if it is `source`'s, explores."""
        self._pending.add((source, evidence))

    def judge(self, source: str, evidence: int, drafted: int, accepted: int,
              plain_ms: float | None, step_ms: float) -> None:
        """A step observed: if it was the pending exploration, count it, and keep it as
        lost when it took longer than its tokens' plain steps."""
        pending, self._pending = self._pending, set()
        if (source, evidence) not in pending or drafted <= 0 or not plain_ms:
            return
        self.explored += 1
        if (accepted + 1) * plain_ms >= step_ms or CopyPricing.longest(evidence):
            return  # it paid; or no longer match could ever lift the block
        key = self._key(source, evidence)
        self._lost[key] = max(self._lost.get(key, 0), evidence)
        self.lost_count += 1

    def why(self) -> str:
        """A clause for the reason line, "" before anything was explored."""
        return f"; explored {self.explored}, {self.lost_count} lost" if self.explored else ""
