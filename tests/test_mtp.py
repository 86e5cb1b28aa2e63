"""The target's own multi-token-prediction head drafts (`mtp`, issue 33), exactly.

On a random-weight qwen35 with one MTP head (tests/fixtures/mtp_gguf.py; hybrid gated
delta net + attention, so rejected drafts are taken back with recurrent-state snapshots,
or with a checkpoint + replay when snapshots are forced off):

- greedy speculation with the head commits plain decoding's tokens at K = 1, 2, 4 and
  the largest K, alone and after lookup in the chain, with accepted AND rejected drafted
  tokens (a run where every draft held or none did never tested the way back);
- after each verify the head drafts what a fresh head would from the committed tokens
  alone: its state took the accepted position's hidden row and lost the rejected tail
  (and the check catches a head fed the wrong row);
- the peer check: llama-server `--spec-type draft-mtp --spec-draft-n-max K` on the same
  fixture and prompt writes the same text with the same drafted and accepted counts;
- fail soft: no head, a head not loaded, a missing staging symbol each give a one-line
  reason, and the other drafters go on working.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import specdash.sources.session as session_module
from cli_helpers import assert_ok, assert_usage_error, specdash
from test_engine_exact import plain_greedy
from specdash.contract import events as E
from specdash.engine.controller import CostModelController
from specdash.engine.drafters.mtp import HIDE_ENV, MtpDrafter, MtpUnavailable
from specdash.engine.engine import Engine
from specdash.engine.llm import LLM
from specdash.engine.settings import K_CAP, EngineSettings, SamplingParams
from specdash.sources.session import Session

TIE_GAP = 0.5  # logits; the exactness tests' threshold (tests/test_engine_exact.py)
N_TOKENS = 64
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
KS = (1, 2, 4, K_CAP)
GREEDY = SamplingParams(0.0, 0, 1.0)


def teacher_forced_gaps(llm: LLM, prompt: list[int], tokens: list[int]) -> list[tuple[int, float]]:
    """For each token: the target's argmax given the tokens before it, and its top-two gap."""
    llm.clear()
    llm.prefill(prompt[:-1])
    out = []
    last, pos = prompt[-1], len(prompt) - 1
    for tok in tokens:
        row = llm.decode([last], pos, logits="last")[0]
        top2 = np.partition(row, -2)[-2:]
        out.append((int(row.argmax()), float(top2[1] - top2[0])))
        last, pos = tok, pos + 1
    return out


def settings(target: Path, draft: str = "mtp", k: int = 4, **kw) -> EngineSettings:
    # No joint confidence cut: a random head doubts every token, so it would end each
    # draft after one and nothing would be rejected part-way (the cut has its own tests).
    return EngineSettings(**{"adaptive": False, "target": str(target), "draft": draft, "k": k, "threads": 1,
                             "ctx": 1024, "max_tokens": N_TOKENS, "raw": True, "lookup_min_ngram": 1,
                             "lookup_max_ngram": 3, "draft_p_joint": 0.0, **kw})


@contextlib.contextmanager
def snapshots_off():
    """The target context created without recurrent-state snapshots (n_rs_seq 0): every
    rejected draft is then taken back with a checkpoint, a restore and a replay."""
    real = session_module.LLM
    session_module.LLM = lambda *a, **kw: real(*a, **{**kw, "n_rs_seq": 0})  # type: ignore[misc]
    try:
        yield
    finally:
        session_module.LLM = real  # type: ignore[misc]


class Fixture:
    def __init__(self, target: Path, rollback: str, draft: str = "mtp"):
        self.target, self.rollback = target, rollback
        ctl = CostModelController(verdict_margin=0.0, probe_every=4)
        if rollback == "snapshots":
            self.session = Session(settings(target, draft=draft), controller=ctl)
        else:
            with snapshots_off():
                self.session = Session(settings(target, draft=draft), controller=ctl)
        self.prompt = self.session.prompt_tokens(PROMPT)
        self.ref = LLM(target, n_ctx=1024, n_threads=1)
        self._plain: list[int] | None = None

    def plain(self, n: int) -> list[int]:
        if self._plain is None:
            self._plain = plain_greedy(self.ref, self.prompt, N_TOKENS)
        return self._plain[:n]

    def close(self) -> None:
        self.session.close()
        self.ref.close()


