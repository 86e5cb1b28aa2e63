"""The one exception type the CLI turns into a one-line message and an exit code.

Anything the user can get wrong (a path, a flag, a config key, an incompatible pair)
raises SpecdashError with a message that names the thing and what would be valid.
Everything else is a bug and is allowed to show a traceback.
"""


class SpecdashError(Exception):
    """A user-facing error: printed as one line, exit code `exit_code` (2 = usage/config)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
