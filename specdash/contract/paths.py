"""Where specdash keeps what it makes: one cache folder for models, built tools and
per-machine verdicts, at the bottom of the import graph so every layer may ask."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SPECDASH_CACHE, else ~/.cache/specdash."""
    env = os.environ.get("SPECDASH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdash"
