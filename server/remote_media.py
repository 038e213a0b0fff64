"""Images given by http(s) URL, fetched by `infer serve` only when it was started with
--allow-remote-media (off by default: a server that fetches what its clients name can be
made to reach hosts only it can see).

A fetch has a deadline for the whole download (REMOTE_TIMEOUT_S) and the same size limit as
an uploaded image (runtime/media.MAX_IMAGE_BYTES, checked on Content-Length and again while
reading); it follows redirects only to http(s). Every failure is a 400 naming the part and the
URL: the client named something the server could not read. Runs off the event loop (prepare).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from urllib.parse import urlsplit

from infer.runtime.errors import MediaError
from infer.runtime.media import MAX_IMAGE_BYTES, Medium, medium
from infer.server.errors import invalid

REMOTE_TIMEOUT_S = 10.0  # the whole download, connection included
_READ = 1 << 16


def fetched(media: Sequence[Medium], *, allowed: bool, timeout_s: float = REMOTE_TIMEOUT_S) -> list[Medium]:
    """`media` with each remote image fetched and checked (an ApiError 400 where that fails, or
    where the server does not fetch remote media)."""
    out = []
    for m in media:
        if m.url is None:
            out.append(m)
        elif not allowed:
            raise invalid(m.name, f"{m.name}: this server fetches no remote images (start it with "
                          "--allow-remote-media): send the image as a data: URL",
                          code="unsupported_parameter")
        else:
            out.append(fetch(m, timeout_s))
    return out


class _HttpOnly(urllib.request.HTTPRedirectHandler):
    """Redirects followed only to http(s) (urllib's own would follow one to ftp)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if urlsplit(newurl).scheme not in ("http", "https"):
            raise urllib.error.HTTPError(newurl, code, "a redirect to a URL that is not http(s)", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch(m: Medium, timeout_s: float = REMOTE_TIMEOUT_S) -> Medium:
    """The remote image `m` (its url) downloaded and checked as an uploaded one is."""
    url = m.url or ""
    deadline = time.monotonic() + timeout_s
    opener = urllib.request.build_opener(_HttpOnly)
    request = urllib.request.Request(url, headers={"User-Agent": "infer", "Accept": "image/*"})
    try:
        with opener.open(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > MAX_IMAGE_BYTES:
                raise MediaError(f"{int(length):,} bytes, over the limit of {MAX_IMAGE_BYTES:,} for an image")
            data = bytearray()
            while block := response.read1(_READ):  # (what has come: the deadline is checked)
                data += block
                if len(data) > MAX_IMAGE_BYTES:
                    raise MediaError(f"over the limit of {MAX_IMAGE_BYTES:,} bytes for an image")
                if time.monotonic() > deadline:
                    raise TimeoutError
    except urllib.error.HTTPError as e:
        raise invalid(m.name, f"{m.name}: fetching {url} gave HTTP {e.code} ({e.reason})") from None
    except TimeoutError:
        raise invalid(m.name, f"{m.name}: fetching {url} took more than {timeout_s:g} s") from None
    except urllib.error.URLError as e:
        reason = "took too long" if isinstance(e.reason, TimeoutError) else f"failed: {e.reason}"
        raise invalid(m.name, f"{m.name}: fetching {url} {reason}") from None
    except MediaError as e:
        raise invalid(m.name, f"{m.name}: {url}: {e}") from None
    except (OSError, ValueError) as e:
        raise invalid(m.name, f"{m.name}: fetching {url} failed: {e}") from None
    try:
        return medium(m.name, bytes(data), "image")
    except MediaError as e:
        raise invalid(m.name, f"{e} (fetched from {url})") from None
