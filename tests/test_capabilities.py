"""What the engine takes and what drafts for it are each written once, and every reader
follows: the engine's command names (engine/supports.py) are the commands its `_apply`
handles and what the embedded source declares before loading; the drafter kinds
(engine/drafters/kinds.py) are what a session builds, what whatif simulates and what the
exactness fuzzer swaps to and checks, so a kind registered there alone is run, simulated
and fuzzed. On SmolLM2-135M, really decoding."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import sys
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from specdash.contract import events as E
from specdash.contract.vocabulary import COMMAND_NAMES
from specdash.engine import supports
from specdash.engine.drafters import KINDS, MODEL_SOURCES, Draft, Drafter
from specdash.engine.drafters.kinds import DrafterKind, register, unregister
from specdash.engine.engine import Engine
from specdash.engine.settings import EngineSettings, SamplingParams
from specdash.sources import embedded
from specdash.sources.embedded import EmbeddedSource, PromptQueue, WorkItem

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fuzz_exact", ROOT / "benchmarks" / "fuzz_exact.py")
assert _spec is not None and _spec.loader is not None
F = sys.modules.get("fuzz_exact") or importlib.util.module_from_spec(_spec)
if "fuzz_exact" not in sys.modules:
    sys.modules["fuzz_exact"] = F
    _spec.loader.exec_module(F)

TOKENS = 24


@pytest.fixture(scope="module")
def pair(smol_path):
    """SmolLM2-135M with no draft model: the fuzzer's pair, whose session every test shares."""
    return F.Pair("kinds", str(smol_path), None, ctx=512)


@pytest.fixture(scope="module")
def session(pair):
    s = pair.session(TOKENS)
    yield s
    s.close()


# --- the engine's command names ------------------------------------------------------------


def _applied_types() -> set[type]:
    """The command types `Engine._apply` has a case for, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Engine._apply)))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.match_case):
            patterns = node.pattern.patterns if isinstance(node.pattern, ast.MatchOr) else [node.pattern]
            for p in patterns:
                if isinstance(p, ast.MatchClass) and isinstance(p.cls, ast.Attribute):
                    found.add(getattr(E, p.cls.attr))
    return found


def test_the_engines_command_names_are_the_commands_its_apply_handles():
    names = {COMMAND_NAMES[t] for t in _applied_types()}
    assert names == set(supports.ALWAYS) | set(supports.WHEN_ABLE), \
        f"_apply handles {sorted(names)}; engine/supports.py lists {sorted(supports.ALWAYS + supports.WHEN_ABLE)}"
    assert not set(supports.ALWAYS) & set(supports.WHEN_ABLE)


class Lent:
    """The shared session, lent to an EmbeddedSource: its close() leaves the session open."""

    def __init__(self, session):
        self.session = session

    def run(self, prompt: str, max_tokens: int | None = None):
        return self.session.run(prompt, max_tokens)

    def send(self, cmd: E.Command) -> None:
        self.session.send(cmd)

    def apply_pending(self):
        return self.session.apply_pending()

    def close(self) -> None:
        pass


def test_the_embedded_source_declares_what_its_engine_then_lists(session):
    """Before loading, EmbeddedSource.supports (derived from engine/supports.py) says what
    the engine will take; a dense target's first settings event lists exactly that."""
    events: list[E.Event] = []
    got = threading.Event()

    def emit(ev: E.Event) -> None:
        events.append(ev)
        if isinstance(ev, E.SettingsEvent):
            got.set()

    prompts = PromptQueue()
    prompts.push(WorkItem("t", "Count to five.", max_tokens=2))
    source = EmbeddedSource(lambda settings, progress: Lent(session), session.settings, prompts)
    source.start(emit)
    try:
        assert got.wait(60), events
    finally:
        source.close()
        assert source.thread is not None
        source.thread.join(60)  # the session is shared: its run must be over, not only abandoned
        assert not source.thread.is_alive()
    settings = next(ev for ev in events if isinstance(ev, E.SettingsEvent))
    assert session.expert_info() is None  # dense: no experts to take
    assert set(settings.supports) == EmbeddedSource.supports
    engine_own = set(settings.supports) - set(embedded.SUPPORTS)
    assert set(supports.ALWAYS) <= engine_own <= set(supports.ALWAYS) | set(supports.WHEN_ABLE)
    assert "experts" in settings.unavailable


# --- the drafter kinds ---------------------------------------------------------------------


