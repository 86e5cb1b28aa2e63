"""A model's display name: the one rule every screen, label, served model id and
preset name follows, so the dashboard, `attach`, `/v1/models` and a recording name a
model the same way."""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath


def display_name(spec: str) -> str:
    """A registry name or an alias as is; a GGUF file (or any path) by its file name
    without the extension."""
    if "\\" in spec:  # a Windows path (a remote llama-server's /props on Windows)
        return PureWindowsPath(spec).stem
    if spec.endswith(".gguf") or "/" in spec:
        return PurePosixPath(spec).stem
    return spec
