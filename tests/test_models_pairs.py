"""`specdash models pairs`: every scanned model checked as a draft with `specdash check`'s
rules, read from GGUF headers, and the compatible ones ranked. Each rule's failure is
shown by a real GGUF that breaks only that rule, and the header path must agree with
llama.cpp's own (check_pair) on every one of them."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gguf
import pytest

from specdash.cli import main
from specdash.contract.errors import SpecdashError
from specdash.models.compat import TOKEN_DIGESTS, check_pair, vocab_from_llama, vocab_from_metadata
from specdash.models.gguf_header import read_gguf_header, read_string_array
from specdash.models.pairs import RANKING_RULE, pairs_report, rank_drafts
from specdash.models.scan import scan
from test_models_scan import link, write_model

B = gguf.GGUFValueType.BOOL
U32 = gguf.GGUFValueType.UINT32
STR = gguf.GGUFValueType.STRING


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch, smol_path, gemma_path, draft_path, target_path) -> Path:
    cache = tmp_path / "sdcache"
    (cache / "models").mkdir(parents=True)
    # The built-in models by name, without fetching them again (1.1 GB for the target).
    for path in (smol_path, gemma_path, draft_path, target_path):
        (cache / "models" / path.name).symlink_to(path)
    monkeypatch.setenv("SPECDASH_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def variants(tmp_path_factory, smol_path) -> dict[str, Path]:
    """SmolLM2's tokenizer, each time changed in one way (base: unchanged)."""
    d = tmp_path_factory.mktemp("variants")
    specs = {
        "base": {},
        "spm": {"set_kv": {"tokenizer.ggml.model": ("llama", STR)}},
        "add-bos": {"set_kv": {"tokenizer.ggml.add_bos_token": (True, B)}},
        "bos-0": {"set_kv": {"tokenizer.ggml.add_bos_token": (True, B), "tokenizer.ggml.bos_token_id": (0, U32)}},
        "add-eos": {"set_kv": {"tokenizer.ggml.add_eos_token": (True, B)}},
        "eos-0": {"set_kv": {"tokenizer.ggml.add_eos_token": (True, B), "tokenizer.ggml.eos_token_id": (0, U32)}},
        "plus-200": {"extra_tokens": 200},
        "plus-128": {"extra_tokens": 128},
        "pard": {"edit_tokens": {1000: "<pard_mask>", 2000: "<pard_mask_2>"}},
        "low-ids": {"edit_tokens": {3: "<low_id>"}},
    }
    return {name: write_model(d / f"{name}.gguf", smol_path, **spec) for name, spec in specs.items()}


def judged(target: Path, draft: Path, tmp_path: Path):
    """The header path's verdict on one pair, after checking that llama.cpp's own check
    (specdash check) reports exactly the same rules and evidence."""
    result = scan([link(tmp_path / "pair", target, draft)])
    (verdict,) = [v for v in rank_drafts(tmp_path / "pair" / target.name, result)]
    assert list(verdict.rules) == check_pair(target, draft).rules
    return verdict


def failed(verdict) -> dict[str, str]:
    return {r.name: r.evidence for r in verdict.rules if not r.passed}


# ---------------------------------------------------------------------------- header == llama.cpp


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_vocab_from_headers_is_what_llama_cpp_loads(name, smol_path, gemma_path, draft_path, target_path):
    path = {p.stem: p for p in (smol_path, gemma_path, draft_path, target_path)}[name]
    meta = vocab_from_metadata(read_gguf_header(path, digests=TOKEN_DIGESTS).metadata, path)
    real = vocab_from_llama(path)
    fields = ("vocab_type", "n_tokens", "add_bos", "add_eos", "bos", "eos")
    assert [getattr(meta, f) for f in fields] == [getattr(real, f) for f in fields]
    assert list(meta.token_texts()) == list(real.token_texts())


