"""A real `infer serve` in a child process, for the server's tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from conftest import CLI


class Server:
    """`infer serve ARGS` on a free port of 127.0.0.1; stderr is kept in `self.log`."""

    def __init__(self, *args: str, home: Path, env: dict[str, str] | None = None) -> None:
        self.args, self.home = args, home
        self.proc = subprocess.Popen(
            [*CLI, "serve", *args, "--port", "0"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, "INFER_HOME": str(home), **(env or {})})
        self.log: list[str] = []
        self.port: int | None = None
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                self.log.append(line)
                found = re.search(r"serving on http://\S+:(\d+)/v1", line)
                if found:
                    self.port = int(found.group(1))
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        ready.wait(60)
        if self.port is None:
            self.proc.kill()
            raise AssertionError("infer serve did not start:\n" + "".join(self.log))
        self.url = f"http://127.0.0.1:{self.port}"
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 60) -> None:
        if not healthy(self.url, timeout):
            raise AssertionError("infer serve never became healthy:\n" + "".join(self.log))

    def metrics(self, model: str = "smollm2") -> dict[str, float]:
        """The /metrics samples of `model` (without labels other than the model), by name."""
        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            m = re.fullmatch(r'(infer:[a-z_]+)\{model_name="' + re.escape(model) + r'"\} (\S+)', line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def rss_kib(self) -> int:
        """The server's resident memory (Linux)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]

    @property
    def reading(self) -> bool:
        """Whether its stderr is still being read (open: the process, or a child, holds it)."""
        return self._reader.is_alive()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send `sig`; its exit code, once its whole stderr is in `log`."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(30)
        return code


def healthy(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """Whether the server at `url` answers /health with 200 within `timeout` seconds (while
    `alive` says its process runs)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and alive():
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


def reply_parts(url: str, payload: dict, *, stream: bool) -> tuple[str, str]:
    """(reasoning_content, content) of a chat reply from the server at `url`, whole or
    assembled from its stream."""
    import json

    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=payload, timeout=300)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        return message.get("reasoning_content") or "", message.get("content") or ""
    parts = {"reasoning_content": "", "content": ""}
    body = {**payload, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    for key in parts:
                        parts[key] += choice.get("delta", {}).get(key) or ""
    return parts["reasoning_content"], parts["content"]
