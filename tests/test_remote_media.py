"""Images given by http(s) URL (infer serve --allow-remote-media, issue 36): fetched from a
server on 127.0.0.1 with a size limit and a deadline; every failure is a 400 naming the part
and the URL, and a server not started with the flag fetches nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tiny_vision import png_bytes

from infer.runtime.errors import MediaError
from infer.runtime.media import Medium, media_prompt, part_medium
from infer.server import remote_media
from infer.server.errors import ApiError

PNG = png_bytes(8, 8, seed=3)
PART = "messages[0].content[0].image_url.url"


class _Files(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path
        if path == "/a.png":
            self._send(200, PNG)
        elif path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/a.png")
            self.end_headers()
        elif path == "/to-file":
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1/a.png")
            self.end_headers()
        elif path == "/huge":  # says it is huge
            self.send_response(200)
            self.send_header("Content-Length", str(remote_media.MAX_IMAGE_BYTES + 1))
            self.end_headers()
        elif path == "/endless":  # says nothing of its length, and never ends
            self.send_response(200)
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"\x89PNG" * 16384)
            except OSError:
                pass
        elif path == "/slow":
            self.send_response(200)
            self.end_headers()
            for _ in range(40):  # a byte now and then: each read succeeds, the whole never comes
                try:
                    self.wfile.write(b"\x89")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)
        elif path == "/text":
            self._send(200, b"<html>not an image</html>")
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def files() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _remote(url: str) -> Medium:
    return part_medium({"type": "image_url", "image_url": {"url": url}}, "messages[0].content[0]")


def test_a_remote_image_is_fetched_and_checked_as_an_uploaded_one(files: str) -> None:
    """An http URL is a medium still to fetch; fetched (redirects followed), it holds the file."""
    m = _remote(files + "/a.png")
    assert (m.url, m.data, m.name) == (files + "/a.png", b"", PART)
    for path in ("/a.png", "/moved"):
        got = remote_media.fetched([_remote(files + path)], allowed=True)
        assert got == [Medium(PART, "image", PNG)]


@pytest.mark.parametrize(("path", "words"), [
    ("/missing.png", "gave HTTP 404"),
    ("/to-file", "not http(s)"),
    ("/huge", f"over the limit of {remote_media.MAX_IMAGE_BYTES:,}"),
    ("/endless", f"over the limit of {remote_media.MAX_IMAGE_BYTES:,}"),
    ("/slow", "took more than 1 s"),
    ("/text", "not a PNG, JPEG, WebP, GIF or BMP image"),
])
def test_a_remote_image_that_cannot_be_read_is_a_400_naming_the_part_and_url(files: str, path: str,
                                                                             words: str) -> None:
    with pytest.raises(ApiError) as caught:
        remote_media.fetched([_remote(files + path)], allowed=True, timeout_s=1.0)
    e = caught.value
    assert e.status == 400 and e.param == PART and words in e.message and files + path in e.message, e.message


def test_a_server_without_allow_remote_media_fetches_nothing(files: str) -> None:
    with pytest.raises(ApiError) as caught:
        remote_media.fetched([_remote(files + "/a.png")], allowed=False)
    assert caught.value.status == 400 and "--allow-remote-media" in caught.value.message
    assert caught.value.param == PART


def test_a_remote_image_outside_the_server_is_refused_with_what_to_do(files: str) -> None:
    """infer run, chat and batch read files: a URL they meet (a batch line's part) is an error
    saying only infer serve fetches them."""
    with pytest.raises(MediaError, match="only infer serve fetches those"):
        media_prompt(object(), "<__media__>Hi", [_remote(files + "/a.png")], add_special=True)  # type: ignore[arg-type]
