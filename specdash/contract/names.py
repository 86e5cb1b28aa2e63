"""A model's display name: the one rule every screen, label, served model id and
preset name follows, so the dashboard, `attach`, `/v1/models` and a recording name a
model the same way."""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath


def display_name(spec: str) -> str:
    """A registry name, an alias or a server's URL as is; a GGUF file (or any path)
    by its file name, without `.gguf`. Only that extension goes: a name such as
    "qwen2.5-coder" or "127.0.0.1:8080" has dots that are not extensions."""
    if "://" in spec:  # a watched server named by its address (no model known yet)
        return spec
    if "\\" in spec:  # a Windows path (a remote llama-server's /props on Windows)
        spec = PureWindowsPath(spec).name
    elif "/" in spec:
        spec = PurePosixPath(spec).name
    return spec[: -len(".gguf")] if spec.lower().endswith(".gguf") else spec
