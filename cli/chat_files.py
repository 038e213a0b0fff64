"""Saved chats (`/save NAME`, `/load NAME`, `--session NAME`): a folder per name under
INFER_HOME/sessions with session.json (messages, parameters...) and the KV state (kv.bin)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from infer.cli.chat_settings import param_names
from infer.runtime.errors import UsageError


def write_session(name: str, meta: dict[str, Any], kv: bytes | None) -> None:
    """A saved chat: session.json (messages, parameters...) and, when there is one, the KV
    state beside it (kv.bin), each written atomically."""
    import hashlib
    import json

    from infer.runtime.atomic import write_atomic

    folder = _session_folder(name)
    meta = {"version": 1, **meta, "kv_sha256": hashlib.sha256(kv).hexdigest() if kv is not None else None}
    if kv is not None:
        write_atomic(folder / "kv.bin", kv)
    else:
        (folder / "kv.bin").unlink(missing_ok=True)  # an older save's state is not this one's
    write_atomic(folder / "session.json", json.dumps(meta).encode())


def read_session(name: str) -> tuple[dict[str, Any], bytes | None]:
    """A saved chat's session.json and its KV state (None: saved without one)."""
    import json

    folder = _session_folder(name)
    try:
        meta = json.loads((folder / "session.json").read_text(encoding="utf-8"))
        kv = (folder / "kv.bin").read_bytes() if (folder / "kv.bin").exists() else None
    except (OSError, ValueError) as e:
        raise UsageError(f"no saved session {name!r} ({e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("messages"), list):
        raise UsageError(f"saved session {name!r} is not one infer wrote")
    meta.setdefault("params", {})
    return meta, kv


def _session_folder(name: str) -> Any:
    import re

    from infer.quant.paths import chat_sessions_dir

    if not name or not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name) or name.startswith("."):
        raise UsageError("a session name is letters, digits, '.', '_' or '-'")
    return chat_sessions_dir() / name


def params_dict(params: Any) -> dict[str, Any]:
    return {f.name: getattr(params, f.name) for f in fields(params) if not f.name.startswith("_")}


def saved_params(meta: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters a saved chat's session.json holds (names that are
    not sampling parameters are left out), each in its SamplingParams form."""
    return {k: _from_json(k, v) for k, v in meta["params"].items() if k in param_names()}


def _from_json(key: str, value: Any) -> Any:
    """A saved parameter back in its SamplingParams form (JSON has lists, not tuples)."""
    if key == "logit_bias":
        return tuple(map(tuple, value))
    return tuple(value) if isinstance(value, list) else value


def messages_to_json(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as session.json holds them: a message's images and audio as base64."""
    import base64

    return [{**m, "media": [{"name": x.name, "kind": x.kind, "data": base64.b64encode(x.data).decode()}
                            for x in m["media"]]} if "media" in m else m for m in messages]


def messages_from_json(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """session.json's messages back, their media checked as when they were attached."""
    import base64
    import binascii

    from infer.runtime.media import medium

    out = []
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("media"), list):
            try:
                media = tuple(medium(str(x["name"]), base64.b64decode(x["data"], validate=True), x["kind"])
                              for x in m["media"])
            except (KeyError, TypeError, binascii.Error):
                raise UsageError("a saved message's media are not as infer wrote them") from None
            m = {**m, "media": media}
        out.append(m)
    return out
