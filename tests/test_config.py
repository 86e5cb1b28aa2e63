"""specdash.config: discovery, loading with one-line errors, saving, CLI overrides."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from specdash.config import (
    ENV_VAR,
    SECTIONS,
    Config,
    UISettings,
    apply_overrides,
    find_config_path,
    load_config,
    save_config,
    to_toml,
)
from specdash.engine.settings import EngineSettings, SamplingParams
from specdash.contract.errors import SpecdashError

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.toml"


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SpecdashError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert info.value.exit_code == 2
    return message


# --- the example file cannot drift from the code ---------------------------------


def test_example_file_loads_and_equals_defaults():
    assert load_config(EXAMPLE) == Config()


def test_example_file_mentions_every_key_in_its_section():
    """Optional keys are commented out in the example; they must still be documented."""
    documented: set[tuple[str, str]] = set()
    section = None
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        if header := re.fullmatch(r"\[(\w+)\]", line.strip()):
            section = header.group(1)
        elif key := re.match(r"#?\s*(\w+)\s*=", line.strip()):
            documented.add((section, key.group(1)))
    every_key = {(s, k) for s, table in to_toml(_all_set()).items() for k in table}
    assert every_key - documented == set()


def _all_set() -> Config:
    """A config with no None anywhere and no value equal to its default."""
    return Config(
        engine=EngineSettings(
            target="/models/t.gguf",
            draft="lookup",
            k=7,
            sampling=SamplingParams(temperature=0.7, top_k=40, top_p=0.9, seed=1234),
            threads=3,
            ctx=2048,
            max_tokens=99,
            raw=True,
            adaptive=True,
            k_min=1,
            k_max=9,
            draft_p_min=0.25,
            lookup_min_ngram=2,
            lookup_max_ngram=5,
            experts=2,
        ),
        ui=UISettings(theme="nord", refresh=0.25, screenshots_dir="/tmp/shots", prompt='say "hi"\n',
                      record_dir="~/recs", model_dirs=["~/models", "/srv/gguf"]),
    )


def test_every_setting_field_is_reachable_from_toml():
    """If a field is added to EngineSettings/SamplingParams/UISettings/HealthThresholds, it needs a key."""
    from specdash.monitor.health import HealthThresholds

    doc = to_toml(_all_set())
    names = {k for table in doc.values() for k in table} | {"prompt_file"}
    fields = (
        {f.name for f in dataclasses.fields(EngineSettings)} - {"sampling"}
        | {f.name for f in dataclasses.fields(SamplingParams)}
        | {f.name for f in dataclasses.fields(UISettings)}
        | {f.name for f in dataclasses.fields(HealthThresholds)}
    )
    assert fields == names
    assert set(doc) == set(SECTIONS)


# --- round trip --------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        Config(),
        _all_set(),
        Config(ui=UISettings(prompt_file="~/prompts/p.txt")),
        Config(engine=EngineSettings(sampling=SamplingParams(temperature=1, seed=0))),
    ],
    ids=["defaults", "all-set", "prompt-file", "int-for-float"],
)
def test_save_then_load_round_trips(tmp_path, config):
    path = save_config(config, tmp_path / "sub" / "config.toml")
    assert load_config(path) == config
    assert not list(path.parent.glob("*.tmp"))


def test_none_valued_settings_are_omitted_from_the_file(tmp_path):
    text = save_config(Config(), tmp_path / "c.toml").read_text()
    for name in ("threads", "experts", "seed", "prompt", "prompt_file"):
        assert not re.search(rf"^{name}\s*=", text, re.M)
    assert re.search(r"^k = 4$", text, re.M)


def test_save_into_unwritable_place_is_a_one_line_error(tmp_path):
    blocker = write(tmp_path, "", "file")
    with pytest.raises(SpecdashError, match="cannot write config"):
        save_config(Config(), blocker / "config.toml")


# --- load errors ---------------------------------------------------------------------


def test_partial_file_keeps_defaults_for_the_rest(tmp_path):
    config = load_config(write(tmp_path, "[speculative]\nk = 8\n[sampling]\ntemperature = 1\n"))
    assert config.engine.k == 8
    assert config.engine.sampling.temperature == 1.0
    assert isinstance(config.engine.sampling.temperature, float)
    assert config.engine.adaptive is False  # a k without an adaptive key is that K, fixed
    assert dataclasses.replace(config.engine, k=4, adaptive=True, sampling=SamplingParams()) == EngineSettings()


def test_none_path_means_defaults():
    assert load_config(None) == Config()


def test_brief_example_message(tmp_path):
    message = load_error(tmp_path, "[speculative]\nk = -1\n")
    assert message.endswith("config.toml: [speculative] k = -1: must be an integer 0..64")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # out of range
        ("[model]\nthreads = 0", "[model] threads = 0: must be an integer >= 1"),
        ("[model]\nctx = 128", "[model] ctx = 128: must be an integer >= 256"),
        ("[model]\nexperts = 0", "[model] experts = 0: must be an integer >= 1"),
        ("[sampling]\ntemperature = 5.5", "[sampling] temperature = 5.5: must be a number 0..5"),
        ("[sampling]\ntemperature = -0.1", "[sampling] temperature = -0.1: must be a number 0..5"),
        ("[sampling]\ntop_p = 0", "[sampling] top_p = 0: must be a number > 0 and <= 1"),
        ("[sampling]\ntop_p = 1.5", "[sampling] top_p = 1.5: must be a number > 0 and <= 1"),
        ("[sampling]\ntop_k = -3", "[sampling] top_k = -3: must be an integer >= 0"),
        ("[sampling]\nseed = -1", "[sampling] seed = -1: must be an integer 0..4294967295"),
        ("[speculative]\ndraft_p_min = 2", "[speculative] draft_p_min = 2: must be a number 0..1"),
        ("[speculative]\nlookup_max_ngram = 17",
         "[speculative] lookup_max_ngram = 17: must be an integer 1..16"),
        ("[speculative]\nlookup_min_ngram = 0",
         "[speculative] lookup_min_ngram = 0: must be an integer 1..16"),
        ("[generation]\nmax_tokens = 0", "[generation] max_tokens = 0: must be an integer >= 1"),
        ("[ui]\nrefresh = 0.05", "[ui] refresh = 0.05: must be a number 0.1..60"),
        ("[ui]\nrefresh = 61", "[ui] refresh = 61: must be a number 0.1..60"),
        ("[sampling]\ntemperature = nan", "[sampling] temperature = nan: must be a number 0..5"),
        # wrong type
        ("[speculative]\nk = true", "[speculative] k = true: must be an integer 0..64"),
        ("[speculative]\nk = 2.0", "[speculative] k = 2.0: must be an integer 0..64"),
        ('[model]\nctx = "4096"', '[model] ctx = "4096": must be an integer >= 256'),
        ("[speculative]\nadaptive = 1", "[speculative] adaptive = 1: must be true or false"),
        ('[generation]\nraw = "yes"', '[generation] raw = "yes": must be true or false'),
        ("[sampling]\ntop_p = false", "[sampling] top_p = false: must be a number > 0 and <= 1"),
        ("[model]\ntarget = 3", "[model] target = 3: must be a non-empty string"),
        ('[model]\ndraft = ""', '[model] draft = "": must be a non-empty string'),
        ("[ui]\ntheme = [1, 2]", "[ui] theme = [...] (an array): must be a non-empty string"),
        ("[ui]\ntheme = {a = 1}", "[ui] theme = {...} (a table): must be a non-empty string"),
        ("[model]\nctx = 1979-05-27", "[model] ctx = 1979-05-27: must be an integer >= 256"),
        # cross-key
        ("[speculative]\nk_min = 8\nk_max = 4",
         "[speculative] k_min = 8, k_max = 4: k_min must be <= k_max"),
        ("[speculative]\nlookup_min_ngram = 6",
         "[speculative] lookup_min_ngram = 6, lookup_max_ngram = 4: "
         "lookup_min_ngram must be <= lookup_max_ngram"),
        ('[generation]\nprompt = "a"\nprompt_file = "b"',
         "[generation] prompt and prompt_file are both set: keep one"),
    ],
)
def test_bad_value_names_key_value_and_what_is_allowed(tmp_path, text, expected):
    assert load_error(tmp_path, text + "\n").endswith(": " + expected)


def test_int_is_accepted_for_a_float_key(tmp_path):
    config = load_config(write(tmp_path, "[ui]\nrefresh = 2\n[speculative]\ndraft_p_min = 1\n"))
    assert config.ui.refresh == 2.0 and isinstance(config.ui.refresh, float)
    assert config.engine.draft_p_min == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[speculative]\nkk = 3", "unknown key [speculative] kk: did you mean k?"),
        ("[sampling]\ntemprature = 0.5", "unknown key [sampling] temprature: did you mean temperature?"),
        ("[model]\nk = 3", "unknown key [model] k: k belongs in [speculative]"),
        ("[ui]\nmax_token = 3", "unknown key [ui] max_token: did you mean [generation] max_tokens?"),
        ("[ui]\nzzz = 3", "unknown key [ui] zzz: valid keys in [ui]: theme, refresh, screenshots_dir"),
        ("[modle]\ntarget = 'x'", "unknown section [modle]: did you mean [model]?"),
        ("[zzz]\na = 1", "unknown section [zzz]: valid: [model], [speculative], [sampling], "
                         "[generation], [ui]"),
        ("[model.extra]\na = 1", "unknown key [model] extra: valid keys in [model]: target, "),
        ("k = 3", "top-level key k = 3: put it under [speculative]"),
        ("zzz = 3", "top-level key zzz = 3: keys belong in a section: [model], "),
    ],
)
def test_unknown_names_get_a_suggestion(tmp_path, text, expected):
    assert expected in load_error(tmp_path, text + "\n")


def test_toml_syntax_error_has_line_and_column(tmp_path):
    message = load_error(tmp_path, "[model]\nctx = 4096\nthreads == 2\n")
    assert "invalid TOML" in message
    assert "line 3, column" in message


def test_empty_file_means_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == Config()


def test_unreadable_file_is_a_one_line_error(tmp_path):
    folder = tmp_path / "config.toml"
    folder.mkdir()
    with pytest.raises(SpecdashError, match=r"config\.toml: cannot read config: "):
        load_config(folder)
    with pytest.raises(SpecdashError, match="cannot read config: No such file"):
        load_config(tmp_path / "missing.toml")


def test_non_utf8_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b"[model]\ntarget = \"\xff\"\n")
    with pytest.raises(SpecdashError, match="not UTF-8 text"):
        load_config(path)


# --- discovery -----------------------------------------------------------------------


@pytest.fixture
def homes(tmp_path):
    """A fake HOME and XDG_CONFIG_HOME, each with a specdash/config.toml."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    for base in (home / ".config", xdg):
        (base / "specdash").mkdir(parents=True)
        (base / "specdash" / "config.toml").write_text("")
    return home, xdg


