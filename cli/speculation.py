"""The --spec-* flags: a speculator for a session, with its draft model if one is named,
and the cost profile it weighs guesses with, kept in INFER_HOME/cache/speculation.json."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from infer.cli.flags import resolve, spec_params
from infer.quant.paths import speculation_profiles

PROFILES_KEPT = 64  # model and settings combinations; the oldest are dropped
PROFILE_METHOD = 2  # how profiles are measured (runtime.speculative.measure_batches): older ones are not used


def attach(flags: Mapping[str, Any], session: Any, placed: Any) -> Any:
    """Give `session` the speculator the flags ask for (None for --spec-type none); closing
    the session closes it, with its draft model.

    A draft model (-md) is resolved like the main model, loaded with the same context
    size and placement settings, and checked against the main model's vocabulary. The
    cost profile measured for this model, draft and settings is loaded if there is one,
    and saved when the speculator measures it.
    """
    from infer.runtime.session import Session
    from infer.runtime.speculative import DraftModel, Speculator, check_compatible

    params = spec_params(flags)
    if not params.enabled:
        return None
    draft = None
    if params.type == "draft":
        resolved = resolve({**flags, "model": flags["model_draft"]})
        draft_session = Session.open(resolved.path, replace(placed.params, n_ctx=session.n_ctx),
                                     devices=placed.handles)
        try:
            check_compatible(session.model, draft_session.model)
        except BaseException:
            draft_session.close()
            raise
        draft = DraftModel(draft_session, params.p_min)
    if params.fixed:  # a fixed length weighs no costs: no profile to read or measure
        session.speculator = Speculator(params, draft)
        return session.speculator
    key = profile_key(session, draft.session if draft is not None else None, params.n_max)
    session.speculator = Speculator(params, draft, profile=load_profile(key),
                                    on_measured=lambda profile: save_profile(key, profile))
    return session.speculator


def profile_key(session: Any, draft: Any, n_max: int) -> str:
    """What a cost profile depends on: the model files, where and how they run, llama.cpp."""
    import platform

    from infer.runtime.llama import llama_cpp_version
    from infer.runtime.session import content_digest

    p = session.context.params
    key = {"model": content_digest(session.model.path),
           "draft": content_digest(draft.model.path) if draft is not None else None,
           "host": platform.node(), "threads": [p.n_threads, p.n_threads_batch],
           "gpu_layers": p.n_gpu_layers, "split": list(p.tensor_split), "rpc": list(p.rpc),
           "flash_attn": session.context.flash_attn, "kv": [p.cache_type_k, p.cache_type_v],
           "n_max": n_max, "llama_cpp": llama_cpp_version(), "method": PROFILE_METHOD}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def _read_profiles() -> dict[str, Any]:
    try:
        data = json.loads(speculation_profiles().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_profile(key: str) -> dict[str, Any] | None:
    """The profile kept under `key`, or None (missing or unreadable: it is measured again)."""
    profile = _read_profiles().get(key)
    try:
        if (isinstance(profile, dict) and profile["batch"]
                and all(int(n) >= 1 and float(t) > 0 for n, t in profile["batch"].items())):
            return profile
    except (KeyError, TypeError, ValueError, AttributeError):
        pass
    return None


def save_profile(key: str, profile: dict[str, Any]) -> None:
    """Keep `profile` under `key` (a file that cannot be written leaves speculation working:
    the next run measures again)."""
    from infer.runtime.atomic import write_atomic

    profiles = _read_profiles()
    profiles.pop(key, None)
    profiles[key] = profile  # the newest last; the oldest are dropped
    kept = dict(list(profiles.items())[-PROFILES_KEPT:])
    with contextlib.suppress(OSError):
        write_atomic(speculation_profiles(), json.dumps(kept, indent=1).encode())


def usage_json(usage: Any) -> dict[str, int]:
    """The speculation fields of --json's usage."""
    return {"draft_tokens": usage.draft_tokens, "accepted_tokens": usage.accepted_tokens}


def describe(usage: Any, timings: Any = None) -> str:
    """One line for -v and /stats."""
    measured = ""
    if timings is not None and timings.calibration_ms:
        measured = (f"; the cost of verifying guesses measured in {timings.calibration_ms:.0f} ms "
                    "(once for this model and settings)")
    if not usage.draft_tokens:
        return f"speculation: no tokens guessed{measured}"
    share = 100 * usage.accepted_tokens / usage.draft_tokens
    return (f"speculation: {usage.draft_tokens} tokens guessed, {usage.accepted_tokens} accepted "
            f"({share:.0f}%){measured}")
