"""benchmarks/recurrent_rollback.py reads what it must: the engine's rollback fields from
`specdash run --json` (StepEvent.rollback / rollback_ms / checkpoint_bytes,
SettingsEvent.rollback), and prices snapshot memory from the header. The benchmark itself
is run by hand (speed is never a test)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "recurrent_rollback.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("recurrent_rollback", _PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["recurrent_rollback"] = module
    spec.loader.exec_module(module)
    return module


def _step(drafted, accepted, rollback, ms, ckpt, **extra):
    return {"event": "step", "drafted": drafted, "accepted": accepted, "tokens": [1] * (accepted + 1),
            "draft_ms": 1.0, "verify_ms": 4.0, "other_ms": 0.5, "rollback": rollback,
            "rollback_ms": ms, "checkpoint_bytes": ckpt, **extra}


def _stream(steps, settings_rollback="rollback: checkpoint 40 KB + replay"):
    events = [{"event": "settings", "rollback": settings_rollback}, *steps,
              {"event": "summary", "tokens_per_s": 25.0, "n_generated": 9, "num_draft_tokens": 8,
               "num_accepted_tokens": 5, "n_prompt": 14}]
    return "\n".join(json.dumps(e) for e in events) + "\n"


def test_parses_the_rollback_fields(bench):
    side = bench.parse_specdash_run(_stream([
        _step(4, 4, "checkpoint", 0.2, 40572, rollback_replay_ms=0.0),
        _step(4, 1, "checkpoint", 3.0, 40572, rollback_replay_ms=2.5),
        _step(0, 0, "checkpoint", 0.0, 0, rollback_replay_ms=0.0),
    ]))
    assert side.strategy == "checkpoint" and side.description == "rollback: checkpoint 40 KB + replay"
    assert side.steps == 3 and side.partial == 1
    assert side.rollback_ms == pytest.approx({"rollback_ms": 3.2 / 3, "rollback_replay_ms": 2.5 / 3})
    assert side.checkpoint_bytes == 40572 and side.step_ms == pytest.approx(5.5)
    assert (side.tokens_per_s, side.drafted, side.accepted, side.n_prompt) == (25.0, 8, 5, 14)
    assert len(side.tokens) == 5 + 2 + 1


def test_a_tree_without_the_engine_rollback_says_so(bench):
    step = _step(4, 1, "checkpoint", 1.0, 0)
    del step["rollback_ms"]
    with pytest.raises(bench.BenchError, match=r"no rollback_ms: the engine's rollback \(issue 19\)"):
        bench.parse_specdash_run(_stream([step]))


def test_snapshot_memory_from_the_header_and_the_count_in_force(bench, lfm2_path):
    model = bench.Model("lfm2-tiny", "lfm2", Path(lfm2_path), Path(lfm2_path))
    assert bench.snapshot_memory(model, "rollback: snapshots (n_rs_seq 8)") == "18 KB (9 x 2.0 KB)"
    assert bench.snapshot_memory(model, "") == "35 KB (17 x 2.0 KB)"  # the default count


def test_quick_and_bad_arguments(bench, capsys):
    args = bench.parse_args(["--quick"])
    assert (args.size, args.rounds, args.tokens, args.baseline) == ("tiny", 1, 32, False)
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--rounds", "0"])
    assert exc.value.code == 2 and "--rounds must be >= 1, got 0" in capsys.readouterr().err
