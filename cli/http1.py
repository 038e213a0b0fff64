"""The HTTP/1.1 that `infer run` through a server needs, on a plain socket.

The standard library's http.client imports the email package and ssl: about 14 ms of
every call of a shell loop through `infer serve` (benchmarks/README.md, "Start-up"),
for a call that takes about 0.2 s in all. infer serve answers one request per
connection with a status line, headers, and a body that is either Content-Length
bytes or chunked (a stream of server-sent events); this reads exactly that.
"""

from __future__ import annotations

import socket

TYPE_CHECKING = False  # (typing and collections.abc cost the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

MAX_LINE = 65536  # a status line, header or chunk-size line longer than this is refused


class ProtocolError(Exception):
    """The answer is not the HTTP/1.1 this client reads (or it ended too soon)."""


def connect(host: str, port: int, socket_path: str | None, timeout: float) -> socket.socket:
    """A connected socket: TCP to host:port, or the Unix socket at `socket_path`."""
    if socket_path is None:
        # An ASCII name as bytes: given text, getaddrinfo encodes it with the "idna" codec,
        # whose import (stringprep, unicodedata) costs about 3 ms.
        return socket.create_connection((host.encode() if host.isascii() else host, port), timeout=timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_path)
    except OSError:
        sock.close()
        raise
    return sock


def request(sock: socket.socket, method: str, path: str, body: bytes | None, headers: Mapping[str, str],
            *, host: str) -> Response:
    """Send one request on `sock` (the server closes the connection after its answer) and
    read the answer's status line and headers."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close",
             *(f"{name}: {value}" for name, value in headers.items())]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
    return Response(sock)


class Response:
    """An answer: `status`, `headers` (lower-case names), then the body by `read` or by lines."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._file = sock.makefile("rb")
        parts = self._line().split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.1 status line: {b' '.join(parts)[:80]!r}")
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        while line := self._line().strip():
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"not a header: {line[:80]!r}")
            self.headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")

    def _line(self) -> bytes:
        line = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError("a line of the answer is too long")
        if not line:
            raise ProtocolError("the connection closed in the middle of the answer")
        return line

    def _exactly(self, n: int) -> bytes:
        data = self._file.read(n)
        if len(data) < n:
            raise ProtocolError("the connection closed in the middle of the answer")
        return data

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_text = self._line().split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"not a chunk size: {size_text[:20]!r}") from None
                if size == 0:
                    while self._line().strip():  # trailers, up to the blank line
                        pass
                    return
                yield self._exactly(size)
                self._line()  # the CRLF after the chunk
        elif "content-length" in self.headers:
            try:
                length = int(self.headers["content-length"])
            except ValueError:
                raise ProtocolError("not a Content-Length") from None
            yield self._exactly(length)
        else:  # up to the end of the connection
            while data := self._file.read1(65536):
                yield data

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def __iter__(self) -> Iterator[bytes]:
        """The body line by line (each with its b"\\n", the last one maybe without)."""
        pending = b""
        for data in self.chunks():
            pending += data
            *whole, pending = pending.split(b"\n")
            yield from (line + b"\n" for line in whole)
        if pending:
            yield pending

    def close(self) -> None:
        self._file.close()
        self._sock.close()