def test_discovery_order(tmp_path, homes):
    home, xdg = homes
    explicit = write(tmp_path, "", "explicit.toml")
    from_env = write(tmp_path, "", "env.toml")
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(xdg), ENV_VAR: str(from_env)}
    assert find_config_path(str(explicit), env) == explicit
    assert find_config_path(None, env) == from_env
    del env[ENV_VAR]
    assert find_config_path(None, env) == xdg / "specdash" / "config.toml"
    del env["XDG_CONFIG_HOME"]
    assert find_config_path(None, env) == home / ".config" / "specdash" / "config.toml"


def test_relative_or_empty_xdg_config_home_is_ignored(homes):
    home, _ = homes
    expected = home / ".config" / "specdash" / "config.toml"
    for xdg in ("", "relative/dir"):
        assert find_config_path(None, {"HOME": str(home), "XDG_CONFIG_HOME": xdg}) == expected


def test_missing_default_file_is_not_an_error(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "nothing")}
    assert find_config_path(None, env) is None
    assert find_config_path(None, {"HOME": str(tmp_path), ENV_VAR: ""}) is None


def test_named_file_that_does_not_exist_is_an_error(tmp_path, homes):
    home, _ = homes
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(SpecdashError, match=f"--config {re.escape(missing)}: no such file"):
        find_config_path(missing, {"HOME": str(home)})
    with pytest.raises(SpecdashError, match=rf"\${ENV_VAR}={re.escape(missing)}: no such file"):
        find_config_path(None, {"HOME": str(home), ENV_VAR: missing})
    with pytest.raises(SpecdashError, match="not a file"):
        find_config_path(str(tmp_path), {"HOME": str(home)})


