"""The API key: every path but /health needs it."""

from __future__ import annotations

import hmac
from typing import Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse

from infer.server.errors import ApiError


def with_api_key(app: Starlette, key: str) -> Any:
    """Every path but /health needs `Authorization: Bearer KEY` (compared in constant time)."""
    expected = f"Bearer {key}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                error = ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                                 code="invalid_api_key")
                response = JSONResponse(error.body(), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    guarded.state = app.state  # type: ignore[attr-defined]
    return guarded
