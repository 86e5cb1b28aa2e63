"""A model's display name: the one rule every screen, label, served model id and
preset name follows, so the dashboard, `attach`, `/v1/models` and a recording name a
model the same way."""

from __future__ import annotations

from pathlib import PurePath


def display_name(spec: str) -> str:
    """A registry name or an alias as is; a GGUF file (or any path) by its file name
    without the extension."""
    if spec.endswith(".gguf") or "/" in spec or "\\" in spec:
        return PurePath(spec).stem
    return spec
