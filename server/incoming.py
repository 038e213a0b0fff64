"""The client's side of one HTTP request: its body, read within the size limit, and the
moment it goes away."""

from __future__ import annotations

from starlette.requests import Request as HttpRequest

from infer.server import schema
from infer.server.errors import ApiError


async def read_body(http: HttpRequest) -> bytes:
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > schema.MAX_BODY_BYTES:
        raise _too_large()
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > schema.MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large() -> ApiError:
    return ApiError(413, f"the request body is larger than {schema.MAX_BODY_BYTES} bytes",
                    code="body_too_large")


async def disconnected(http: HttpRequest) -> None:
    """Returns when the client has gone away."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return