class Repeat:
    """A drafter kind no reader knows: it drafts the last token again, K times."""

    name = label = "repeat"
    free = True
    relative_cost: float | None = 0.0
    k_ceiling = False

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        return Draft([tokens[-1]] * k, None, self.name) if k > 0 else Draft.empty()

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        return 0.0

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0

    def prefill(self, tokens: Sequence[int]) -> None:
        pass

    def reset(self) -> None:
        pass

    def forget(self) -> None:
        pass

    def set_cut(self, p_joint: float) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def repeat():
    kind = register(DrafterKind("repeat", "the last token again (a test's kind)",
                                lambda parts: parts.free(Repeat()), frozenset({"repeat"})))
    try:
        yield kind
    finally:
        unregister("repeat")
    assert "repeat" not in KINDS


def _transcript(seq: list[int]):
    from specdash.tuning.whatif.transcript import Transcript

    return Transcript(prompt=[1, 2, 3], seq=seq, n_generated=len(seq), eos=False, max_tokens=len(seq), n_ctx=512,
                      n_batch=512, pieces=[b"x"] * len(seq), prompt_text="x y z", target="t")


def test_every_kind_drafts_only_as_its_declared_sources():
    """Built as whatif builds them (with a simulated draft model), a kind's parts are the
    sources it declares; the fuzzer checks every step against that declaration."""
    from specdash.costs.profile import load_profile
    from specdash.tuning.whatif.simulate import make_drafter
    from specdash.tuning.whatif.transcript import Forced

    tr = _transcript([5, 5, 5, 6])
    n = len(tr.seq) + 1
    from specdash.tuning.whatif.head import HeadChains

    chains = [[5, 6]] * n  # the MTP head's proposals from each position (whatif/head.py)
    tr = dataclasses.replace(tr, draft=Forced(np.array(tr.seq + [7]), np.ones(n), np.ones(n)), draft_name="d",
                             head=HeadChains(chains, [[0.9, 0.9]] * n, 2, 0.1))
    profile, s = load_profile("ci-box"), EngineSettings(target="t", draft="lookup")
    for name, kind in KINDS.items():
        drafter = make_drafter(name, tr, profile, s)
        names = {p.name for p in drafter.parts()}
        if kind.drafts:
            assert names <= kind.sources, f"{name}: parts {names}, declared {set(kind.sources)}"
            assert kind.uses_model == bool(names & MODEL_SOURCES), name
        else:
            assert not drafter.propose(tr.full, 4, SamplingParams(), None).tokens, f"{name} drafted"
    assert make_drafter("some.gguf", tr, profile, s).name in MODEL_SOURCES


def test_a_kind_registered_alone_is_run_by_a_session(repeat, session):
    session.send(E.SetDrafter("repeat"))
    session.send(E.SetK(3))
    try:
        events = list(session.run("Say the word buffalo eight times.", 16))
    finally:
        session.send(E.SetDrafter("lookup"))
        list(session.apply_pending())
    steps = [ev for ev in events if isinstance(ev, E.StepEvent)]
    assert steps and {ev.drafter for ev in steps} <= {"repeat", "none"}
    assert any(ev.drafter == "repeat" and ev.drafted == 3 for ev in steps)


def test_a_kind_registered_alone_is_simulated_by_whatif(repeat):
    from specdash.commands.whatif import _kinds, default_kinds
    from specdash.costs.profile import load_profile
    from specdash.tuning.whatif.simulate import make_drafter, simulate

    assert "repeat" in default_kinds() and _kinds("lookup,repeat") == ["lookup", "repeat"]
    tr = _transcript([7, 7, 7, 7, 8, 8, 8, 8, 9])
    s = EngineSettings(target="t", draft="lookup")
    profile = load_profile("ci-box")
    res = simulate(tr, make_drafter("repeat", tr, profile, s), profile, s, name="repeat", k=3)
    # After the prompt's 3: 3,3,3 is rejected (7 committed); from 7, 7,7,7 is accepted
    # (then 8); from 8, 8,8,8 is accepted (then 9, the end of the text).
    assert [(k, drafted, acc, src) for k, drafted, acc, _, src in res.trace] == [
        (3, 3, 0, "repeat"), (3, 3, 3, "repeat"), (3, 3, 3, "repeat")]


def test_a_kind_registered_alone_is_fuzzed(repeat, pair, session, near_ties):
    assert "repeat" in pair.drafters
    tokens = {t for seed in range(24) for line in F.make_schedule(seed, pair, TOKENS).lines for t in line.split()}
    assert "draft=repeat" in tokens  # the schedules swap to it
    assert F.may_draft("repeat") == {"repeat"}
    reference = F.Reference(pair)
    try:
        schedule = F.FuzzSchedule(0, "kinds", pair.prompts[0], F.Start(k=4, draft="lookup", adaptive=False),
                                  ["2: draft=repeat k=3", "8: draft=suffix", "12: draft=repeat"])
        result = F.run_schedule(session, reference, pair, schedule, TOKENS)
    finally:
        reference.close()
    assert result.ok, result.report()  # its steps checked against what it declares
    assert result.sources["repeat"] > 0
