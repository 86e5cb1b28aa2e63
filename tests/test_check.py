"""Pair compatibility (llama.cpp's rules) on real vocabularies, and `specdash check`."""

from __future__ import annotations

import pytest

from specdash.cli import main
from specdash.models.compat import check_pair
from specdash.models.resolve import resolve_model


def _rules(report) -> dict[str, bool]:
    return {r.name: r.passed for r in report.rules}


def test_default_qwen_pair_is_compatible():
    report = check_pair(resolve_model("qwen2.5-coder-1.5b"), resolve_model("qwen2.5-coder-0.5b"))
    assert report.compatible
    assert _rules(report) == {"vocab type": True, "BOS/EOS": True, "vocab size": True, "token text": True}
    evidence = {r.name: r.evidence for r in report.rules}
    assert evidence["vocab size"].startswith("target 151,936, draft 151,936: differ by 0")
    assert evidence["token text"] == "ids 5..151935: all 151,931 identical"


def test_qwen_and_gemma_differ_everywhere():
    report = check_pair(resolve_model("qwen2.5-coder-0.5b"), resolve_model("gemma3-270m"))
    assert not report.compatible
    assert _rules(report) == {"vocab type": False, "BOS/EOS": False, "vocab size": False, "token text": False}
    evidence = {r.name: r.evidence for r in report.rules}
    assert evidence["vocab type"] == "target BPE (2), draft SPM (1)"
    assert "add-BOS target False vs draft True" in evidence["BOS/EOS"]
    assert "differ by 110,208" in evidence["vocab size"]
    # the first differing ids, with both texts
    assert "5: '&' vs '[multimodal]'" in evidence["token text"]


def test_qwen_and_smollm2_share_type_and_specials_but_not_the_vocab():
    report = check_pair(resolve_model("qwen2.5-coder-0.5b"), resolve_model("smollm2-135m"))
    assert not report.compatible
    # Both are byte-level BPE and neither adds BOS/EOS, so only size and text tell them apart.
    assert _rules(report) == {"vocab type": True, "BOS/EOS": True, "vocab size": False, "token text": False}
    assert "target 151,936, draft 49,152" in report.failed()[0].evidence
    assert "neither adds BOS" in report.rules[1].evidence
    assert "cannot speculate" in report.summary() and "vocab size" in report.summary()


def test_cli_compatible_pair_exits_0(capsys):
    assert main(["check", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 4 and "FAIL" not in out
    assert "compatible: the draft can speculate" in out


def test_cli_incompatible_pair_exits_1(capsys):
    assert main(["check", "smollm2-135m", "gemma3-270m"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL") == 4
    assert "FAIL  vocab type  target BPE (2), draft SPM (1)" in out
    assert "NOT compatible: 4 rule(s) failed" in out


def test_cli_bad_input_exits_2(capsys, tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\0" * 64)
    assert main(["check", str(junk), "smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdash: error: ") and "junk.bin: not a GGUF file" in err
    assert main(["check", "smollm2-135m", "no-such-model"]) == 2
    assert "model 'no-such-model': not a known model" in capsys.readouterr().err


def test_cli_check_needs_two_models_unless_the_target_drafts_for_itself(capsys):
    # DRAFT may be left out only for a target with an MTP head (tests/test_mtp.py)
    assert main(["check", "smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert "give a DRAFT model" in err and "no MTP head" in err and len(err.strip().splitlines()) == 1


def test_unloadable_vocab_is_a_bad_input(capsys, tmp_path):
    from test_models import _gguf_bytes

    bad = tmp_path / "alien.gguf"
    bad.write_bytes(_gguf_bytes({"general.architecture": "alien"}, []))
    assert main(["check", str(bad), "smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert "alien.gguf: llama.cpp could not load its vocabulary" in err
    assert "unknown model architecture: 'alien'" in err


# ---------------------------------------------------------- rollback of recurrent models

def test_cli_check_says_how_each_model_rolls_back(capsys, smol_path, hybrid_ckpt_draft_path):
    assert main(["check", str(smol_path), str(hybrid_ckpt_draft_path)]) == 0
    out = capsys.readouterr().out
    assert "target rollback: KV cache (rejected positions are cut off; no extra memory)" in out
    assert ("draft  rollback: checkpoint + replay: hybrid (granitehybrid) has no llama.cpp snapshots; "
            "30 KB saved before each verify batch") in out


def test_cli_check_snapshot_target_and_recurrent_draft(capsys, lfm2_path, mamba2_draft_path):
    assert main(["check", str(lfm2_path), str(mamba2_draft_path)]) == 0
    out = capsys.readouterr().out
    assert ("target rollback: snapshots (n_rs_seq 16): hybrid (lfm2) is in llama.cpp's snapshot list; "
            "memory 17 x 2.0 KB recurrent state = 35 KB, 33 KB more than plain; no replay") in out
    assert "draft  rollback: checkpoint + replay: recurrent (mamba2)" in out and "40 KB saved" in out
    assert "takes none" not in out
