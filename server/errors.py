"""OpenAI-shaped errors: every error the API returns is one of these.

A client's mistake is always 4xx: OpenAI's official client retries 5xx responses,
so a bad request answered with 500 would be sent again and again.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = None) -> ApiError:
    """400: the request is wrong (`param` names the field)."""
    return ApiError(400, message, param=param, code=code)


def unsupported(param: str, what: str) -> ApiError:
    """400: a field infer cannot honour, refused rather than silently ignored."""
    return ApiError(400, f"{param}: {what} is not supported by infer serve", param=param,
                    code="unsupported_parameter")


def busy(message: str, retry_after_s: int = 1) -> ApiError:
    """503 with Retry-After: the server is full or loading; the client may try again."""
    return ApiError(503, message, type="server_error", code="server_busy",
                    headers={"Retry-After": str(retry_after_s)})