@pytest.fixture(scope="module", params=["snapshots", "checkpoint"])
def fx(request, qwen35_mtp_path):
    f = Fixture(qwen35_mtp_path, request.param)
    yield f
    f.close()


def apply(session: Session, *cmds: E.Command) -> list[E.Event]:
    for cmd in cmds:
        session.send(cmd)
    return list(session.engine.apply_pending())


def run(session: Session, prompt: list[int], n: int = N_TOKENS) -> tuple[list[E.StepEvent], list[E.Event]]:
    events = list(session.engine.generate(prompt, n))
    return [ev for ev in events if isinstance(ev, E.StepEvent)], events


def tokens_of(steps: list[E.StepEvent]) -> list[int]:
    return [t for s in steps for t in s.tokens]


def check_exact(fx: Fixture, got: list[int], what: str, near_ties: list[str]) -> int:
    """got must be plain decoding's tokens; a difference only at a near-tie of the
    target's top two logits, where every token is still its argmax given those before."""
    plain = fx.plain(len(got))
    if got == plain:
        return 0
    ties = 0
    for i, (tok, (want, gap)) in enumerate(zip(got, teacher_forced_gaps(fx.ref, fx.prompt, got))):
        if tok != want:
            assert gap < TIE_GAP, f"{what}: token {i} is {tok}, the target's argmax is {want} (gap {gap:.4f})"
            ties += 1
            near_ties.append(f"mtp {fx.rollback} {what}: near-tie at token {i}, gap {gap:.3f}")
    assert ties, f"{what}: differs from plain decoding without a near-tie"
    return ties


# --- the fixture ------------------------------------------------------------------------------


def test_llama_cpp_loads_the_fixture_and_its_head(qwen35_mtp_path, qwen35_nohead_path):
    from specdash.models.mtp_info import mtp_head

    head = mtp_head(qwen35_mtp_path)
    assert head.layers == 1 and head.describe() == "MTP head: 1 layer"
    # One block and the output head per drafted token against four blocks and the same
    # output head per step: on this tiny model the 49k-row output head dominates both.
    assert 0.5 < head.relative_cost < 1.0
    assert mtp_head(qwen35_nohead_path).layers == 0 and mtp_head(qwen35_nohead_path).describe() == ""
    llm = LLM(qwen35_mtp_path, n_ctx=256, n_threads=1, n_rs_seq=4, load_mtp=True)
    try:
        assert llm.arch == "qwen35" and llm.n_mtp_layers == 1 and llm.mtp_loaded
        assert llm.strategy.kind == "snapshots"  # the hybrid's recurrent state
        drafter = MtpDrafter(llm)  # llama.cpp creates the MTP context against it
        assert drafter.n_heads == 1 and drafter.label == "mtp"
        drafter.close()
    finally:
        llm.close()