def test_explicit_path_expands_home(homes):
    home, _ = homes
    found = find_config_path("~/.config/specdash/config.toml", {"HOME": str(home)})
    assert found == home / ".config" / "specdash" / "config.toml"


# --- CLI overrides -------------------------------------------------------------------

_DESTS = ["target", "draft", "k", "temp", "top_k", "top_p", "seed", "max_tokens", "threads",
          "ctx", "raw", "adaptive", "experts", "theme", "refresh", "prompt", "prompt_file"]


def cli(**given) -> argparse.Namespace:
    """What the lead's parser produces: every dest present, None unless given."""
    return argparse.Namespace(**({d: None for d in _DESTS} | given))


def test_flags_not_given_leave_the_file_alone():
    config = _all_set()
    assert apply_overrides(config, cli()) == config
    assert apply_overrides(config, argparse.Namespace()) == config


def test_given_flags_override_the_file():
    base = _all_set()
    result = apply_overrides(base, cli(
        target="t2", draft="none", k=0, temp=0, top_k=0, top_p=1.0, seed=7, max_tokens=5,
        threads=1, ctx=512, raw=False, adaptive=False, experts=4, theme="x", refresh=3,
    ))
    assert result.engine == EngineSettings(
        target="t2", draft="none", k=0,
        sampling=SamplingParams(temperature=0.0, top_k=0, top_p=1.0, seed=7),
        threads=1, ctx=512, max_tokens=5, raw=False, adaptive=False,
        k_min=1, k_max=9, draft_p_min=0.25, lookup_min_ngram=2, lookup_max_ngram=5, experts=4,
    )
    assert (result.ui.theme, result.ui.refresh) == ("x", 3.0)
    assert base == _all_set()  # the input is not mutated


