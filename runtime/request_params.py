"""Every request parameter, declared once: the table the rest of infer is derived from.

An entry names a parameter's `SamplingParams` field, its kind, llama.cpp's default, its
command-line spellings (llama.cpp's), the names each API gives it, its range and one
line of help. From this table come: the `SamplingParams` dataclass (runtime/sampling.py),
the Typer options of every model command (cli/options.py) and so the plain `infer run`
parser (cli/plain_args.json, generated from Typer), the flags' reading (cli/flags.py),
chat's `/set`, the remote client's request fields (cli/remote.py), the server's request
validation (server/schema.py), the model's recommended defaults (GGUF metadata and
models.toml) and the range checks. A new parameter is one entry here plus the code that
uses it (for a sampler: runtime/sampling.py's `sampler_specs`).

One rule per range: a flag, a `/set`, a request body and `SamplingParams` itself refuse a
value outside its range with the same check and the same words, naming it their own way
("--top-p" on the command line, "top_p" in a request).

Imports nothing native: the server's request validation and the CLI use it before any
model is loaded, and a plain `infer run` imports it on its way to the model.
"""

from __future__ import annotations

import math

from infer.runtime.errors import UsageError

TYPE_CHECKING = False  # (typing costs the start-up of every call: cli/main.py)
if TYPE_CHECKING:
    from typing import Any


class Range:
    """low <= value <= high, either end open (strict) or absent (unbounded).

    (A plain class: `dataclasses` costs a call through a server its start-up, cli/main.py.)"""

    __slots__ = ("high", "high_open", "low", "low_open", "only")

    def __init__(self, low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False, only: tuple[int, ...] = ()) -> None:
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open
        self.only = only  # an enumeration instead (mirostat: 0, 1 or 2)

    @property
    def unbounded(self) -> bool:
        return self.low is None and self.high is None and not self.only

    def holds(self, value: float) -> bool:
        if self.only:
            return value in self.only
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def words(self) -> str:
        """'in [0, 1]', 'in (0, 1]', '>= -1', '> 0', '0, 1 or 2'."""
        if self.only:
            *rest, last = (str(v) for v in self.only)
            return f"{', '.join(rest)} or {last}"
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return "a number"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# The APIs whose names an entry may give (`Param.api`): the server speaks OpenAI's, with
# llama-server's extensions; Ollama's, Anthropic's and OpenAI Responses' are for the
# endpoints to come.
APIS = ("openai", "llama_server", "ollama", "anthropic", "responses")

# What a kind is in Python (the field's annotation; the flag's type is the same, with
# a list for a repeatable one and TOKEN_ID+BIAS text for biases).
KINDS = {"int": "int", "float": "float", "bool": "bool", "text": "str", "texts": "tuple[str, ...]",
         "biases": "tuple[tuple[int, float], ...]"}


class Param:
    """One request parameter."""

    __slots__ = ("api", "catalog", "choices", "default", "field", "flag_none", "flags", "gguf", "group",
                 "help", "kind", "label", "optional", "range")

    def __init__(self, field: str, kind: str, default: Any, help: str, flags: tuple[str, ...] = (), *,
                 api: dict[str, str | tuple[str, ...]] | None = None, range: Range | None = None,
                 label: str = "", flag_none: int | None = None, gguf: str | None = None,
                 catalog: bool = False, optional: bool = False, group: str = "sampling",
                 choices: tuple[str, ...] = ()) -> None:
        self.field = field  # its SamplingParams field
        self.kind = kind  # a key of KINDS
        self.default = default  # llama.cpp's (None: unset, as for `seed`: a fresh random one)
        self.help = help  # one line, for --help
        self.flags = flags  # its command-line spellings; () for none
        self.api = api or {}  # API (of APIS) -> its name, or names, there
        self.range = range  # numbers only: the one rule for every surface
        self.label = label  # its name in the runtime's own messages ("top-p")
        self.flag_none = flag_none  # the flag value that means None (llama.cpp's -1: no limit, random)
        self.gguf = gguf  # the GGUF key of the model's recommendation (general.sampling.*)
        self.catalog = catalog  # a models.toml alias may recommend it
        self.optional = optional  # None is a value of the field
        # "sampling": a SamplingParams field; "reply": how a server returns the reply; "prompt": read
        # where the chat prompt is rendered and the model driven (thinking, template variables)
        self.group = group
        self.choices = choices  # the values a text parameter takes, where they are few

    def names(self, api: str) -> tuple[str, ...]:
        """Its names in `api` (the first is the one to send), none where it has no name there."""
        name = self.api.get(api, ())
        return (name,) if isinstance(name, str) else name

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "float")

    @property
    def annotation(self) -> str:
        return KINDS[self.kind] + (" | None" if self.optional else "")