# --- greedy exactness ---------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["mtp", "chain"])
def test_greedy_speculation_with_the_head_is_plain_decoding(fx, near_ties, drafter):
    session = fx.session
    apply(session, E.SetAdaptive(False), E.SetDrafter(drafter))
    assert session.engine.settings_event().drafter == ("mtp" if drafter == "mtp" else "chain: edit → lookup → suffix → mtp")
    accepted = rejected = partial = ties = 0
    sources: set[str] = set()
    used: set[str] = set()
    try:
        for k in KS:
            apply(session, E.SetK(k))
            steps, _ = run(session, fx.prompt)
            ties += check_exact(fx, tokens_of(steps), f"{drafter} K={k}", near_ties)
            for s in steps:
                assert s.drafted <= k
                if s.drafted:
                    sources.add(s.drafter)
                    used.add(s.rollback)
            accepted += sum(s.accepted for s in steps)
            rejected += sum(s.drafted - s.accepted for s in steps)
            partial += sum(1 for s in steps if 0 < s.accepted < s.drafted)
            # The first step continues the prompt's last token: never drafted by the head
            # (llama-server drafts first after the prompt), lookup may.
            if drafter == "mtp":
                assert steps[0].drafted == 0
    finally:
        apply(session, E.SetK(4), E.SetDrafter("mtp"))
    assert accepted > 0 and rejected > 0 and partial > 0, (accepted, rejected, partial)
    assert "mtp" in sources and sources <= {"mtp", "lookup", "suffix"}
    if drafter == "chain":
        assert "lookup" in sources, "lookup never drafted before the head"
    if fx.rollback == "snapshots":
        # n_rs_seq = k_max = 16: K = 64 drafts past the snapshots take a checkpoint
        assert "snapshots" in used and used <= {"snapshots", "checkpoint"}
    else:
        assert used == {"checkpoint"}
    near_ties.append(f"mtp {fx.rollback}/{drafter}: {accepted} accepted, {rejected} rejected ({partial} steps "
                     f"partly), {ties} near-ties over K {KS}")


def test_greedy_adaptive_k_with_the_head_is_plain_decoding(fx, near_ties):
    session = fx.session
    apply(session, E.SetDrafter("mtp"), E.SetAdaptive(True))
    try:
        steps, events = run(session, fx.prompt)
        ctl = session.engine.controller
        assert isinstance(ctl, CostModelController)
        # The head is priced before its first draft (model_price: its bytes over the target's)...
        assert ctl.model._prior == pytest.approx(session.mtp_relative_cost)
        # ...then measured: a drafted token's cost is the head's decode, not a target step's.
        measured = ctl.model.measured_steps
    finally:
        apply(session, E.SetAdaptive(False), E.SetDrafter("mtp"))
    check_exact(fx, tokens_of(steps), "adaptive", near_ties)
    assert any(s.drafted for s in steps), [ev.message for ev in events if isinstance(ev, E.NoticeEvent)]
    assert measured > 0


def test_auto_drafts_with_the_head_and_is_plain_decoding(qwen35_mtp_path, near_ties):
    """`auto`, the default draft source, takes the target's own head as its model where
    one is loaded (it costs less than a separate draft model and needs no vocabulary
    match): the head is one of its parts, it drafts where no copy matches, and greedy
    output is plain decoding's, at a fixed K and under adaptive K."""
    assert EngineSettings().draft == "auto" and EngineSettings().draft_model == "default"
    f = Fixture(qwen35_mtp_path, "snapshots", draft="auto")
    try:
        session = f.session
        assert session.engine.settings_event().drafter == "auto: lookup, edit, suffix, mtp"
        assert any(isinstance(getattr(p, "inner", None), MtpDrafter) for p in session.engine.drafter.parts())
        steps, _ = run(session, f.prompt)
        check_exact(f, tokens_of(steps), "auto K=4", near_ties)
        drafted = {s.drafter for s in steps if s.drafted}
        assert "mtp" in drafted and drafted <= {"mtp", "lookup", "suffix"}, drafted
        assert sum(s.accepted for s in steps if s.drafter == "mtp") > 0
        apply(session, E.SetAdaptive(True))
        steps, _ = run(session, f.prompt)
        check_exact(f, tokens_of(steps), "auto adaptive", near_ties)
    finally:
        f.close()


# --- the head's own state -------------------------------------------------------------------------


