"""What the target charges for a step: ms per verify batch of n tokens, and a checkpoint
target's rollback. One per target, shared by every draft source priced against it
(engine/draft_pricing.py): the batch a draft is verified in costs the same whoever
drafted it.

s(n), the verify + bookkeeping ms of a target batch of n tokens, is a moving average per
size actually decoded (n = drafted + 1). Between measured sizes it is interpolated,
beyond them extended by the slope of a weighted least-squares line over the measured
sizes, or, with one size measured, by ControllerSettings.prior_slope. At K = 0 only s(1)
is measured, and a load change moves every size alike, so each other size is kept
scaled by how s(1) moved since it was measured (unscaled, a slower machine made stale
big batches look cheap and drafting pay).

A pinned shape (pin_shape) fixes the curve's shape instead: s(n) = s(1) x shape(n), with
s(1) this machine's, measured by the first plain step as usual, and no other size learned
or calibrated. It is how a test states which machine's curve a choice is made on (tests/
fixtures/profiles): what adaptive K or auto picks is then a property of the code, not of
the CPU the suite runs on, while the draft clock and acceptance stay real.

Lazy (a cold start, no kept profile: the engine sets `lazy`): nothing is timed up front.
A size beyond the largest measured one is priced pessimistically, as if each extra token
cost a whole one-token step, so no draft pays on a guess. The controller also prices
under `optimistic()` (beyond the largest measured size, no dearer than it: the cheapest
any monotone curve could be); where a K would win there by a clear margin and not here,
its batch is `explore`d once: that step verifies it, and the verify's own timing
(observe) measures it. So each size is timed by the first real verify
that needs it, a timing that also decodes tokens, and no size is ever taken on a guess
twice. (Commit 89e04ea replaced a prior slope with up-front timing because decisions were
made on the prior; here a guess only ever buys one measured step.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from specdash.engine.controller_settings import ControllerSettings

# seed_costs' weight for a calibrated sample: it replaces what was there (clipped like
# any sample), since the engine measured it on purpose.
_REPLACE = 1.0


class Ema:
    """Exponential moving average that starts at its first sample; a sample more than
    `clip` times the average is clipped (another process stealing the CPU for one step
    should not triple the estimate), so a real change is followed within a few steps."""

    __slots__ = ("count", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.count = 0

    def add(self, x: float, beta: float, clip: float) -> None:
        if self.count == 0:
            self.value = x
        else:
            self.value += beta * (min(x, clip * self.value) - self.value)
        self.count += 1


class TargetCosts:
    """The target's step-cost curve s(n) and its rollback price. forget() drops them
    (a new target, or a new expert count)."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self._step_cost: dict[int, Ema] = {}
        # (save ms, restore ms, replay ms per n tokens) of a checkpoint target, else None
        self.rollback: tuple[float, float, dict[int, float]] | None = None
        # s(1) when each batch size was last measured (see the module docstring)
        self._s1_at: dict[int, float] = {}
        self._cost_cache: dict[int, float] = {}  # step_cost(n) until the next measurement
        self._shape: dict[int, float] | None = None  # pin_shape's s(n) / s(1); kept by forget()
        self.lazy = False  # a cold start: unmeasured sizes are timed when considered (docstring)
        self._optimistic = False  # inside optimistic(): beyond the measured sizes, no dearer
        self._explored: set[int] = set()  # sizes a step verified on hope, once each (explore)

    def pin_shape(self, verify_ms: dict[int, float]) -> None:
        """Fix the curve's shape to verify_ms's (ms per batch of n tokens on some machine,
        n = 1 among them): from now on only s(1) is learned, and every other size costs
        s(1) times its ratio there (interpolated and extended as measured sizes are)."""
        if verify_ms.get(1, 0.0) <= 0.0:
            raise ValueError("a pinned cost shape needs a positive cost for a batch of 1 token")
        self._shape = {n: v / verify_ms[1] for n, v in sorted(verify_ms.items())}
        for n in [n for n in self._step_cost if n != 1]:
            del self._step_cost[n]
        self._cost_cache.clear()

    @property
    def pinned(self) -> bool:
        return self._shape is not None

    def forget(self) -> None:
        self._step_cost.clear()
        self.rollback = None
        self._s1_at.clear()
        self._cost_cache.clear()
        self._explored.clear()

    # --- a cold start (lazy) --------------------------------------------------------------
    @contextmanager
    def optimistic(self) -> Iterator[None]:
        """Price sizes beyond the measured ones at the cheapest they could be (the largest
        measured size's cost) for the block: what would win if it were measured."""
        if not self.lazy:
            yield
            return
        self._optimistic, saved = True, self._cost_cache
        self._cost_cache = {}
        try:
            yield
        finally:
            self._optimistic, self._cost_cache = False, saved

    def explore(self, n: int) -> bool:
        """A decision would take a batch of n tokens if it were as cheap as it could be:
        whether to verify it once to find out (not when measured, or explored before)."""
        if not self.lazy or self._shape is not None or self.measured(n) or n in self._explored:
            return False
        self._explored.add(n)
        return True

    def exploring(self, n: int) -> bool:
        """Whether n was explored and is not measured yet (its step is about to run)."""
        return n in self._explored and not self.measured(n)

    # --- kept between runs (a cost profile) -----------------------------------------------
    def export(self) -> tuple[dict[int, float], dict[int, int]]:
        """(ms per measured batch size, at today's one-token cost; samples behind each):
        what a kept profile stores. Empty under a pinned shape (not this machine's)."""
        if self._shape is not None:
            return {}, {}
        sizes = sorted(n for n, e in self._step_cost.items() if e.count)
        return {n: self.known_cost(n) for n in sizes}, {n: self._step_cost[n].count for n in sizes}

    def load(self, ms: dict[int, float], samples: dict[int, int]) -> None:
        """A kept profile's costs, each weighing its sample count (capped like the fit's
        weights): one run's noise moves a well-measured size little, a new load quickly
        (the one-token scaling, see the module docstring)."""
        self.seed_costs(ms)
        for n in ms:
            self._step_cost[n].count = max(1, min(samples.get(n, 1), self.settings.fit_weight_cap))

    # --- measurements -------------------------------------------------------------------
    def needs_costs(self) -> bool:
        """No batch bigger than one token measured yet: seed_costs() would help (never with
        a pinned shape: its sizes are not measured)."""
        return self._shape is None and not any(n > 1 and e.count for n, e in self._step_cost.items())

    def seed_costs(self, ms: dict[int, float]) -> None:
        """Step costs measured up front (ms per target batch of n tokens): decisions are
        right from the first step instead of extrapolating from one batch size."""
        self._cost_cache.clear()
        if self._shape is not None:
            ms = {n: v for n, v in ms.items() if n == 1}
        for n, v in ms.items():
            self._step_cost.setdefault(n, Ema()).add(v, _REPLACE, self.settings.ema_clip)
        if 1 in ms:
            self._s1_at.update(dict.fromkeys(ms, ms[1]))

    def observe(self, n: int, ms: float) -> None:
        """One verify batch of n tokens took `ms` (verify and bookkeeping)."""
        if self._shape is not None and n != 1:
            return  # the shape is pinned: only the one-token scale is this machine's
        s1 = self.step_cost(1)  # before this sample: the load the batch ran at
        self._cost_cache.clear()
        if n > 1 and s1 and n in self._step_cost and self._s1_at.get(n):
            # Bring the old estimate to today's load before averaging the new sample in.
            self._step_cost[n].value *= s1 / self._s1_at[n]
        self._step_cost.setdefault(n, Ema()).add(ms, self.settings.beta, self.settings.ema_clip)
        if s1:
            self._s1_at[n] = s1

    def price_rollback(self, save_ms: float, restore_ms: float, replay_ms: dict[int, float]) -> None:
        """A checkpoint target's rollback, measured by the engine: the save before every
        drafting step, and on a rejection a restore plus a replay of the n kept tokens."""
        self.rollback = (save_ms, restore_ms, dict(replay_ms))

    def measured(self, n: int) -> bool:
        """Whether a batch of n tokens was measured (not only estimated)."""
        return n in self._step_cost

    # --- estimates ----------------------------------------------------------------------
    def step_cost(self, n: int) -> float | None:
        """Estimated verify + bookkeeping ms for a target batch of n tokens; None before
        any batch was measured."""
        # One choose() asks for ~40 sizes; the curve only changes when a step is observed.
        cost = self._cost_cache.get(n)
        if cost is None:
            cost = self._estimate_cost(n)
            if cost is not None:
                self._cost_cache[n] = cost
        return cost

    def known_cost(self, n: int) -> float:
        """step_cost(n) where costs are known to have been measured."""
        cost = self.step_cost(n)
        assert cost is not None, "no step cost measured yet"
        return cost

    def _estimate_cost(self, n: int) -> float | None:
        cost = self._curve_cost(n)
        if cost is None or not self.lazy or self._shape is not None:
            return cost
        sizes = [m for m, e in self._step_cost.items() if e.count]
        top = max(sizes)
        if n <= top:
            return cost
        # Beyond what was measured: optimistic, no dearer than the largest measured size;
        # else pessimistic, each extra token a whole one-token step (so it never wins
        # untimed). explore() is how a size gets out of here.
        if self._optimistic:
            return self._curve_cost(top)
        s1 = self._curve_cost(1) if 1 in sizes else None
        return (self._curve_cost(top) or 0.0) + (n - top) * (s1 or cost / n)

    def _curve_cost(self, n: int) -> float | None:
        e1 = self._step_cost.get(1)
        s1 = e1.value if e1 is not None and e1.count else 0.0
        if self._shape is not None:
            if not s1:
                return None
            sizes = list(self._shape)
            cost = {m: s1 * r for m, r in self._shape.items()}
        else:
            sizes = sorted(m for m, e in self._step_cost.items() if e.count)
            if not sizes:
                return None
            cost = {m: self._step_cost[m].value * (s1 / self._s1_at[m] if m > 1 and s1 and self._s1_at.get(m) else 1.0)
                    for m in sizes}
        if n in cost:
            return cost[n]
        if sizes[0] < n < sizes[-1]:
            hi = next(m for m in sizes if m > n)
            lo = max(m for m in sizes if m < n)
            return cost[lo] + (cost[hi] - cost[lo]) * (n - lo) / (hi - lo)
        slope = self._slope(sizes, cost)
        edge = sizes[-1] if n > sizes[-1] else sizes[0]
        return max(cost[edge] + slope * (n - edge), self.settings.extrapolation_floor * cost[edge])

    def _slope(self, sizes: list[int], cost: dict[int, float]) -> float:
        prior_slope = self.settings.prior_slope
        if len(sizes) == 1:
            (m,) = sizes
            unit = cost[m] / (1.0 + prior_slope * (m - 1))
            return prior_slope * unit
        cap = self.settings.fit_weight_cap
        # A pinned shape's points weigh alike: they are one machine's curve, not samples.
        w = {m: 1 if self._shape is not None else min(self._step_cost[m].count, cap) for m in sizes}
        sw = sum(w.values())
        mx = sum(w[m] * m for m in sizes) / sw
        my = sum(w[m] * cost[m] for m in sizes) / sw
        var = sum(w[m] * (m - mx) ** 2 for m in sizes)
        cov = sum(w[m] * (m - mx) * (cost[m] - my) for m in sizes)
        return max(cov / var, 0.0)  # a bigger batch never costs less; noise can say so

    def rollback_cost(self, a: float, k: int) -> float:
        """Expected ms a checkpoint target spends taking back a K-token draft at per-token
        acceptance a: the save, and for each first rejection at j < K (probability
        a^j (1 - a)) a restore and a replay of j + 1 tokens. 0 for other targets."""
        return self.rollback_cost_curve([a ** j for j in range(k + 1)], [1.0 - a] * (k + 2), k)

    def rollback_cost_curve(self, survival: list[float], hazard: list[float], k: int) -> float:
        """rollback_cost with the first rejection at j + 1 having probability
        survival[j] * hazard[j + 1] (a draft source's own acceptance curve)."""
        if self.rollback is None or k <= 0:
            return 0.0
        save, restore, replay = self.rollback
        return save + sum(survival[j] * hazard[j + 1] * (restore + _interpolate(replay, j + 1)) for j in range(k))


def _interpolate(points: dict[int, float], n: int) -> float:
    """points[n], linear between measured sizes, extended by the last segment's slope
    beyond them (a replay's cost grows about linearly with its tokens)."""
    if n in points:
        return points[n]
    sizes = sorted(points)
    if len(sizes) == 1:
        return points[sizes[0]] * n / sizes[0]
    lo, hi = (sizes[-2], sizes[-1]) if n > sizes[-1] else (sizes[0], sizes[1]) if n < sizes[0] else (
        max(m for m in sizes if m < n), min(m for m in sizes if m > n))
    return max(points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo), 0.0)
