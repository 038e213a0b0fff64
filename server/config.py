"""What `infer serve` was told to do that its HTTP front end needs: the API key, the server's
sampling defaults, a chat template that overrides the model's and the grace period of a stop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Config:
    api_key: str | None = None
    sampling: tuple[tuple[str, Any], ...] = ()  # the server's defaults (its command's flags)
    chat_template: str | None = None
    shutdown_grace_s: float = 5.0
    max_media: int = 8  # images and audio files one request may hold (--max-media)
    allow_remote_media: bool = False  # fetch images given by http(s) URL (--allow-remote-media)
    remote_timeout_s: float = 10.0  # the whole download of one (server/remote_media.py)