class Recording(MtpDrafter):
    """The session's head, noting each draft and the top-two gap of each drafted token."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.drafts: list[tuple[list[int], list[int], list[float]]] = []
        self._gaps: list[float] = []

    def _pick(self, logits: np.ndarray) -> int:
        two = np.partition(logits, -2)[-2:]
        self._gaps.append(float(two[1] - two[0]))
        return super()._pick(logits)

    def propose(self, tokens, k, sampling, rng):
        self._gaps = []
        draft = super().propose(tokens, k, sampling, rng)
        if draft.tokens:
            self.drafts.append((list(tokens), list(draft.tokens), self._gaps[:len(draft.tokens)]))
        return draft


def fresh_drafts(target: Path, drafts, k: int) -> list[tuple[int, int, float]]:
    """For each (tokens, draft, gaps) the session's head made: where a fresh head, fed the
    committed tokens alone, drafts otherwise: (draft index, token index, the session head's
    top-two gap there)."""
    llm = LLM(target, n_ctx=1024, n_threads=1, load_mtp=True)
    fresh = Recording(llm)
    out = []
    try:
        for i, (tokens, draft, gaps) in enumerate(drafts):
            llm.clear()
            llm.prefill(tokens[:-1])
            fresh.reset()
            again = fresh.propose(tokens, k, GREEDY, None).tokens
            for j, (a, b) in enumerate(zip(draft, again)):
                if a != b:
                    out.append((i, j, min(gaps[j], fresh._gaps[j])))
                    break
            else:
                if len(again) != len(draft):
                    out.append((i, min(len(again), len(draft)), 0.0))
    finally:
        fresh.close()
        llm.close()
    return out


def head_session(target: Path, *, rollback: str = "snapshots") -> Session:
    with contextlib.ExitStack() as stack:
        stack.enter_context(pytest.MonkeyPatch.context()).setattr(session_module, "MtpDrafter", Recording)
        if rollback == "checkpoint":
            stack.enter_context(snapshots_off())
        return Session(settings(target, k=4))


@pytest.mark.parametrize("rollback", ["snapshots", "checkpoint"])
def test_after_each_verify_the_head_drafts_what_a_fresh_head_would(qwen35_mtp_path, rollback, near_ties):
    """The head's state is the committed text's: it took the hidden row of the accepted
    position and lost the rejected tail (and its own drafts) from its KV. So each of its
    drafts is what a fresh head, fed only the committed tokens, drafts (up to a near-tie
    of the head's own top two logits: a batch can round differently from another)."""
    session = head_session(qwen35_mtp_path, rollback=rollback)
    try:
        prompt = session.prompt_tokens(PROMPT)
        steps, _ = run(session, prompt)
        assert any(0 < s.accepted < s.drafted for s in steps), "no partly rejected draft"
        head = session._mtp
        assert isinstance(head, Recording) and len(head.drafts) > 10
        diffs = fresh_drafts(qwen35_mtp_path, head.drafts, 4)
    finally:
        session.close()
    for i, j, gap in diffs:
        assert gap < TIE_GAP, f"draft {i}, token {j}: the head drafted other than a fresh head (gap {gap:.3f})"
    if diffs:
        near_ties.append(f"mtp head {rollback}: {len(diffs)} near-tie drafts of {len(head.drafts)} "
                         f"(gaps {', '.join(f'{g:.3f}' for _, _, g in diffs)})")


def test_a_head_fed_the_wrong_hidden_row_is_caught(qwen35_mtp_path, monkeypatch):
    """The check above has teeth: a head that pairs each token with the hidden row of its
    own position (not the one before it, which predicted the token) drafts otherwise than
    a fresh, correct head, far from any near-tie."""
    real = MtpDrafter.decoded

    def late(self, tokens, start_pos):
        real(self, tokens, start_pos)
        if start_pos > 0:
            self._h[start_pos - 1:start_pos + len(tokens) - 1] = self._h[start_pos:start_pos + len(tokens)].copy()

    session = head_session(qwen35_mtp_path)
    try:
        monkeypatch.setattr(MtpDrafter, "decoded", late)
        steps, _ = run(session, session.prompt_tokens(PROMPT))
        monkeypatch.undo()
        head = session._mtp
        assert isinstance(head, Recording)
        diffs = fresh_drafts(qwen35_mtp_path, head.drafts, 4)
    finally:
        session.close()
    assert [d for d in diffs if d[2] >= TIE_GAP], "a head fed the wrong rows drafted like a correct one"


# --- the peer: llama-server's draft-mtp ----------------------------------------------------------


PEER_CASES = [(1, 0.0), (2, 0.0), (4, 0.0), (16, 0.0), (4, 0.2)]


@pytest.mark.parametrize("k,p_min", PEER_CASES, ids=[f"k{k}-pmin{p:g}" for k, p in PEER_CASES])
def test_llama_server_draft_mtp_drafts_and_accepts_the_same(qwen35_mtp_path, tmp_path, k, p_min):
    """The proof the drafts are llama.cpp's: llama-server --spec-type draft-mtp on the same
    fixture and prompt, greedy, the same confidence cut on both sides (--spec-draft-p-min,
    specdash's draft_p_min; no joint cut): the same text, and the same drafted and
    accepted counts (timings.draft_n, draft_n_accepted). A fresh server per case: its head
    pairs the first prompt position with the last request's hidden row."""
    from conftest_remote import LlamaServer, free_port, need_binary

    binary = need_binary()
    n = 48
    s = settings(qwen35_mtp_path, k=k, threads=2, ctx=512, max_tokens=n, draft_p_min=p_min)
    session = Session(s)
    try:
        prompt = session.prompt_tokens(PROMPT)
        steps, events = run(session, prompt, n)
        summary = next(ev for ev in events if isinstance(ev, E.Summary))
    finally:
        session.close()
    server = LlamaServer(binary, qwen35_mtp_path, free_port(),
                         ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(k), "--spec-draft-p-min", f"{p_min:g}",
                          "-np", "1"], tmp_path / "server.log", metrics=False)
    server.start()
    try:
        reply = server.complete(prompt, n, temperature=0.0, return_tokens=True)
    finally:
        server.stop()
    timings = reply["timings"]
    assert [int(t) for t in reply["tokens"]] == tokens_of(steps)
    assert (summary.num_draft_tokens, summary.num_accepted_tokens) == \
        (timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)), timings
    assert summary.num_accepted_tokens > 0
    if p_min == 0:
        assert summary.num_draft_tokens > summary.num_accepted_tokens


