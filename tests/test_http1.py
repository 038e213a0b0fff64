"""cli/http1.py: the HTTP/1.1 that `infer run` reads from infer serve, on a plain socket.
(Every test of infer run, chat and batch through a server goes through it too.)"""

from __future__ import annotations

import socket
import threading

import pytest

from infer.cli import http1


def answer(raw: bytes) -> tuple[http1.Response, list[bytes]]:
    """A response read from a peer that sends `raw` (in small pieces) and closes; and the
    request the peer received."""
    ours, theirs = socket.socketpair()
    received: list[bytes] = []

    def peer() -> None:
        received.append(theirs.recv(65536))
        for i in range(0, len(raw), 7):  # pieces that cut lines and chunks anywhere
            theirs.sendall(raw[i:i + 7])
        theirs.close()

    thread = threading.Thread(target=peer)
    thread.start()
    response = http1.request(ours, "POST", "/v1/chat/completions", b'{"a": 1}',
                             {"Content-Type": "application/json"}, host="localhost")
    return response, received


def test_a_chunked_stream_of_events_comes_back_line_by_line():
    events = b'data: {"x": 1}\n\ndata: {"x": 2}\n\ndata: [DONE]\n\n'
    parts = (events[:5], events[5:31], events[31:])
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(part), part) for part in parts)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    response, received = answer(head + body + b"0\r\nX-Trailer: y\r\n\r\n")
    assert response.status == 200 and response.headers["content-type"] == "text/event-stream"
    assert list(response) == [b'data: {"x": 1}\n', b"\n", b'data: {"x": 2}\n', b"\n",
                              b"data: [DONE]\n", b"\n"]
    response.close()
    request = received[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nContent-Length: 8\r\n" in request and request.endswith(b'\r\n\r\n{"a": 1}')


def test_a_body_by_length_and_one_up_to_the_close():
    response, _ = answer(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 11\r\n\r\n{\"error\":1}")
    assert response.status == 401 and response.read() == b'{"error":1}'
    response, _ = answer(b"HTTP/1.1 200 OK\r\n\r\nall of it")
    assert response.read() == b"all of it"


@pytest.mark.parametrize("raw", [
    b"",                                                               # closed at once
    b"SSH-2.0-OpenSSH\r\n",                                            # not HTTP
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",                       # a broken header
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort",  # a chunk cut short
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",      # not a chunk size
    b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nless",              # a body cut short
])
def test_a_broken_answer_is_a_protocol_error(raw):
    with pytest.raises(http1.ProtocolError):
        response, _ = answer(raw)
        response.read()
