"""A request the server will not run, as OpenAI's error body: its own module so that the
field table (fields.py) and the tool reader (tools.py) raise it without importing the
protocol that imports them."""

from __future__ import annotations

from typing import Any


class BadRequest(ValueError):
    """HTTP 400 (or `status`) with OpenAI's error body naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": None if self.status != 401 else "invalid_api_key"}}