# --- fail soft ----------------------------------------------------------------------------------


def test_a_target_without_a_head_refuses_mtp_and_the_others_still_draft(qwen35_nohead_path):
    session = Session(settings(qwen35_nohead_path, draft="lookup", translate=False))
    try:
        events = apply(session, E.SetDrafter("mtp"))
        notes = [ev.message for ev in events if isinstance(ev, E.NoticeEvent)]
        assert len(notes) == 1 and "\n" not in notes[0], notes
        assert notes[0].startswith("draft=mtp refused: mtp unavailable: ") and "has no MTP head" in notes[0]
        assert notes[0].endswith("kept draft=lookup")
        assert session.mtp_unavailable() and "has no MTP head" in session.mtp_unavailable()
        # The chain goes on without it (and without a draft model: none fits this vocabulary).
        apply(session, E.SetDrafter("chain"))
        assert session.engine.settings_event().drafter == "chain: edit → lookup → suffix"
        apply(session, E.SetDrafter("auto"))  # the default: copies only, without a head
        assert session.engine.settings_event().drafter == "auto: lookup, edit, suffix"
        apply(session, E.SetDrafter("lookup"))
        steps, _ = run(session, session.prompt_tokens(PROMPT))
        assert any(s.drafter == "lookup" and s.drafted for s in steps)
    finally:
        session.close()


def test_a_head_not_loaded_is_refused(qwen35_mtp_path):
    llm = LLM(qwen35_mtp_path, n_ctx=256, n_threads=1)  # load_mtp off: llama.cpp skips the head's tensors
    try:
        assert llm.n_mtp_layers == 1 and not llm.mtp_loaded  # llama.cpp still counts it
        with pytest.raises(MtpUnavailable, match=r"MTP head \(1 layer\(s\)\) was not loaded") as exc:
            MtpDrafter(llm)
        assert "\n" not in str(exc.value)

        def factory(spec: str):
            from specdash.engine.drafters.lookup import PromptLookupDrafter

            return MtpDrafter(llm) if spec == "mtp" else PromptLookupDrafter(1, 3)

        engine = Engine(llm, factory("lookup"), EngineSettings(adaptive=False, k=4, max_tokens=16, draft="lookup"),
                        drafter_factory=factory)
        engine.send(E.SetDrafter("mtp"))
        notes = [ev.message for ev in engine.apply_pending() if isinstance(ev, E.NoticeEvent)]
        assert len(notes) == 1 and "was not loaded" in notes[0] and notes[0].endswith("kept draft=lookup")
        steps = [ev for ev in engine.generate(llm.tokenize(PROMPT), 16) if isinstance(ev, E.StepEvent)]
        assert steps and all(s.drafter in ("lookup", "none") for s in steps)
    finally:
        llm.close()


