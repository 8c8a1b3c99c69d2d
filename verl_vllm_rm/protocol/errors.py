"""The error body every route answers with, and how a client reads it back.

``{"error": {"message": ..., "type": ..., "code": status}}`` (the OpenAI shape vLLM
also uses): one writer on the server, one reader on the trainer side.
"""

from __future__ import annotations

import json
from typing import Any

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 409: "ConflictError",
               413: "RequestTooLarge"}


class RequestError(Exception):
    """A client error; the server turns it into :func:`error_body` with ``status``."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status


def error_body(message: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "ServerError"), "code": status}}


def error_message(raw: bytes | str) -> str:
    """The ``message`` of an error body, or the raw text when the answer is not one (e.g. a proxy's page)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text
    return message if isinstance(message, str) else text


#: How a server whose weights are lost (a reload failed half-way and could not be undone) begins its /health error
#: and every /score error: it scores nothing until a full publish succeeds or it restarts.
WEIGHTS_LOST = "this server's weights are lost: "


def weights_lost(status: int | None, message: str) -> str | None:
    """The server's own account when an error answer (``status``, its ``message`` as :func:`error_message` reads
    it: /health's body is not an error body, so the raw text) says its weights are lost; else None."""
    if status != 503 or WEIGHTS_LOST not in message:
        return None
    try:
        reason = json.loads(message).get("error")
    except (ValueError, AttributeError):
        return message
    return reason if isinstance(reason, str) else message
