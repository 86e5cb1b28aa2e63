"""`specdash export`: settings as a llama-server command line or router preset."""

from __future__ import annotations

import argparse

from specdash.commands.common import add_engine_arguments, load_settings
from specdash.contract.errors import SpecdashError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="print the settings as a llama-server command line or router preset",
        description="Turn specdash settings into a llama-server launch: a command line "
        "(-m, -md or --spec-type, --spec-draft-n-max, --spec-draft-p-min, --override-kv, -t, -c) "
        "or a router-mode preset INI section (llama-server --models-preset FILE). The settings "
        "come from the flags and config, like `specdash run`, or from a recording (its last settings).",
    )
    add_engine_arguments(p)
    p.add_argument("--recording", metavar="FILE", help="export the last settings recorded in FILE")
    p.add_argument("--format", choices=("command", "preset", "both"), default="command",
                   help="what to print (default command)")
    p.add_argument("--name", metavar="NAME", help="the preset's section name (default model@draft-kK)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdash.contract.events import SettingsEvent, StepEvent
    from specdash.records.export import command_line, preset_section

    if args.recording:
        from specdash.records.recording import read_recording

        rec = read_recording(args.recording)
        found = [ev for ev in rec.events if isinstance(ev, SettingsEvent)]
        if not found:
            raise SpecdashError(f"{args.recording}: no settings recorded")
        st = found[-1]
        steps = [ev for ev in rec.events if isinstance(ev, StepEvent)]
        k = steps[-1].k if st.adaptive and steps else None
    else:
        st, k = settings_event(load_settings(args).engine), None
    if args.format in ("command", "both"):
        print(command_line(st, k=k))
    if args.format == "both":
        print()
    if args.format in ("preset", "both"):
        print(preset_section(st, k=k, name=args.name))
    return 0


def settings_event(settings):
    """What an engine with `settings` would report, with the models' files resolved
    (cached registry models or paths; nothing is downloaded for an export)."""
    from specdash.engine.drafters import is_model
    from specdash.contract.events import SettingsEvent
    from specdash.models.resolve import resolve_model

    target = resolve_model(settings.target, fetch=False)
    draft_path = str(resolve_model(settings.draft, fetch=False)) if is_model(settings.draft) else None
    drafter = settings.draft
    if settings.draft == "chain":
        from specdash.models.mtp_info import mtp_head
        from specdash.models.registry import DEFAULT_DRAFT, model_path

        if mtp_head(target).layers:  # the session's chain ends with the target's own head
            drafter, draft_path = "chain: edit → lookup → suffix → mtp", None
        else:
            draft_path = str(model_path(DEFAULT_DRAFT)) if model_path(DEFAULT_DRAFT).is_file() else None
    return SettingsEvent(source="engine", drafter=drafter, target_path=str(target),
                         draft_path=draft_path, **settings.flat())