def _api(name: str, *, ollama: str | None = None, anthropic: str | None = None,
         responses: str | None = None, openai: bool = False) -> dict[str, str | tuple[str, ...]]:
    """Where an entry's name is the same in OpenAI (if `openai`) and llama-server, and Ollama's,
    Anthropic's and Responses' names where those APIs have the parameter."""
    names: dict[str, str | tuple[str, ...]] = {"llama_server": name}
    if openai:
        names["openai"] = name
    for api, other in (("ollama", ollama), ("anthropic", anthropic), ("responses", responses)):
        if other is not None:
            names[api] = other
    return names


def _same(name: str, *apis: str) -> dict[str, str]:
    return dict.fromkeys(apis, name)


# In the order of --help (the sampling panel) and of `/set`'s list. Where the server and
# the runtime disagreed, the rule is llama.cpp's (what its samplers do something sensible
# with): temperature has no upper bound (OpenAI's cap of 2 was the server's alone), top-p and
# typical-p take 0 (the most likely token alone, as OpenAI's top_p 0), the repeat penalty and
# mirostat's tau and eta must be above 0 (0 divides by zero), presence and frequency
# penalties are unbounded (OpenAI's [-2, 2] was the server's alone).
PARAMS: dict[str, Param] = {p.field: p for p in (
    Param("max_tokens", "int", None, "Tokens to generate at most (-1: until the end or a full context).",
          ("-n", "--max-tokens"), optional=True, flag_none=-1,
          api={"openai": ("max_completion_tokens", "max_tokens"), "llama_server": "n_predict",
               "ollama": "num_predict", "anthropic": "max_tokens", "responses": "max_output_tokens"}),
    Param("temperature", "float", 0.8, "Temperature; 0 is greedy and deterministic.",
          ("--temp", "--temperature"), range=Range(0), label="temperature", gguf="general.sampling.temp",
          catalog=True, api=_api("temperature", openai=True, ollama="temperature", anthropic="temperature",
                                 responses="temperature")),
    Param("top_k", "int", 40, "Top-k sampling (0: off).", ("--top-k",), range=Range(0), label="top-k",
          gguf="general.sampling.top_k", catalog=True,
          api=_api("top_k", ollama="top_k", anthropic="top_k")),
    Param("top_p", "float", 0.95, "Top-p (nucleus) sampling, in [0, 1].", ("--top-p",), range=Range(0, 1),
          label="top-p", gguf="general.sampling.top_p", catalog=True,
          api=_api("top_p", openai=True, ollama="top_p", anthropic="top_p", responses="top_p")),
    Param("min_p", "float", 0.05, "Min-p sampling, in [0, 1].", ("--min-p",), range=Range(0, 1),
          label="min-p", gguf="general.sampling.min_p", catalog=True, api=_api("min_p", ollama="min_p")),
    Param("top_n_sigma", "float", -1.0, "Top-n-sigma: keep the tokens within N standard deviations of the "
          "likeliest logit (-1: off).", ("--top-nsigma", "--top-n-sigma"), range=Range(-1),
          label="top-n-sigma", api=_api("top_n_sigma")),
    Param("typical_p", "float", 1.0, "Locally typical sampling, in [0, 1].", ("--typical-p", "--typical"),
          range=Range(0, 1), label="typical-p", catalog=True, api=_api("typical_p", ollama="typical_p")),
    Param("repeat_penalty", "float", 1.0, "Penalize repeated tokens (1.0: off).", ("--repeat-penalty",),
          range=Range(0, low_open=True), label="repeat penalty", gguf="general.sampling.penalty_repeat",
          catalog=True, api=_api("repeat_penalty", ollama="repeat_penalty")),
    Param("repeat_last_n", "int", 64, "Window of the repeat penalty in tokens (-1: whole context).",
          ("--repeat-last-n",), range=Range(-1), label="repeat-last-n",
          gguf="general.sampling.penalty_last_n", catalog=True,
          api=_api("repeat_last_n", ollama="repeat_last_n")),
    Param("presence_penalty", "float", 0.0,
          "Lower every token already in the window by this, once (0: off).", ("--presence-penalty",),
          range=Range(), label="presence penalty", catalog=True,
          api=_api("presence_penalty", openai=True, ollama="presence_penalty")),
    Param("frequency_penalty", "float", 0.0,
          "Lower every token by this for each time it is in the window (0: off).", ("--frequency-penalty",),
          range=Range(), label="frequency penalty", catalog=True,
          api=_api("frequency_penalty", openai=True, ollama="frequency_penalty")),
    Param("seed", "int", None, "Random seed (-1: random). The same seed gives the same text.", ("--seed",),
          range=Range(0, 0xFFFFFFFF), label="seed", optional=True, flag_none=-1,
          api=_api("seed", openai=True, ollama="seed")),
    Param("mirostat", "int", 0, "Mirostat: 0 off, 1 or 2.", ("--mirostat",), range=Range(only=(0, 1, 2)),
          label="mirostat", gguf="general.sampling.mirostat", api=_api("mirostat", ollama="mirostat")),
    Param("mirostat_eta", "float", 0.1, "Mirostat eta.", ("--mirostat-lr",), range=Range(0, low_open=True),
          label="mirostat eta", gguf="general.sampling.mirostat_eta",
          api=_api("mirostat_eta", ollama="mirostat_eta")),
    Param("mirostat_tau", "float", 5.0, "Mirostat tau.", ("--mirostat-ent",), range=Range(0, low_open=True),
          label="mirostat tau", gguf="general.sampling.mirostat_tau",
          api=_api("mirostat_tau", ollama="mirostat_tau")),
    Param("dry_multiplier", "float", 0.0, "DRY repetition penalty (0: off).", ("--dry-multiplier",),
          range=Range(0), label="DRY multiplier", api=_api("dry_multiplier")),
    Param("dry_base", "float", 1.75,
          "DRY: how fast its penalty grows with the repeat's length (default 1.75).", ("--dry-base",),
          range=Range(1), label="DRY base", api=_api("dry_base")),
    Param("dry_allowed_length", "int", 2,
          "DRY: repeats this long or shorter are not penalized (default 2).", ("--dry-allowed-length",),
          range=Range(0), label="DRY allowed length", api=_api("dry_allowed_length")),
    Param("dry_penalty_last_n", "int", -1,
          "DRY: the recent tokens it looks through (-1: the whole context).", ("--dry-penalty-last-n",),
          range=Range(-1), label="DRY penalty-last-n", api=_api("dry_penalty_last_n")),
    Param("dry_sequence_breakers", "texts", ("\n", ":", '"', "*"),
          "Repeatable; 'none' clears the defaults.", ("--dry-sequence-breaker",)),
    Param("xtc_probability", "float", 0.0,
          "XTC: the chance, at each token, of leaving out the likeliest choices (0: off).",
          ("--xtc-probability",), range=Range(0, 1), label="XTC probability",
          gguf="general.sampling.xtc_probability", api=_api("xtc_probability")),
    Param("xtc_threshold", "float", 0.1,
          "XTC: choices at least this likely are left out, all but the least likely of them (default 0.1).",
          ("--xtc-threshold",), range=Range(0, 1), label="XTC threshold",
          gguf="general.sampling.xtc_threshold", api=_api("xtc_threshold")),
    Param("logit_bias", "biases", (), "TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 2-inf; repeatable.",
          ("--logit-bias",), api=_same("logit_bias", "openai", "llama_server")),
    Param("stop", "texts", (), "Stop before this text (not printed); repeatable.", ("--stop",),
          api={**_same("stop", "openai", "llama_server", "ollama"), "anthropic": "stop_sequences"}),
    Param("grammar", "text", None, "A GBNF grammar the output must follow.", ("--grammar",), optional=True,
          api=_api("grammar")),
    Param("json_schema", "text", None, "A JSON schema the output must follow: inline JSON or @file.",
          ("--json-schema",), optional=True, api={"openai": "response_format", "llama_server": "json_schema",
                                                  "ollama": "format", "responses": "text"}),
    Param("ignore_eos", "bool", False, "Never stop at end-of-generation tokens.", ("--ignore-eos",),
          api=_api("ignore_eos")),
    # How the chat prompt is rendered (runtime/reasoning.py: a template's own switches).
    Param("think", "text", None, "Thinking: on, off, low, medium or high, set as the model's chat template "
          "expects (default: the template's own).", ("--think",), optional=True, group="prompt",
          choices=("on", "off", "low", "medium", "high"),
          api={"ollama": "think", "llama_server": "think", "openai": "reasoning_effort"}),
    Param("chat_template_kwargs", "text", None, "More variables for the chat template, as a JSON object "
          "(e.g. '{\"enable_thinking\": false}').", ("--chat-template-kwargs",), optional=True,
          group="prompt", api={"llama_server": "chat_template_kwargs"}),
    Param("reasoning_budget", "int", None, "At most N tokens of thinking: then the reasoning block is closed "
          "and the answer follows (0: none; -1: no limit).", ("--reasoning-budget",), optional=True,
          range=Range(-1), label="reasoning budget", group="prompt",
          api={"llama_server": "reasoning_budget"}),
    # The tools a reply may call (runtime/tool_request.py checks them; runtime/tool_syntax.py
    # learns how the model writes calls).
    Param("tools", "text", None, "Tools the model may call: a JSON array of OpenAI function tools, inline "
          "or @file.", ("--tools",), optional=True, group="tools",
          api={**_same("tools", "openai", "llama_server", "ollama", "anthropic", "responses")}),
    Param("tool_choice", "text", None, "auto (the default), none, required, or the name of the one tool to "
          "call.", ("--tool-choice",), optional=True, group="tools",
          api={**_same("tool_choice", "openai", "llama_server", "anthropic", "responses")}),
    Param("parallel_tool_calls", "bool", True, "Whether a reply may hold more than one call.", (),
          group="tools", api={**_same("parallel_tool_calls", "openai", "llama_server", "responses")}),
    # How the reply is returned: a server's alone (`infer run --json` always has it apart).
    Param("reasoning_format", "text", "auto", "A thinking model's reasoning apart (auto, deepseek) or left "
          "in the text (none).", (), group="reply", choices=("auto", "deepseek", "none"),
          api={"llama_server": "reasoning_format"}),
)}
SAMPLING = {name: p for name, p in PARAMS.items() if p.group == "sampling"}  # SamplingParams' fields


