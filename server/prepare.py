"""A generation's request made ready for the engine, off the event loop: the prompt's tokens,
the sampling parameters and the prompt cache's checkpoint; every mistake of the client's that
can be seen before the engine starts is a 400 here, before a stream starts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from infer.runtime.errors import InferError
from infer.runtime.log import logger
from infer.runtime.request_params import logit_bias_error
from infer.runtime.sampling import SamplingParams
from infer.server import schema
from infer.server.config import Config
from infer.server.errors import invalid
from infer.server.models import Served

TYPE_CHECKING = False
if TYPE_CHECKING:
    from infer.runtime.thinking_prompt import ThinkingPrompt
    from infer.runtime.tool_syntax import ToolSyntax

log = logger("infer.server")

class Prepared(NamedTuple):
    tokens: list[int]
    params: SamplingParams
    checkpoint: int  # where the prompt cache may save the prompt's state
    thinking: ThinkingPrompt | None  # a chat's rendering with its thinking plan
    calls: ToolSyntax | None  # how the model writes tool calls, where the reply may call tools
    media: Any = None  # runtime.media.MediaPrompt: the chat's images and audio in `tokens`


def prepare(served: Served, gen: schema.Generation, config: Config) -> Prepared:
    """The prompt's tokens, the sampling parameters, the prompt cache's checkpoint, a chat's
    rendering with its thinking plan (runtime/thinking.py) and, where the reply may call tools,
    how the model writes calls (off the event loop: templates and tokenizing a long prompt
    take time)."""
    model = served.model
    thinking = syntax = media = None
    try:
        params = SamplingParams.resolve(served.opened.sampling_defaults,
                                        {**dict(config.sampling), **gen.overrides})
        if gen.chat:
            thinking, syntax = render_chat(served, gen, config)
            params = _forced_calls(params, syntax, gen, model)
            tokens, media = _with_media(served, gen, thinking, config)
            for note in thinking.notes:
                log.info("%s", note)
        elif gen.infill is not None:
            tokens = _infill(served, gen.infill, params.max_tokens)
        elif isinstance(gen.prompt, str):
            tokens = model.tokenize(gen.prompt, add_special=True, parse_special=False)
        else:
            bad = [t for t in gen.prompt if t >= model.n_vocab]
            if bad:
                raise invalid("prompt", f"token id {bad[0]} is not in the model's vocabulary "
                              f"of {model.n_vocab}")
            tokens = list(gen.prompt)
    except InferError as e:
        raise invalid(None, str(e)) from None
    if params.effective_grammar is not None:  # a bad grammar is the client's mistake: 400 now
        from infer.runtime.sampling import build_sampler_chain

        try:
            build_sampler_chain(params, model).close()
        except InferError as e:
            raise invalid("grammar" if params.grammar else "response_format", str(e)) from None
    for token, _ in params.logit_bias:  # (the runtime's rule, before a stream starts)
        problem = logit_bias_error(token, model.n_vocab)
        if problem is not None:
            raise invalid("logit_bias", problem)
    if not tokens:
        raise invalid("prompt" if not gen.chat else "messages", "the prompt is empty")
    problem = served.engine.fit_error(len(tokens), params.max_tokens)
    room = served.engine.slot_cells - len(tokens)
    if problem is not None and gen.max_tokens_caps and room > 0:
        params = replace(params, max_tokens=room)  # (the reply ends with the context: "max_tokens")
        problem = served.engine.fit_error(len(tokens), params.max_tokens)
    if problem is not None:
        limit, n_ctx = served.engine.slot_cells, served.engine.context.n_ctx
        whole = f"the context of {n_ctx} tokens" if limit == n_ctx else \
            f"the model's training context; the server's context has {n_ctx} tokens"
        raise invalid("messages" if gen.chat else "prompt",
                      f"this request needs {len(tokens) + (params.max_tokens or 1)} tokens of context "
                      f"({len(tokens)} in the prompt, {params.max_tokens or 1} to generate) but a "
                      f"request may use {limit} ({whole})", code="context_length_exceeded")
    variables = thinking.variables if thinking is not None else {}
    checkpoint = _checkpoint(served, gen, tokens, config, variables) if media is None else 0
    return Prepared(tokens, params, checkpoint, thinking, syntax, media)


def _infill(served: Served, infill: schema.Infill, max_tokens: int | None) -> list[int]:
    """A fill-in-the-middle prompt (runtime/infill.py): a 400 naming the suffix where the model
    has no FIM tokens."""
    from infer.runtime.infill import infill_tokens

    try:
        return infill_tokens(served.model, infill.prefix, infill.suffix, extra=infill.extra,
                             prompt=infill.prompt, n_batch=served.engine.context.n_batch,
                             n_ctx=served.engine.slot_cells, n_predict=max_tokens or 0)
    except InferError as e:
        raise invalid("suffix", str(e)) from None


def render_chat(served: Served, gen: schema.Generation,
                config: Config) -> tuple[ThinkingPrompt, ToolSyntax | None]:
    """A chat's prompt as the template renders it (with the tools where the reply may call
    them), and how the model writes calls (raises InferError)."""
    from infer.runtime.media import text_only
    from infer.runtime.thinking_prompt import thinking_prompt

    syntax = _tool_syntax(served, gen, config)
    thinking = thinking_prompt(served.model, text_only(gen.messages), template=config.chat_template,
                               request=gen.thinking, tools=gen.tools.tools if syntax else ())
    return thinking, syntax


def _with_media(served: Served, gen: schema.Generation, thinking: ThinkingPrompt,
                config: Config) -> tuple[list[int], Any]:
    """The chat's tokens with its messages' images and audio read in place (their chunks too),
    or its tokens as rendered where it has none."""
    from infer.runtime.media import media_of, media_prompt
    from infer.runtime.prompt import adds_bos

    media = media_of(gen.messages)
    if not media:
        return thinking.tokens, None
    if served.projector is None:
        raise invalid("messages", f"{served.name} reads no {media[0].kind}: it was loaded without a "
                      "projector (infer serve MODEL --mmproj FILE, or a Hub model whose repository has one)")
    from infer.server.remote_media import fetched

    media = fetched(media, allowed=config.allow_remote_media, timeout_s=config.remote_timeout_s)
    text = thinking.prompt.text
    mp = media_prompt(served.projector, text, media, add_special=adds_bos(served.model, text),
                      limit=config.max_media)
    return mp.tokens + thinking.tokens[len(thinking.prompt.tokens):], mp


def prompt_tokens(served: Served, gen: schema.Generation, config: Config) -> int:
    """How many tokens a chat's prompt is (Anthropic's count_tokens), off the event loop."""
    try:
        return len(render_chat(served, gen, config)[0].tokens)
    except InferError as e:
        raise invalid(None, str(e)) from None


def _forced_calls(params: SamplingParams, syntax: ToolSyntax | None, gen: schema.Generation,
                  model: Any) -> SamplingParams:
    """A reply that may call tools: held to a grammar of calls (runtime/tool_grammar.py)."""
    if syntax is None:
        return params
    from infer.runtime.errors import FieldError
    from infer.runtime.tool_grammar import calls_params

    try:
        return calls_params(params, syntax, gen.tools, model)
    except FieldError as e:
        raise invalid(e.field, str(e)) from None
    except InferError as e:
        raise invalid("tools", str(e)) from None


def _tool_syntax(served: Served, gen: schema.Generation, config: Config) -> ToolSyntax | None:
    """How the model writes tool calls, where the request lets the reply call its tools."""
    if not gen.tools.active:
        return None
    from infer.runtime.prompt import tool_syntax

    return tool_syntax(served.model, config.chat_template)


def _checkpoint(served: Served, gen: schema.Generation, tokens: list[int], config: Config,
                variables: dict[str, Any]) -> int:
    """Where the prompt cache may save the prompt's state: before the last message of a
    chat (what the next turn of the conversation sends again), the whole of a raw prompt."""
    cache = served.engine.prompt_cache
    if cache is None or len(tokens) <= cache.min_tokens:
        return 0
    if not gen.chat:
        return len(tokens)
    from infer.runtime.prompt import preamble_len

    return preamble_len(served.model, list(gen.messages), tokens, template=config.chat_template,
                        variables=variables)
