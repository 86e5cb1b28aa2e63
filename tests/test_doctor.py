"""`specdash doctor`, driven through its own register() so cli.py is not needed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from specdash.commands import doctor
from specdash.contract.errors import SpecdashError

TWO_NODE = Path(__file__).parent / "fixtures" / "sysfs_2node"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specdash")
    doctor.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["doctor", *argv])


def test_lines_warn_first_with_evidence_and_exit_0(capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # An explicit repack setting: the repack check's level would otherwise be this machine's.
    args = parse("--threads", "12", "--root", str(TWO_NODE), "--repack", "off")
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7
    levels = [line.split()[0] for line in lines]
    # threads, omp, numa, governor; thp; repack, costs (none kept in this test's own folder)
    assert levels == ["WARN", "WARN", "WARN", "WARN", "INFO", "OK", "OK"]
    assert lines[-2].split()[1] == "repack" and "repack off (repack = off)" in lines[-2]
    assert lines[-1].split()[1] == "costs" and "no kept cost profiles yet" in lines[-1]
    assert all("[read: " in line for line in lines)
    assert any("threads=12 exceeds the 8 physical cores" in line for line in lines)


def test_json(capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    args = parse("--json", "--root", str(TWO_NODE), "--repack", "on")
    assert args.func(args) == 0
    hints = json.loads(capsys.readouterr().out)["hints"]
    assert {h["key"]: h["level"] for h in hints} == {
        "numa": "warn",
        "governor": "warn",
        "threads": "info",
        "thp": "info",
        "omp": "ok",
        "repack": "ok",
        "costs": "ok",
    }
    assert [h["level"] for h in hints][:2] == ["warn", "warn"]
    assert all(set(h) == {"level", "key", "message", "evidence"} for h in hints)


def test_bad_threads_is_a_user_error():
    args = parse("--threads", "0")
    with pytest.raises(SpecdashError, match="--threads 0"):
        args.func(args)


def test_help_names_the_checks_and_the_exit_code(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    text = " ".join(capsys.readouterr().out.split())
    for needle in (
        "--threads N",
        "--json",
        "--root DIR",
        "OMP_NUM_THREADS",
        "NUMA",
        "--repack MODE",
        "AMX",
        "exit code is 0",
    ):
        assert needle in text


def test_doctor_on_this_machine(capsys):
    args = parse("--threads", "2")
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7 and sum(line.split()[1] == "repack" for line in lines) == 1