def out_of_range(field: str, value: float, name: str | None = None) -> str | None:
    """Why `value` cannot be `field` (called `name` where it was given; by default the
    runtime's words for it), or None."""
    param = PARAMS[field]
    name = name or param.label
    if isinstance(value, float) and math.isnan(value):
        return f"{name} must be a number, got NaN"
    assert param.range is not None, field
    if isinstance(value, float) and math.isinf(value) and param.range.unbounded:
        return f"{name} must be finite, got {value}"
    return None if param.range.holds(value) else f"{name} must be {param.range.words()}, got {value}"


def logit_bias_error(token: int, n_vocab: int | None = None) -> str | None:
    """Why `token` cannot take a logit bias (outside the vocabulary of `n_vocab`), or None."""
    if token < 0:
        return f"logit bias token id must be >= 0, got {token}"
    if n_vocab is not None and token >= n_vocab:
        return f"logit bias token id {token} is outside the vocabulary of {n_vocab}"
    return None


def parse_logit_bias(spec: str) -> tuple[int, float]:
    """llama.cpp's `TOKEN_ID(+|-)BIAS` form, e.g. `15043+1` or `15043-inf`."""
    for i, ch in enumerate(spec):
        if ch in "+-" and i > 0:
            token_s, bias_s = spec[:i], spec[i:]
            break
    else:
        raise UsageError(f"logit bias {spec!r} must look like TOKEN_ID+BIAS or TOKEN_ID-BIAS")
    try:
        token, bias = int(token_s), float(bias_s)
    except ValueError:
        raise UsageError(f"logit bias {spec!r} must look like TOKEN_ID+BIAS or TOKEN_ID-BIAS") from None
    return token, bias


def set_value(param: Param, text: str) -> Any:
    """A value typed as text (chat's /set) in `param`'s kind; ValueError if it is not one.
    'none' or nothing clears an optional parameter."""
    if param.optional and text.lower() in ("", "none"):
        return None
    if param.kind == "bool":
        words = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False,
                 "no": False}
        if text.lower() not in words:
            raise ValueError(text)
        return words[text.lower()]
    if param.kind == "texts":
        return (text,) if text else ()
    if param.kind == "biases":
        return tuple(parse_logit_bias(x) for x in text.split())
    return {"int": int, "float": float, "text": str}[param.kind](text)
