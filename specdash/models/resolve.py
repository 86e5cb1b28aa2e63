"""Turn what the user typed (a registry name or a path) into a checked GGUF path.

This is the one place a download can happen at run time: a built-in model that is not
cached yet is fetched here, with progress.
"""

from __future__ import annotations

from pathlib import Path

from specdash.contract.errors import SpecdashError
from specdash.models.fetch import ProgressCallback, fetch_model
from specdash.models.gguf_header import GGUFError, check_gguf
from specdash.models.registry import BUILTIN, find_user_draft, known_names, model_path


def resolve_model(spec: str, *, fetch: bool = True, progress: ProgressCallback | None = None) -> Path:
    """A registry name -> its cached file (fetched first if missing and `fetch`);
    anything else -> a path to an existing, whole GGUF file."""
    if spec in BUILTIN:
        path = model_path(spec)
        if not path.is_file():
            if not fetch:
                raise SpecdashError(
                    f"model '{spec}' is not cached ({path}); run `specdash models fetch {spec}`"
                )
            fetch_model(spec, progress)
        return _checked(path, hint=f"; run `specdash models fetch --force {spec}` to fetch it again")

    draft = find_user_draft(spec)
    if draft is not None:
        path = Path(draft.path)
        if not path.is_file():
            raise SpecdashError(
                f"model '{spec}': its file {path} is gone; run `specdash models make-draft "
                f"{draft.target} --quant {draft.quant} --name {spec}` to make it again"
            )
        return _checked(path)

    path = Path(spec).expanduser()
    if not path.exists():
        raise SpecdashError(
            f"model '{spec}': not a known model (known: {', '.join(known_names())}) and no such file"
        )
    return _checked(path.resolve())


def _checked(path: Path, hint: str = "") -> Path:
    try:
        check_gguf(path)
    except GGUFError as exc:
        raise GGUFError(f"{exc}{hint}") from None
    return path