def test_variant_vocabs_from_headers_are_what_llama_cpp_loads(variants):
    for name, path in variants.items():
        meta = vocab_from_metadata(read_gguf_header(path, digests=TOKEN_DIGESTS).metadata, path)
        real = vocab_from_llama(path)
        assert (meta.vocab_type, meta.n_tokens, meta.add_bos, meta.add_eos, meta.bos, meta.eos) == (
            real.vocab_type, real.n_tokens, real.add_bos, real.add_eos, real.bos, real.eos), name


def test_registry_pairs_agree_with_specdash_check(target_path, draft_path, smol_path, gemma_path, tmp_path):
    result = scan([link(tmp_path / "d", target_path, draft_path, smol_path, gemma_path)])
    verdicts = {v.draft.label: v for v in rank_drafts(tmp_path / "d" / target_path.name, result)}
    for draft in (draft_path, smol_path, gemma_path):
        label = draft.name.removesuffix(".gguf")
        assert list(verdicts[label].rules) == check_pair(target_path, draft).rules, label
    assert verdicts["qwen2.5-coder-0.5b"].compatible and verdicts["qwen2.5-coder-0.5b"].rank == 1
    assert verdicts["gemma3-270m"].failed_rule == "vocab type"  # the first of the four failures
    assert len(failed(verdicts["gemma3-270m"])) == 4
    assert list(failed(verdicts["smollm2-135m"])) == ["vocab size", "token text"]


# ---------------------------------------------------------------------------- one test per rule failure


def test_vocab_type_failure(variants, tmp_path):
    v = judged(variants["base"], variants["spm"], tmp_path)
    assert (v.compatible, v.failed_rule) == (False, "vocab type")
    assert failed(v) == {"vocab type": "target BPE (2), draft SPM (1)"}


def test_add_bos_failure(variants, tmp_path):
    v = judged(variants["base"], variants["add-bos"], tmp_path)
    assert failed(v) == {"BOS/EOS": "add-BOS target False vs draft True"}
    assert v.reason == "BOS/EOS: add-BOS target False vs draft True"


def test_bos_id_failure(variants, tmp_path):
    v = judged(variants["add-bos"], variants["bos-0"], tmp_path)
    assert failed(v) == {"BOS/EOS": "BOS id target 1 vs draft 0"}


def test_add_eos_failure(variants, tmp_path):
    v = judged(variants["base"], variants["add-eos"], tmp_path)
    assert failed(v) == {"BOS/EOS": "add-EOS target False vs draft True"}


def test_eos_id_failure(variants, tmp_path):
    v = judged(variants["add-eos"], variants["eos-0"], tmp_path)
    assert failed(v) == {"BOS/EOS": "EOS id target 2 vs draft 0"}


def test_vocab_size_failure(variants, tmp_path):
    v = judged(variants["base"], variants["plus-200"], tmp_path)
    assert failed(v) == {"vocab size": "target 49,152, draft 49,352: differ by 200 (max 128)"}


def test_vocab_size_within_128_passes(variants, tmp_path):
    v = judged(variants["base"], variants["plus-128"], tmp_path)
    assert v.compatible
    assert {r.name: r.evidence for r in v.rules}["vocab size"] == (
        "target 49,152, draft 49,280: differ by 128 (max 128)")


def test_token_text_failure(variants, tmp_path):
    texts = read_string_array(variants["base"], "tokenizer.ggml.tokens")
    v = judged(variants["base"], variants["pard"], tmp_path)
    t1000, t2000 = (texts[i].decode() for i in (1000, 2000))
    assert failed(v) == {"token text": (
        f"2 of 49,147 ids 5..49151 differ; first: 1000: {t1000!r} vs '<pard_mask>', "
        f"2000: {t2000!r} vs '<pard_mask_2>' (target vs draft)")}


def test_token_text_ignores_ids_below_5(variants, tmp_path):
    v = judged(variants["base"], variants["low-ids"], tmp_path)
    assert v.compatible
    assert {r.name: r.evidence for r in v.rules}["token text"] == "ids 5..49151: all 49,147 identical"


