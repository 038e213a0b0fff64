"""Hub references as users type them and models.toml names them: ``owner/repo`` or
``owner/repo:QUANT``, optionally prefixed with ``hf.co/``.

Parsing them needs nothing of the registry, the catalog or the builder, which all use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infer.runtime.errors import UsageError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_PREFIX = re.compile(r"^(?:https?://)?(?:hf\.co|huggingface\.co)/", re.IGNORECASE)


@dataclass(frozen=True)
class HubReference:
    repo: str
    quant: str | None


def parse_hub_reference(reference: str) -> HubReference | None:
    """`owner/repo`, `owner/repo:QUANT`, with an optional `hf.co/` prefix; None if not one."""
    text = _HUB_PREFIX.sub("", reference.strip())
    repo, _, quant = text.partition(":")
    if not REPO_ID.match(repo):
        return None
    if quant and not re.fullmatch(r"[A-Za-z0-9_-]+", quant):
        raise UsageError(f"{reference}: {quant!r} is not a quant type such as Q4_K_M")
    return HubReference(repo, quant or None)