def test_override_goes_through_a_real_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--temp", type=float, default=None)
    parser.add_argument("--raw", action=argparse.BooleanOptionalAction, default=None)
    config = apply_overrides(Config(), parser.parse_args(["--k", "2", "--raw"]))
    assert (config.engine.k, config.engine.raw, config.engine.sampling.temperature) == (2, True, 0.0)


def test_prompt_flag_replaces_prompt_file_and_vice_versa():
    with_file = Config(ui=UISettings(prompt_file="p.txt"))
    assert apply_overrides(with_file, cli(prompt="hi")).ui == UISettings(prompt="hi")
    with_prompt = Config(ui=UISettings(prompt="hi"))
    assert apply_overrides(with_prompt, cli(prompt_file="q.txt")).ui == UISettings(prompt_file="q.txt")
    with pytest.raises(SpecdashError, match="--prompt and --prompt-file"):
        apply_overrides(Config(), cli(prompt="a", prompt_file="b"))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"k": -1}, "--k -1: must be an integer 0..64"),
        ({"temp": 9.0}, "--temp 9.0: must be a number 0..5"),
        ({"top_p": 0.0}, "--top-p 0.0: must be a number > 0 and <= 1"),
        ({"refresh": 0.0}, "--refresh 0.0: must be a number 0.1..60"),
        ({"experts": 0}, "--experts 0: must be an integer >= 1"),
    ],
)
def test_bad_flag_value_names_the_flag(given, expected):
    with pytest.raises(SpecdashError) as info:
        apply_overrides(Config(), cli(**given))
    assert str(info.value) == expected