def test_a_missing_staging_symbol_is_refused_with_its_name(qwen35_mtp_path, monkeypatch):
    monkeypatch.setenv(HIDE_ENV, "llama_get_embeddings_nextn_ith")
    session = Session(settings(qwen35_mtp_path, draft="lookup", translate=False))
    try:
        notes = [ev.message for ev in apply(session, E.SetDrafter("mtp")) if isinstance(ev, E.NoticeEvent)]
        assert len(notes) == 1 and "lacks llama.cpp's llama_get_embeddings_nextn_ith" in notes[0], notes
        # The chain goes on without the head.
        apply(session, E.SetDrafter("chain"))
        assert session.engine.settings_event().drafter == "chain: edit → lookup → suffix"
        apply(session, E.SetDrafter("suffix"))
        steps, _ = run(session, session.prompt_tokens(PROMPT), 24)
        assert len(tokens_of(steps)) == 24
    finally:
        session.close()


def test_cli_says_why_mtp_is_unavailable_in_one_line(qwen35_mtp_path, qwen35_nohead_path):
    common = ["--raw", "--k", "2", "--max-tokens", "4", "--threads", "1", "--prompt", "Once upon"]
    assert_usage_error(specdash("run", "--target", str(qwen35_nohead_path), "--draft", "mtp", *common),
                       "mtp unavailable:", "has no MTP head")
    proc = specdash("check", str(qwen35_nohead_path), "mtp")
    assert proc.returncode == 1 and "mtp unavailable:" in proc.stdout and "Traceback" not in proc.stderr
    assert_usage_error(specdash("check", str(qwen35_nohead_path)), "give a DRAFT model")
    env_run = subprocess.run(
        [*specdash_argv(), "check", str(qwen35_mtp_path)], capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, HIDE_ENV: "llama_set_embeddings_nextn"})
    assert env_run.returncode == 1 and "lacks llama.cpp's llama_set_embeddings_nextn" in env_run.stdout
    ok = specdash("check", str(qwen35_mtp_path))
    assert_ok(ok)
    assert "MTP head: 1 layer" in ok.stdout and "compatible: the target drafts with its own MTP head" in ok.stdout


def specdash_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "specdash"]


# --- everywhere a drafter shows ---------------------------------------------------------------------


def test_run_json_steps_say_mtp_and_export_writes_draft_mtp(qwen35_mtp_path):
    import json

    proc = specdash("run", "--raw", "--target", str(qwen35_mtp_path), "--draft", "mtp", "--k", "3", "--temp", "0",
                    "--max-tokens", "24", "--threads", "1", "--ctx", "512", "--prompt", PROMPT, "--json")
    assert_ok(proc)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps = [e for e in events if e["event"] == "step"]
    assert {s["drafter"] for s in steps if s["drafted"]} == {"mtp"}
    assert any(any(s["from_draft"]) for s in steps)  # provenance: tokens the head drafted
    assert next(e for e in events if e["event"] == "settings")["drafter"] == "mtp"
    out = specdash("export", "--target", str(qwen35_mtp_path), "--draft", "mtp", "--k", "3")
    assert_ok(out)
    assert "--spec-draft-n-max 3 --spec-type draft-mtp" in out.stdout and "-md" not in out.stdout.split()
    # the joint cut (on by default) has no llama-server flag: said in a comment
    assert "# draft_p_joint 0.1" in out.stdout
    chain = specdash("export", "--target", str(qwen35_mtp_path), "--draft", "chain", "--k", "5")
    assert "--spec-type ngram-simple,draft-mtp" in chain.stdout and "-md" not in chain.stdout.split()


