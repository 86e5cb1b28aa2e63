"""The command vocabulary: one entry per command, and everything that knows a command reads
it from here. No Textual.

An entry (`CommandSpec`) gives the command's name, its types in the contract (events.py),
its words and syntax in `run --at/--schedule`, the parser for them, and the dashboard keys
that issue it (`Key`). From the entries come:

    COMMAND_NAMES      type -> name: what SettingsEvent.supports / .unavailable list
    parse_command      the schedule parser; SCHEDULE_SYNTAX its one-line help
    tui/controls.py    the dashboard's controls (footer, help screen, palette) ...
    tui/app_base.py    ... and its key bindings, in registry order

The capability rule: a source lists the names it takes *now* in SettingsEvent.supports
(and may say why not in .unavailable). Anything it does not list is refused, by the UI
(the key leaves the footer, the help says why) and by the source (a NoticeEvent). So a
command added here is unavailable on every source until that source says it takes it.

Adding a command: its dataclass in events.py (and the Command union), an entry here,
the source(s) that apply it (engine/engine.py `_apply`, adding its name to `supports`),
and a test. A key with `send` needs no dashboard code at all; one that needs a dialog or
the current state names an `action` the dashboard implements (tui/app_controls.py).

Not every entry is a single command: "sweep" is a capability (rerun the prompt with each
K and report each run's Summary), listed by the sources that can, with the `k` key.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from specdash.contract.events import (Command, ContractError, Forget, NewPrompt, Pause, Resume, Seek, SetAdaptive,
                             SetCut, SetDrafter, SetExperts, SetK, SetSampling, SetSpeed, Stop)

# (word, value or None when there was no '=', the whole token for messages) -> (command, pause seconds)
Parser = Callable[[str, "str | None", str], "tuple[Command, float]"]


@dataclass(frozen=True, slots=True)
class Key:
    """A dashboard key that issues a command.

    `action` names the dashboard's `action_<action>`. With `send`, the dashboard sends
    `send()` itself (no code of its own needed); without, it implements the action (a
    dialog, or a value computed from the current state, as K up is)."""

    keys: str  # Textual key names, comma-separated ("plus,equals_sign")
    display: str  # as the footer and the help show it ("+")
    action: str
    label: str  # the footer's word
    help: str  # the help screen's and the palette's line
    footer: bool = True  # False: in the help and the palette only (no room at 80 columns)
    group: str = ""  # keys sharing one footer entry ("K": "+ - K")
    send: Callable[[], Command] | None = None
    needs_source: bool = True  # False: works while the source is not running (n restarts it)
    spelled: str = ""  # as the help screen names it, when not `display` ("space" for ␣)


@dataclass(frozen=True, slots=True)
class CommandSpec:
    name: str  # in SettingsEvent.supports / .unavailable
    description: str
    types: tuple[type, ...] = ()  # the contract's dataclasses; () for a capability (sweep)
    words: tuple[str, ...] = ()  # schedule words (before any '='); () = not schedulable
    syntax: str = ""  # the schedule help's part for it; "" = parsed but not advertised
    parse: Parser | None = None
    keys: tuple[Key, ...] = ()
    # Why a source that does not list it cannot take it, when the source gives no reason.
    unsupported: str = ""


COMMANDS: dict[str, CommandSpec] = {}  # by name, in registration order (= the footer's order)
COMMAND_NAMES: dict[type, str] = {}  # command type -> name
_WORDS: dict[str, CommandSpec] = {}


def register(spec: CommandSpec) -> CommandSpec:
    """Add a command to the vocabulary (the built-ins below; tests add their own)."""
    if spec.name in COMMANDS:
        raise ValueError(f"command {spec.name!r} is already registered")
    clash = [w for w in spec.words if w in _WORDS]
    if clash:
        raise ValueError(f"command {spec.name!r}: word {clash[0]!r} belongs to {_WORDS[clash[0]].name!r}")
    COMMANDS[spec.name] = spec
    COMMAND_NAMES.update({t: spec.name for t in spec.types})
    _WORDS.update({w: spec for w in spec.words})
    return spec


def unregister(name: str) -> None:
    spec = COMMANDS.pop(name)
    for t in spec.types:
        COMMAND_NAMES.pop(t, None)
    for w in spec.words:
        _WORDS.pop(w, None)


def name_of(cmd: object) -> str:
    """The registry name of a command ("" for a type nobody registered)."""
    return COMMAND_NAMES.get(type(cmd), "")


def schedule_syntax() -> str:
    return ", ".join(spec.syntax for spec in COMMANDS.values() if spec.syntax)


def parse_command(text: str) -> tuple[Command, float]:
    """One command in schedule syntax -> (command, pause seconds). `pause=2s` means
    Pause, then Resume after 2 s (the seconds are returned; the caller schedules the
    Resume). Syntax only: ranges are the source's to refuse, with a notice.
    Raises ContractError naming the token."""
    token = text.strip()
    word, eq, value = token.partition("=")
    word, value = word.strip().lower(), value.strip()
    spec = _WORDS.get(word)
    if spec is None or spec.parse is None:
        what = f"unknown command {word!r}" if eq else "unknown command"
        raise ContractError(f"{token!r}: {what}; use {schedule_syntax()}")
    if eq and not value:
        raise ContractError(f"{token!r}: no value after '='")
    try:
        return spec.parse(word, value if eq else None, token)
    except ValueError as exc:
        if isinstance(exc, ContractError):
            raise
        raise ContractError(f"{token!r}: {value!r} is not a number") from None


# --- parsers of the built-in commands ---------------------------------------------------


def _int(text: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(text)
    return int(text)


def _needs(value: str | None, token: str, what: str) -> str:
    if value is None:
        raise ContractError(f"{token!r}: {what}")
    return value


def _parse_k(word: str, value: str | None, token: str) -> tuple[Command, float]:
    return SetK(_int(_needs(value, token, "k takes a number: k=N"))), 0.0


def _parse_draft(word: str, value: str | None, token: str) -> tuple[Command, float]:
    return SetDrafter(_needs(value, token, "draft takes a source: draft=auto|lookup|suffix|mtp|chain|none|MODEL")), 0.0


def _parse_temp(word: str, value: str | None, token: str) -> tuple[Command, float]:
    return SetSampling(temperature=float(_needs(value, token, "temp takes a number: temp=T"))), 0.0


def _parse_adaptive(word: str, value: str | None, token: str) -> tuple[Command, float]:
    text = _needs(value, token, "adaptive takes on or off").lower()
    on = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(text)
    if on is None:
        raise ContractError(f"{token!r}: adaptive takes on or off")
    return SetAdaptive(on), 0.0


def _parse_experts(word: str, value: str | None, token: str) -> tuple[Command, float]:
    return SetExperts(_int(_needs(value, token, "experts takes a number: experts=N"))), 0.0


def _parse_cut(word: str, value: str | None, token: str) -> tuple[Command, float]:
    return SetCut(float(_needs(value, token, "cut takes a number: cut=P (0 = off)"))), 0.0


def _parse_pause(word: str, value: str | None, token: str) -> tuple[Command, float]:
    if value is None:
        return (Resume() if word == "resume" else Pause()), 0.0
    if word == "resume":
        raise ContractError(f"{token!r}: resume takes no value")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s)?", value)
    if not m:
        raise ContractError(f"{token!r}: pause takes a duration like 2s or 500ms")
    return Pause(), float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


def _plain(cmd: Command) -> Parser:
    """A parser for a word that takes no value (stop, forget)."""
    def parse(word: str, value: str | None, token: str) -> tuple[Command, float]:
        if value is not None:
            raise ContractError(f"{token!r}: {word} takes no value")
        return cmd, 0.0
    return parse


# --- the built-in vocabulary, in the footer's order ----------------------------------------

register(CommandSpec(
    "k", "the number of tokens drafted per step", (SetK,), ("k",), "k=N", _parse_k,
    keys=(Key("plus,equals_sign", "+", "k_up", "K up", "K up: draft one more token per step", group="K"),
          Key("minus", "-", "k_down", "K down", "K down (K=0 is plain decoding)", group="K"))))
register(CommandSpec(
    "draft", "the draft source", (SetDrafter,), ("draft", "drafter"),
    "draft=auto|lookup|suffix|mtp|chain|none|MODEL", _parse_draft,
    keys=(Key("d", "d", "pick_draft", "draft",
              "choose the draft source (model, prompt lookup, suffix, chain, none)"),)))
register(CommandSpec(
    "temp", "sampling: temperature, top-k, top-p", (SetSampling,), ("temp", "temperature"), "temp=T", _parse_temp,
    keys=(Key("t", "t", "set_temperature", "temp", "set the sampling temperature (0 = greedy)"),)))
register(CommandSpec(
    "pause", "pause and resume generation (a replay: playback)", (Pause, Resume), ("pause", "resume"),
    "pause=DURATION (e.g. 2s), pause, resume", _parse_pause,
    keys=(Key("space", "␣", "toggle_pause", "pause", "pause / resume generation", spelled="space"),)))
register(CommandSpec(
    "prompt", "generate for a new prompt now", (NewPrompt,),
    keys=(Key("n", "n", "new_prompt", "new", "type a new prompt (replaces the one running)", needs_source=False),)))
register(CommandSpec(
    "adaptive", "adaptive K on or off", (SetAdaptive,), ("adaptive",), "adaptive=on|off", _parse_adaptive,
    keys=(Key("a", "a", "toggle_adaptive", "adapt",
              "adaptive K on/off: the engine picks K (and K=0) from measured costs"),)))
register(CommandSpec(
    "experts", "a MoE target's active experts (reloads it)", (SetExperts,), ("experts",), "experts=N", _parse_experts,
    keys=(Key("e", "e", "set_experts", "experts", "MoE target: number of active experts (reloads the target)"),)))
register(CommandSpec(
    "cut", "the draft model's joint confidence cut (draft_p_joint)", (SetCut,), ("cut",), "cut=P", _parse_cut,
    keys=(Key("c", "c", "set_cut", "cut",
              "draft model's joint confidence cut: a draft stops where the product of its top-token "
              "probabilities falls below it (0 = off, 0.1 the default)", footer=False),),
    unsupported="only the embedded engine drafts with a confidence cut of its own"))
register(CommandSpec(
    "speed", "a replay's playback speed", (SetSpeed,),
    keys=(Key("left_square_bracket", "[", "slower", "slower", "replay: slower (down to 0.5x)"),
          Key("right_square_bracket", "]", "faster", "faster", "replay: faster (up to 16x)")),
    unsupported="only a replay has a speed"))
register(CommandSpec(
    "seek", "a replay's position", (Seek,),
    keys=(Key("left", "←", "seek_back", "-10s", "replay: back 10 s", send=lambda: Seek(by=-10.0)),
          Key("right", "→", "seek_forward", "+10s", "replay: forward 10 s", send=lambda: Seek(by=10.0)),
          Key("home", "home", "seek_start", "start", "replay: to the start", footer=False, send=lambda: Seek(to=0.0)),
          Key("end", "end", "seek_end", "end", "replay: to the end", footer=False, send=lambda: Seek())),
    unsupported="only a replay can seek"))
register(CommandSpec(
    "sweep", "rerun the prompt at each K and compare (a capability: NewPrompt and SetK, driven by the UI)",
    keys=(Key("k", "k", "sweep", "sweep",
              "K sweep: plain and each K on this prompt, plotted; apply or save the best. In it, t sweeps at "
              "several temperatures"),),
    unsupported="a sweep reruns the prompt at each K: it needs the embedded engine (specdash sweep)"))
register(CommandSpec("stop", "stop the source", (Stop,), ("stop",), "stop", _plain(Stop())))
register(CommandSpec("forget", "start cold: forget adaptive K's and the suffix drafter's memory", (Forget,),
                     ("forget",), "", _plain(Forget())))

SCHEDULE_SYNTAX = schedule_syntax()  # the built-ins' (run --help)

__all__ = ["COMMANDS", "COMMAND_NAMES", "SCHEDULE_SYNTAX", "CommandSpec", "Key", "name_of", "parse_command",
           "register", "schedule_syntax", "unregister"]