def test_unreadable_vocab_and_weightless_drafts_are_refused(smol_path, variants, tmp_path):
    from test_models import _gguf_bytes

    d = link(tmp_path / "d", smol_path, variants["low-ids"])
    (d / "bare.gguf").write_bytes(_gguf_bytes({"general.architecture": "llama"}, []))
    result = scan([d])
    # A tokenizer-only file (as llama.cpp ships for its tokenizer tests): same vocabulary,
    # no tensors.
    weightless = replace(next(m for m in result.models if m.label == "low-ids"), n_params=None, label="vocab-only")
    result = replace(result, models=(*result.models, weightless))
    verdicts = {v.draft.label: v for v in rank_drafts(d / smol_path.name, result)}
    assert (verdicts["bare"].failed_rule, verdicts["bare"].evidence) == (
        "vocabulary", "no tokenizer in its metadata (tokenizer.ggml.model missing)")
    assert (verdicts["vocab-only"].failed_rule, verdicts["vocab-only"].evidence) == (
        "weights", "a vocab-only file: no weights to draft with")
    assert all(r.passed for r in verdicts["vocab-only"].rules)
    assert verdicts["low-ids"].compatible


# ---------------------------------------------------------------------------- ranking


@pytest.fixture(scope="module")
def self_draft(tmp_path_factory, smol_path) -> Path:
    from specdash.models.quantize import make_draft

    cache = tmp_path_factory.mktemp("selfcache")
    (cache / "models").mkdir()
    (cache / "models" / "smollm2-135m.gguf").symlink_to(smol_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDASH_CACHE", str(cache))
        return make_draft("smollm2-135m", "Q4_0", nthread=2).path


def test_ranking_follows_the_stated_rule(smol_path, self_draft, variants, gemma_path, tmp_path):
    from moe_fixture import cached_tiny_moe

    d = link(tmp_path / "d", smol_path, self_draft, variants["plus-128"], gemma_path)
    (d / "tiny-moe.gguf").symlink_to(cached_tiny_moe(n_expert=4, n_expert_used=2, tokenizer_from=smol_path))
    family = write_model(d / "smol-family.gguf", smol_path, basename="smollm2")
    report = pairs_report(d / smol_path.name, scan([d]))
    good = report.compatible()
    # smol-family: 1/30 of the target, same basename, F16: 41 + 30 + 10 = 81
    # tiny-moe:    1/28, same architecture only, Q8_0:     40 + 20 + 20 = 80
    # plus-128:    1/30, same architecture only, F16:      41 + 20 + 10 = 71
    # the Q4_0 of the target: 0.93 of its size, so after all the others
    assert [v.draft.label for v in good] == ["smol-family", "tiny-moe", "plus-128", "smollm2-135m-q4_0"]
    assert [v.rank for v in good] == [1, 2, 3, 4]
    by = {v.draft.label: v for v in good}
    # family: the same general.basename beats the same architecture only
    assert (by["smol-family"].family, by["plus-128"].family) == ("same family", "same architecture")
    assert by["smol-family"].score - by["plus-128"].score == pytest.approx(10, abs=0.05)
    # quant: the MoE fixture is Q8_0 (from its tensors), the small F16 ones weigh .5
    assert by["tiny-moe"].draft.quant == "Q8_0" and by["plus-128"].draft.quant == "F16"
    # self-speculation: the target's own weights, smaller, flagged, and ranked last here
    # because at 0.9 of the target's size it is over the 1/2 line
    selfv = by["smollm2-135m-q4_0"]
    assert selfv.self_speculative and selfv.low_tier and selfv.family == "its own weights"
    assert selfv.notes[0] == "SELF: the target at Q4_0 (self-speculation)"
    assert "over 0.5 of the target's size: unlikely to pay" in selfv.notes
    assert not any(v.self_speculative for v in good if v is not selfv)
    assert [v.draft.label for v in report.incompatible()] == ["gemma3-270m"]
    assert family.exists()


def test_score_is_size_family_and_quant(smol_path, variants, tmp_path):
    result = scan([link(tmp_path / "d", smol_path, variants["plus-128"])])
    (v,) = rank_drafts(tmp_path / "d" / smol_path.name, result)
    target = next(m for m in result.models if m.label == "smollm2-135m")
    import math

    size_points = 50 * math.log2(target.active_bytes / v.draft.active_bytes) / 6
    assert v.score == pytest.approx(size_points + 20 + 20 * 0.5)
    # the same model as Q8_0 or Q2_K would score +10 / -3 (quant weights 1 and .35)
    for quant, delta in (("Q8_0", 10.0), ("Q2_K", -3.0)):
        other = replace(result, models=tuple(replace(m, quant=quant) if m.label == "plus-128" else m
                                             for m in result.models))
        (w,) = rank_drafts(target, other)
        assert w.score - v.score == pytest.approx(delta)


def test_quant_decides_between_equal_drafts(smol_path, variants, tmp_path):
    result = scan([link(tmp_path / "d", smol_path, variants["plus-128"], variants["low-ids"])])
    models = tuple(
        replace(m, quant={"plus-128": "Q4_K_M", "low-ids": "Q8_0"}.get(m.label, m.quant)) for m in result.models
    )
    order = [v.draft.label for v in rank_drafts(tmp_path / "d" / smol_path.name, replace(result, models=models))]
    assert order == ["low-ids", "plus-128"]
    models = tuple(replace(m, quant={"plus-128": "Q8_0", "low-ids": "Q2_K"}.get(m.label, m.quant)) for m in models)
    order = [v.draft.label for v in rank_drafts(tmp_path / "d" / smol_path.name, replace(result, models=models))]
    assert order == ["plus-128", "low-ids"]


def test_draft_larger_than_the_target_ranks_low(smol_path, variants, tmp_path):
    d = link(tmp_path / "d", smol_path, variants["plus-128"], variants["low-ids"])
    write_model(d / "quarter.gguf", smol_path, n_embd=8)
    verdicts = rank_drafts(d / "plus-128.gguf", scan([d]))
    # Both big ones go after the small one whatever their score; between them, score
    # decides: smollm2 (Q4_1, .6) beats low-ids (F16, .5) with no size points for either.
    assert [(v.draft.label, v.low_tier) for v in verdicts] == [
        ("quarter", False), ("smollm2-135m", True), ("low-ids", True)]
    by = {v.draft.label: v for v in verdicts}
    assert "larger than the target" in by["smollm2-135m"].notes
    assert "over 0.5 of the target's size: unlikely to pay" in by["low-ids"].notes
    assert by["smollm2-135m"].score > by["low-ids"].score


def test_the_target_is_not_its_own_draft(smol_path, tmp_path):
    d = link(tmp_path / "d", smol_path)
    (d / "same.gguf").symlink_to(smol_path)  # the same file by another name
    assert rank_drafts(smol_path, scan([d])) == []


# ---------------------------------------------------------------------------- recurrent / hybrid


def test_recurrent_target_says_checkpoint_and_replay(smol_path, tmp_path):
    target = write_model(tmp_path / "mamba.gguf", smol_path, arch="mamba")
    report = pairs_report(target, scan([link(tmp_path / "d", smol_path)]))
    assert report.warnings == ()  # rolling back is handled, not a warning any more
    assert report.rollback.startswith(
        "rollback: checkpoint + replay: recurrent (mamba) has no llama.cpp snapshots; "
        "a copy of the recurrent state saved before each verify batch")  # no ssm keys: size unknown
    assert report.to_dict()["rollback"]["strategy"] == "checkpoint"
    assert report.compatible()


def test_hybrid_target_with_llama_cpp_snapshots_says_so(smol_path, tmp_path):
    target = write_model(tmp_path / "lfm2.gguf", smol_path, arch="lfm2")
    report = pairs_report(target, scan([link(tmp_path / "d", smol_path)]))
    assert report.warnings == ()
    assert report.rollback.startswith(
        "rollback: snapshots (n_rs_seq 16): hybrid (lfm2) is in llama.cpp's snapshot list")


def test_recurrent_draft_without_snapshots_ranks_low(smol_path, variants, tmp_path):
    d = link(tmp_path / "d", smol_path, variants["plus-128"])
    write_model(d / "rwkv.gguf", smol_path, arch="rwkv7")
    verdicts = rank_drafts(d / smol_path.name, scan([d]))
    assert [v.draft.label for v in verdicts] == ["plus-128", "rwkv"]
    assert verdicts[1].low_tier
    assert "recurrent draft, rollback: checkpoint + replay: slower drafting" in verdicts[1].notes


def test_fixture_pairs_name_each_drafts_rollback_and_its_memory(
        lfm2_path, lfm2_draft_path, mamba2_draft_path, hybrid_ckpt_draft_path, tmp_path, private_cache):
    """Real recurrent/hybrid GGUFs (tests/fixtures/recurrent_gguf.py): each draft's rollback
    and its memory, from the header."""
    d = link(tmp_path / "d", lfm2_path, lfm2_draft_path, mamba2_draft_path, hybrid_ckpt_draft_path)
    report = pairs_report(d / lfm2_path.name, scan([d]))
    # The lfm2 fixture has 4 short-conv layers of 64 x (3 - 1) F32 values: 2,048 bytes.
    assert report.target.state_bytes == 2048
    assert report.rollback.startswith("rollback: snapshots (n_rs_seq 16): hybrid (lfm2) is in llama.cpp's "
                                      "snapshot list; memory 17 x 2.0 KB recurrent state = 35 KB")
    by_arch = {v.draft.architecture: v for v in report.compatible()}
    assert [v.draft.architecture for v in report.compatible()][0] == "lfm2"
    assert "hybrid draft, rollback: snapshots 35 KB (n_rs_seq 16)" in by_arch["lfm2"].notes
    assert not any("slower drafting" in n for n in by_arch["lfm2"].notes)  # snapshots: memory only
    assert "recurrent draft, rollback: checkpoint 40 KB + replay: slower drafting" in by_arch["mamba2"].notes
    assert "hybrid draft, rollback: checkpoint 30 KB + replay: slower drafting" in by_arch["granitehybrid"].notes
    # (All three are as large as the target, hence low tier anyway; rwkv above shows the rule.)


def test_cli_pairs_prints_the_targets_rollback(lfm2_path, mamba2_draft_path, tmp_path, capsys, private_cache):
    d = link(tmp_path / "d", lfm2_path, mamba2_draft_path)
    assert main(["models", "pairs", str(d / lfm2_path.name), str(d)]) == 0
    out = capsys.readouterr().out
    assert "rollback: snapshots (n_rs_seq 16): hybrid (lfm2)" in out
    assert "takes none" not in out and "warning:" not in out


def test_target_without_vocabulary_is_an_error(tmp_path, smol_path):
    from test_models import _gguf_bytes

    bare = tmp_path / "bare.gguf"
    bare.write_bytes(_gguf_bytes({"general.architecture": "llama"}, []))
    with pytest.raises(SpecdashError, match=r"bare.gguf: cannot check drafts against it: no tokenizer"):
        pairs_report(bare, scan([link(tmp_path / "d", smol_path)]))


def test_header_path_never_loads_llama_cpp(target_path, draft_path, tmp_path):
    d = link(tmp_path / "d", target_path, draft_path)
    code = (
        "import sys; from specdash.models.scan import scan; from specdash.models.pairs import pairs_report; "
        f"r = pairs_report({str(d / target_path.name)!r}, scan([{str(d)!r}], use_cache=False)); "
        "print(len(r.compatible()), 'llama_cpp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["1", "False"], out.stderr


# ---------------------------------------------------------------------------- the CLI


def test_cli_pairs_json(target_path, draft_path, smol_path, gemma_path, tmp_path, capsys):
    d = link(tmp_path / "d", draft_path, smol_path, gemma_path)
    assert main(["models", "pairs", "qwen2.5-coder-1.5b", str(d), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"]["label"] == "qwen2.5-coder-1.5b" and data["warnings"] == []
    assert data["ranking_rule"] == RANKING_RULE
    (good,) = data["compatible"]
    assert (good["draft"]["label"], good["rank"], good["family"], good["self_speculative"]) == (
        "qwen2.5-coder-0.5b", 1, "same family", False)
    assert [r["passed"] for r in good["rules"]] == [True] * 4
    bad = {v["draft"]["label"]: v for v in data["incompatible"]}
    assert bad["smollm2-135m"]["failed_rule"] == "vocab size"
    assert bad["smollm2-135m"]["evidence"] == "target 151,936, draft 49,152: differ by 102,784 (max 128)"
    assert bad["gemma3-270m"]["reason"] == "vocab type: target BPE (2), draft SPM (1)"


def test_cli_pairs_table_and_rule(smol_path, variants, gemma_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    d = link(tmp_path / "d", variants["plus-128"], variants["pard"], gemma_path)
    assert main(["models", "pairs", str(smol_path), str(d)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines[1:]), [line for line in lines if len(line) > 80]
    assert lines[2].rstrip() == "1 compatible draft(s), best first"
    assert lines[4].split()[:2] == ["1", "plus-128"]
    assert "token text" in out and "pard" in out and "vocab type" in out
    assert out.rstrip().endswith("(self-speculation).")  # the ranking rule, under the tables
    assert "Ranking: compatible drafts by score" in out


def test_cli_pairs_without_a_compatible_draft_exits_1(smol_path, gemma_path, tmp_path, capsys):
    assert main(["models", "pairs", str(smol_path), str(link(tmp_path / "d", gemma_path))]) == 1
    assert "no compatible draft found" in capsys.readouterr().out


def test_cli_pairs_bad_target_exits_2(tmp_path, capsys):
    assert main(["models", "pairs", "no-such-model", str(tmp_path)]) == 2
    assert "model 'no-such-model': not a known model" in capsys.readouterr().err


def test_cli_pairs_help_states_the_ranking_rule(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["models", "pairs", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert " ".join(RANKING_RULE.split()) in text


def test_cli_pairs_lists_the_files_it_could_not_read(smol_path, variants, tmp_path, capsys, monkeypatch):
    """`models scan` names unreadable files with the reason; `models pairs` said nothing
    about them, in text or JSON (issue 22)."""
    monkeypatch.setenv("COLUMNS", "200")
    d = link(tmp_path / "d", variants["plus-128"])
    with open(smol_path, "rb") as src:
        (d / "cut-header.gguf").write_bytes(src.read(100_000))
    (d / "notes.gguf").write_text("hello, this is not a model\n")
    expected = {"cut-header.gguf": "truncated GGUF: the header runs past the end of the file (100,000 bytes)",
                "notes.gguf": "not a GGUF file (starts with b'hell', expected b'GGUF')"}

    assert main(["models", "pairs", str(smol_path), str(d), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {Path(p["path"]).name: p["reason"] for p in data["unreadable"]} == expected
    assert all(Path(p["path"]).parent == d for p in data["unreadable"])
    assert [v["draft"]["label"] for v in data["compatible"]] == ["plus-128"]

    assert main(["models", "pairs", str(smol_path), str(d)]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [line for line in lines if "not read" in line]
    assert line.startswith("2 file(s) not read, so not judged: ")
    for name, reason in expected.items():
        assert f"{name}: {reason}" in line
    assert lines.index(line) > next(i for i, text in enumerate(lines) if "plus-128" in text)  # under the table


def test_cli_pairs_json_lists_none_unreadable_when_all_read(smol_path, variants, tmp_path, capsys):
    assert main(["models", "pairs", str(smol_path), str(link(tmp_path / "d", variants["pard"])), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["unreadable"] == []
