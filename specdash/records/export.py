"""The running settings as a llama-server launch: a command line, or a router preset.

This is the last step of the tuning loop: what was measured here is what gets served.
The mapping, for the llama.cpp vendored with llama-cpp-python (common/arg.cpp):

    target                  -m PATH
    draft model             -md PATH --spec-draft-n-max K [--spec-draft-p-min P]
    lookup                  --spec-type ngram-simple --spec-ngram-simple-size-n N
                            --spec-ngram-simple-size-m K  (N: the longest n-gram matched)
    suffix                  --spec-type ngram-cache (the session's own n-gram cache)
    mtp (the target's head) --spec-type draft-mtp --spec-draft-n-max K [--spec-draft-p-min P]
    chain                   --spec-type ngram-simple,draft-simple (or ,draft-mtp when the
                            chain ends with the target's head) with both of the above
    auto                    as the chain, and a note: llama-server has no per-step choice
                            by expected speed, and no suffix copies
    none or K=0             no speculation flags
    experts override        --override-kv ARCH.expert_used_count=int:N
    threads, ctx            -t N, -c N
    temperature             --temp T

llama-server has no adaptive K (and adaptive K is specdash's default): an adaptive
session exports the K its last step ran with, adaptive settings that never ran (`specdash
export` from flags or a config) export the K adaptive would start at, and either says
which fixed K it wrote in a comment.
"""

from __future__ import annotations

import shlex

from specdash.contract.names import display_name
from specdash.engine.drafters import is_model
from specdash.contract.errors import SpecdashError
from specdash.contract.events import SettingsEvent


def _arch(target_path: str) -> str:
    from specdash.models.gguf_header import gguf_metadata

    try:
        return str(gguf_metadata(target_path).get("general.architecture") or "llama")
    except Exception as exc:  # the file may be on another machine (a recording)
        raise SpecdashError(f"export: cannot read {target_path} for its architecture ({exc}); "
                            "the expert override needs it") from None


def _draft_limits(st: SettingsEvent, k: int, confidences: str, notes: list[str]) -> list[str]:
    """A drafting model's length flags (--spec-draft-n-max K, --spec-draft-p-min P); the
    joint confidence cut has no flag and becomes a note."""
    args = ["--spec-draft-n-max", str(k)]
    if st.draft_p_min:
        args += ["--spec-draft-p-min", f"{st.draft_p_min:g}"]
    if st.draft_p_joint:
        notes.append(f"draft_p_joint {st.draft_p_joint:g} (stop a draft where the product of the "
                     f"{confidences} falls below it) has no llama-server flag: exported "
                     "without it, so its drafts run to K")
    return args


def server_args(st: SettingsEvent, *, k: int | None = None) -> tuple[list[str], list[str]]:
    """(arguments after `llama-server`, notes) for settings `st`. `k`: the K to export
    (default: the settings' K; pass the K in force for an adaptive session)."""
    if not st.target_path:
        raise SpecdashError("export: the source did not report the target's file (a remote server's settings "
                            "cannot be exported)")
    notes: list[str] = []
    in_force = k is not None
    k = st.k if k is None else k
    args = ["-m", st.target_path]
    draft = st.draft or "none"
    if st.adaptive and in_force:
        notes.append(f"specdash ran with adaptive K; llama-server has none: exported fixed K={k}, the K in force")
    elif st.adaptive:
        notes.append(f"these settings use adaptive K; llama-server has none: exported fixed K={k}, the K "
                     "adaptive starts at (choose it with --k N)")
    if k and draft != "none":
        # The chain's or auto's model is the target's MTP head when the label ends with it.
        head = draft == "mtp" or (draft in ("chain", "auto") and (st.drafter or "").endswith("mtp"))
        model = draft if (is_model(draft) or draft in ("chain", "auto")) and not head else None
        types = []
        if draft == "auto":
            notes.append("specdash's auto chose each step's source by expected speed (lookup, edit copy, "
                         "suffix, the draft model or none); llama-server has no such choice: exported lookup then "
                         "the draft model in a fixed order, as the chain; edit and suffix copies left out")
        if draft in ("lookup", "chain", "auto"):
            types.append("ngram-simple")
            args += ["--spec-ngram-simple-size-n", str(st.lookup_max_ngram or 4),
                     "--spec-ngram-simple-size-m", str(k)]
        if draft == "suffix":
            types.append("ngram-cache")
        if head:
            # llama-server loads the head with the target (load_mtp) when draft-mtp is asked for.
            types.append("draft-mtp")
            args += _draft_limits(st, k, "head's top-10 confidences", notes)
        if model is not None:
            if not st.draft_path:
                if draft in ("chain", "auto"):
                    notes.append(f"the {draft} ran without a draft model: exported its lookup part only")
                else:
                    raise SpecdashError(f"export: the draft model {draft} has no file path in these settings")
            elif (st.drafter or "").endswith("(translated)"):
                # llama-server refuses a draft with another vocabulary and then serves with
                # no speculation at all: exporting -md would only switch it off.
                notes.append(f"the draft model {draft} has another vocabulary: specdash drafted through "
                             "translation, which llama-server does not do; exported without it")
            else:
                types.append("draft-simple")
                args += ["-md", st.draft_path, *_draft_limits(st, k, "draft's top probabilities", notes)]
        if types:
            args += ["--spec-type", ",".join(types)]
    elif draft != "none":
        notes.append("K=0: plain decoding, no speculation flags")
    if st.experts is not None:
        args += ["--override-kv", f"{_arch(st.target_path)}.expert_used_count=int:{st.experts}"]
    if st.threads:
        args += ["-t", str(st.threads)]
    if st.ctx:
        args += ["-c", str(st.ctx)]
    if st.temperature is not None:
        args += ["--temp", f"{st.temperature:g}"]
    return args, notes


def command_line(st: SettingsEvent, *, k: int | None = None, binary: str = "llama-server",
                 extra: tuple[str, ...] = ("--metrics",)) -> str:
    """A shell command line, with notes as comments above it."""
    args, notes = server_args(st, k=k)
    lines = [f"# {note}" for note in notes]
    lines.append(shlex.join([binary, *args, *extra]))
    return "\n".join(lines)


def preset_section(st: SettingsEvent, *, k: int | None = None, name: str | None = None) -> str:
    """A router-mode preset (llama-server --models-preset FILE): keys are the long
    argument names without dashes."""
    args, notes = server_args(st, k=k)
    section = name or preset_name(st, k)
    lines = [f"; {note}" for note in notes] + [f"[{section}]"]
    keys = {"-m": "model", "-md": "model-draft", "-t": "threads", "-c": "ctx-size"}
    i = 0
    while i < len(args):
        key = keys.get(args[i], args[i].lstrip("-"))
        # One line per key whatever the value holds: a path read from a remote server's
        # /props could otherwise write sections and keys of its own into the file.
        value = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in str(args[i + 1]))
        lines.append(f"{key} = {value}")
        i += 2
    return "\n".join(lines)


def preset_name(st: SettingsEvent, k: int | None = None) -> str:
    """`model@draft-k8` style names, as the dashboard's `d` picker lists router presets."""
    k = st.k if k is None else k
    target = display_name(st.target_path or st.target)
    draft = st.draft or "none"
    if not k or draft == "none":
        return f"{target}@none"
    kind = "draft" if is_model(draft) else draft
    return f"{target}@{kind}-k{k}"
