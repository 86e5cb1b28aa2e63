"""The one exception type the CLI turns into a one-line message and an exit code.

Anything the user can get wrong (a path, a flag, a config key, an incompatible pair)
raises SpecdashError with a message that names the thing and what would be valid.
Everything else is a bug and is allowed to show a traceback.
"""

import traceback
from pathlib import Path


class SpecdashError(Exception):
    """A user-facing error: printed as one line, exit code `exit_code` (2 = usage/config)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def describe(exc: BaseException) -> str:
    """The exception's text; when it has none, what failed and where, so no error message
    is ever empty: "SpecdashError, with no message, raised in run (specdash/commands/x.py:12)"."""
    text = str(exc).strip()
    if text:
        return text
    where = ""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    if frames:
        last = frames[-1]
        path = Path(last.filename)
        short = "/".join(path.parts[path.parts.index("specdash"):]) if "specdash" in path.parts else path.name
        where = f", raised in {last.name} ({short}:{last.lineno})"
    return f"{type(exc).__name__}, with no message{where}"


def read_user_file(path: str | Path, what: str) -> str:
    """A text file the user named, or a one-line error naming `what` (the flag or key)
    and the file: missing, unreadable, not UTF-8."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecdashError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecdashError(f"{what} {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