def test_models_scan_and_pairs_say_mtp_head(qwen35_mtp_path, qwen35_nohead_path, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))  # a private scan cache
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    for p in (qwen35_mtp_path, qwen35_nohead_path):
        (shelf / p.name).symlink_to(p)
    scan = specdash("models", "scan", str(shelf), "--json")
    assert_ok(scan)
    found = {Path(m["path"]).name: m["mtp_layers"] for m in json.loads(scan.stdout)["models"]}
    assert found == {qwen35_mtp_path.name: 1, qwen35_nohead_path.name: 0}
    table = specdash("models", "scan", str(shelf))
    assert "".join(table.stdout.split()).count("MTPhead:1layer") == 1  # (a narrow table wraps its notes)
    pairs = specdash("models", "pairs", str(qwen35_mtp_path), str(shelf))
    assert "MTP head: 1 layer: it drafts for itself (--draft mtp), no draft model needed" in pairs.stdout


# --- attach: a llama-server drafting with draft-mtp --------------------------------------------------


def test_attach_names_a_draft_mtp_server_and_shows_its_acceptance(qwen35_mtp_path, tmp_path):
    """`specdash attach` on llama-server --spec-type draft-mtp: the drafter is named from
    the slot's task params (/props' generation settings are the defaults, not the
    server's: they say "none"), and drive mode's steps give its acceptance per position."""
    import httpx

    from conftest_remote import LlamaServer, free_port, need_binary
    from specdash.sources.remote import RemoteSource

    server = LlamaServer(need_binary(), qwen35_mtp_path, free_port(),
                         ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "-np", "1"], tmp_path / "server.log")
    server.start()
    events: list[E.Event] = []
    source = RemoteSource(server.url, interval=0.3, max_tokens=40)
    try:
        props = httpx.get(server.url + "/props", timeout=10).json()
        assert props["default_generation_settings"]["params"]["speculative.types"] == "none"
        source.start(events.append)
        source.send(E.NewPrompt(PROMPT, "fox"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(isinstance(e, E.Summary) for e in events):
            time.sleep(0.1)
        summary = next(e for e in events if isinstance(e, E.Summary))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                isinstance(e, E.SettingsEvent) and e.drafter == "draft-mtp" for e in events):
            time.sleep(0.1)
    finally:
        source.close()
        server.stop()
    named = [e for e in events if isinstance(e, E.SettingsEvent) and e.drafter == "draft-mtp"]
    assert named, [e.drafter for e in events if isinstance(e, E.SettingsEvent)]
    steps = [e for e in events if isinstance(e, E.StepEvent)]
    assert summary.num_draft_tokens > summary.num_accepted_tokens > 0
    assert sum(s.drafted for s in steps) == summary.num_draft_tokens
    per_pos = summary.num_accepted_tokens_per_pos
    assert 0 < len(per_pos) <= 3 and sum(per_pos) == summary.num_accepted_tokens


def test_the_sweep_sweeps_the_head(qwen35_mtp_path, tmp_path):
    import json

    out = tmp_path / "sweep.json"
    proc = specdash("sweep", "--headless", "--raw", "--target", str(qwen35_mtp_path), "--draft", "mtp",
                    "--threads", "1", "--ks", "0,2,4", "--rounds", "1", "--sweep-tokens", "32", "--json", str(out),
                    "--prompt", PROMPT)
    assert_ok(proc)
    data = json.loads(out.read_text())
    assert data["drafter"] == "mtp" and [p["k"] for p in data["points"]] == [0, 2, 4]
    assert all(0 < p["acceptance_rate"] < 1 for p in data["points"][1:])


def test_the_picker_lists_the_head_only_for_a_target_that_has_one(qwen35_mtp_path, qwen35_nohead_path, monkeypatch):
    from specdash.tui.screens.draft_picker import draft_choices

    def mtp_choice(target):
        return next((c for c in draft_choices(str(target), None) if c.spec == "mtp"), None)

    head = mtp_choice(qwen35_mtp_path)
    assert head is not None and head.available and "MTP head: 1 layer" in head.description
    assert [c.spec for c in draft_choices(str(qwen35_mtp_path), None)][:7] == ["auto", "lookup", "edit", "suffix",
                                                                                 "mtp", "chain", "none"]
    assert mtp_choice(qwen35_nohead_path) is None
    monkeypatch.setenv(HIDE_ENV, "llama_get_ctx_other")
    hidden = mtp_choice(qwen35_mtp_path)
    assert hidden is not None and not hidden.available and "lacks llama.cpp's llama_get_ctx_other" in hidden.reason


# --- whatif simulates the head ------------------------------------------------------------------------


@pytest.mark.parametrize("p_joint", [0.0, 0.1])
def test_whatif_simulates_the_head_step_for_step(qwen35_mtp_path, p_joint):
    """The head's proposals from every position of the text (whatif/head.py), replayed:
    at each fixed K the simulated steps draft and accept what a real greedy run does,
    with and without the joint confidence cut."""
    from specdash.costs.profile import Profile
    from specdash.tuning.whatif.simulate import make_drafter, simulate
    from specdash.tuning.whatif.transcript import from_prompt

    flat = Profile(name="test", verify={1: 10.0, 9: 14.0, 33: 26.0}, draft_ms=1.0, free_ms=0.05)
    s = settings(qwen35_mtp_path, k=0, draft="none", draft_p_joint=p_joint, max_tokens=48)
    tr, (session, _) = from_prompt(s, PROMPT, None, lambda m: None, head_depth=8)
    session.close()
    assert tr.head is not None and len(tr.head.tokens) == len(tr.seq) + 1
    for k in (1, 2, 4, 8):
        real = Session(s.replace(draft="mtp", k=k))
        try:
            steps, _ = run(real, real.prompt_tokens(PROMPT), 48)
        finally:
            real.close()
        assert tokens_of(steps) == tr.seq[: len(tokens_of(steps))]
        sim = simulate(tr, make_drafter("mtp", tr, flat, s.replace(k=k)), flat, s.replace(k=k), name="mtp", k=k)
        got = [(k_, d, a) for k_, d, a, _, _ in sim.trace]
        assert got == [(ev.k, ev.drafted, ev.accepted) for ev in steps], f"K={k} p_joint={p_joint}"
        assert sim.accepted > 0 and (p_joint > 0 or sim.drafted > sim.accepted)


def test_whatif_cli_includes_the_head_where_the_target_has_one(qwen35_mtp_path, qwen35_nohead_path, tmp_path):
    import json

    out = tmp_path / "w.json"
    proc = specdash("whatif", "--raw", "--target", str(qwen35_mtp_path), "--draft", "lookup", "--prompt", PROMPT,
                    "--max-tokens", "32", "--threads", "1", "--profile", "ci-box", "--ks", "1,2,4", "--json", str(out))
    assert_ok(proc)
    report = json.loads(out.read_text())
    rows = [r for r in report["fixed"] if r["drafter"] == "mtp"]
    assert [r["k"] for r in rows] == [1, 2, 4] and all(r["accepted"] > 0 for r in rows)
    assert any(r["drafter"] == "mtp" for r in report["adaptive"])
    nohead = specdash("whatif", "--raw", "--target", str(qwen35_nohead_path), "--draft", "lookup", "--prompt", PROMPT,
                      "--max-tokens", "16", "--threads", "1", "--profile", "ci-box", "--ks", "1,2")
    assert_ok(nohead)
    assert "mtp: not simulated" in nohead.stderr and "has no MTP head" in nohead.stderr
    assert_usage_error(specdash("whatif", "--raw", "--target", str(qwen35_nohead_path), "--prompt", PROMPT,
                                "--max-tokens", "16", "--threads", "1", "--profile", "ci-box", "--drafters", "mtp",
                                "--ks", "1"), "--drafters mtp:", "has no MTP head")
