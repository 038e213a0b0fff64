"""The API key: every path but /health needs it."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse

from infer.server.errors import ApiError


def with_api_key(app: Starlette, key: str, shape: Callable[[str, ApiError], dict[str, Any]]) -> Any:
    """Every path but /health needs `Authorization: Bearer KEY` or, as Anthropic's clients
    send it, `x-api-key: KEY` (compared in constant time); a refusal is in the path's API's
    `shape`."""
    bearer, bare = f"Bearer {key}".encode(), key.encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            headers = dict(scope.get("headers") or [])
            given, given_key = headers.get(b"authorization", b""), headers.get(b"x-api-key", b"")
            if not (hmac.compare_digest(given, bearer) or hmac.compare_digest(given_key, bare)):
                error = ApiError(401, "a valid API key is required (Authorization: Bearer KEY, or x-api-key)",
                                 code="invalid_api_key")
                response = JSONResponse(shape(scope["path"], error), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    guarded.state = app.state  # type: ignore[attr-defined]
    return guarded
