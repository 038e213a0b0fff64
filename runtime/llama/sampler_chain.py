"""llama.cpp's native sampler chain (``SamplerChain``), built from ``SamplerSpec`` data;
a grammar in it is checked on the drawn token first."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from infer.runtime.errors import LlamaError, UsageError
from infer.runtime.llama.bindings import C
from infer.runtime.llama.grammar_trigger import GrammarTrigger, allows
from infer.runtime.llama.stderr import native_stderr_captured
from infer.runtime.log import logger

if TYPE_CHECKING:
    from infer.runtime.llama.context import Context
    from infer.runtime.llama.model import Model

log = logger("infer.llama")

_FLT_MAX = 3.4028234663852886e38


class SamplerSpec(NamedTuple):
    """One sampler of a chain, as data: its kind and its arguments (see SamplerChain)."""

    kind: str
    args: tuple[Any, ...] = ()


# Samplers whose constructors take plain numbers, in llama.h's argument order.
_PLAIN_SAMPLERS = {
    "greedy": C.llama_sampler_init_greedy,
    "dist": C.llama_sampler_init_dist,  # (seed)
    "temp": C.llama_sampler_init_temp,  # (t)
    "top_k": C.llama_sampler_init_top_k,  # (k)
    "top_p": C.llama_sampler_init_top_p,  # (p, min_keep)
    "min_p": C.llama_sampler_init_min_p,  # (p, min_keep)
    "typical": C.llama_sampler_init_typical,  # (p, min_keep)
    "xtc": C.llama_sampler_init_xtc,  # (p, t, min_keep, seed)
    "top_n_sigma": C.llama_sampler_init_top_n_sigma,  # (n)
    "penalties": C.llama_sampler_init_penalties,  # (n_vocab, last_n, repeat, freq, present)
    "mirostat": C.llama_sampler_init_mirostat,  # (n_vocab, seed, tau, eta, m)
    "mirostat_v2": C.llama_sampler_init_mirostat_v2,  # (seed, tau, eta)
}


class SamplerChain:
    """A native llama.cpp sampler chain; sampling and accepting happen in C.

    Besides the plain samplers above it takes ``logit_bias`` ((token, bias) pairs),
    ``grammar`` (GBNF text[, its root rule[, trigger patterns: a grammar that waits for
    them, runtime/llama/grammar_trigger.py]]) and ``dry`` (multiplier, base, allowed length,
    penalty-last-n, sequence breakers).

    A grammar is checked on the drawn token first, as llama.cpp's own tools do
    (common_sampler): the chain draws without it, and only when the grammar refuses
    that token is the draw made again, from the state before it, with the grammar
    applied to every token of the vocabulary first (about 8 ms a token for a 49k
    vocabulary on a CPU core: applied at every token, it halved the decode speed of
    every constrained reply). Greedy decoding picks the same token either way; a
    random draw follows llama.cpp's distribution.
    """

    def __init__(self, model: Model, specs: Sequence[SamplerSpec]) -> None:
        self._model = model
        self._grammar: Any = None
        self._trigger: GrammarTrigger | None = None  # what the grammar waits for, if it waits
        self._ptr: Any = None  # every sampler but the grammar, in order
        self._n_vocab = model.n_vocab
        self._candidates: _Candidates | None = None  # made at the first refused draw
        try:
            for spec in specs:
                if spec.kind == "grammar":
                    self.set_grammar(spec)
            self._ptr = _chain(model, [spec for spec in specs if spec.kind != "grammar"])
        except BaseException:
            self.close()
            raise

    def sample(self, ctx: Context, idx: int = -1) -> int:
        """Sample from the logits of output `idx` and accept the token into the chain's state."""
        if self._grammar is None:
            token = int(C.llama_sampler_sample(self._ptr, ctx._ptr, idx))
            if self._trigger is not None:
                self._watch(token)
            return token
        before = C.llama_sampler_clone(self._ptr)
        if not before:
            raise LlamaError("llama.cpp could not copy the sampler chain")
        token = int(C.llama_sampler_sample(self._ptr, ctx._ptr, idx))
        if allows(self._grammar, token):
            C.llama_sampler_free(before)
        else:  # draw again from the state before, among the tokens the grammar allows
            C.llama_sampler_free(self._ptr)
            self._ptr = before
            token = self._constrained_draw(ctx, idx)
            C.llama_sampler_accept(self._ptr, token)
        C.llama_sampler_accept(self._grammar, token)
        return token

    def _watch(self, token: int) -> None:
        assert self._trigger is not None
        done, self._grammar = self._trigger.feed(
            token, lambda grammar, root: _make_sampler(self._model, SamplerSpec("grammar", (grammar, root))))
        if done:
            self._trigger = None
            if self._grammar is None:
                log.debug("the text that completed the grammar's trigger is not the grammar's: left free")

    def _constrained_draw(self, ctx: Context, idx: int) -> int:
        """The grammar over the whole vocabulary, then the chain: the token selected."""
        logits = C.llama_get_logits_ith(ctx._ptr, idx)
        if not logits:
            raise LlamaError(f"no logits for output {idx}")
        if self._candidates is None:
            self._candidates = _Candidates(self._n_vocab)
        cur = self._candidates.fill(logits)
        # (The grammar before a logit bias, where the chain has it after: the same tokens
        # are left, as the bias is finite or -inf; see _make_sampler.)
        for smpl in (self._grammar, self._ptr):
            C.llama_sampler_apply(smpl, ctypes.byref(cur))
        if not 0 <= cur.selected < cur.size:
            raise LlamaError("the sampler chain selected no token")
        return int(cur.data[cur.selected].id)

    def set_grammar(self, spec: SamplerSpec | None) -> None:
        """Constrain what follows with a fresh grammar (a "grammar" spec), or no longer (None):
        the other samplers keep their state (a thinking model's answer: runtime/thinking.py)."""
        trigger, fresh = None, None
        if spec is not None and spec.args[2:] and spec.args[2]:
            grammar, root, patterns = spec.args
            checked = _make_sampler(self._model, SamplerSpec("grammar", (grammar, root)))  # (bad: raises now)
            C.llama_sampler_free(checked)
            trigger = GrammarTrigger(self._model, grammar, root, tuple(patterns))
        elif spec is not None:
            fresh = _make_sampler(self._model, spec)
        if self._grammar:
            C.llama_sampler_free(self._grammar)
        self._grammar, self._trigger = fresh, trigger

    def accept(self, token: int) -> None:
        C.llama_sampler_accept(self._ptr, token)
        if self._grammar:
            C.llama_sampler_accept(self._grammar, token)
        elif self._trigger is not None:
            self._watch(token)

    def clone(self) -> SamplerChain:
        """An independent copy in the same state (random generator, penalties, grammar)."""
        twin = SamplerChain.__new__(SamplerChain)
        twin._model, twin._n_vocab, twin._candidates = self._model, self._n_vocab, None
        twin._ptr = C.llama_sampler_clone(self._ptr)
        twin._grammar = C.llama_sampler_clone(self._grammar) if self._grammar else None
        twin._trigger = self._trigger.copy() if self._trigger is not None else None
        return twin

    def close(self) -> None:
        for name in ("_grammar", "_ptr"):
            smpl = getattr(self, name, None)
            if smpl:
                C.llama_sampler_free(smpl)
            setattr(self, name, None)

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chain(model: Model, specs: Sequence[SamplerSpec]) -> Any:
    params = C.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = C.llama_sampler_chain_init(params)
    try:
        for spec in specs:
            C.llama_sampler_chain_add(chain, _make_sampler(model, spec))
    except BaseException:
        C.llama_sampler_free(chain)
        raise
    return chain


class _Candidates:
    """Every token of the vocabulary with its logit, as llama.cpp's samplers take them
    (llama_token_data: id, logit, p), filled from a row of logits without a Python loop."""

    def __init__(self, n_vocab: int) -> None:
        import array

        self.n = n_vocab
        self._blank = (C.llama_token_data * n_vocab)()  # ids in order, logits and p zero
        memoryview(self._blank).cast("B").cast("i")[0::3] = array.array("i", range(n_vocab))
        self._data = (C.llama_token_data * n_vocab)()
        self._logits = memoryview(self._data).cast("B").cast("f")[1::3]
        self._start = ctypes.cast(self._data, C.llama_token_data_p)
        self._array = C.llama_token_data_array(self._start, n_vocab, -1, False)

    def fill(self, logits: Any) -> Any:
        """The array with these logits (a float pointer of n_vocab), unsorted, none selected."""
        ctypes.memmove(self._data, self._blank, ctypes.sizeof(self._data))
        row = (ctypes.c_float * self.n).from_address(ctypes.addressof(logits.contents))
        self._logits[:] = memoryview(row).cast("B").cast("f")
        a = self._array
        a.data, a.size, a.selected, a.sorted = self._start, self.n, -1, False  # (samplers move them)
        return a


# How deep a grammar's parenthesised groups may nest: llama.cpp's parser takes one stack frame
# per level and crashes the process (SIGSEGV) at some 30,000 on an 8 MiB stack; 10,000 was
# measured to parse. Schemas' lengths of up to json_schema.MAX_REPEAT nest that deep.
MAX_GRAMMAR_NESTING = 4000


def _nesting(grammar: str) -> int:
    """The deepest nesting of ( ) groups in GBNF text, outside literals, classes and comments."""
    depth = deepest = 0
    quote: str | None = None  # the closing character of the literal or class we are in
    escaped = comment = False
    for ch in grammar:
        if comment:
            comment = ch != "\n"
        elif quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch == '"':
            quote = '"'
        elif ch == "[":
            quote = "]"
        elif ch == "#":
            comment = True
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


def _make_sampler(model: Model, spec: SamplerSpec) -> Any:
    kind, args = spec
    if kind in _PLAIN_SAMPLERS:
        smpl = _PLAIN_SAMPLERS[kind](*args)
    elif kind == "logit_bias":
        (biases,) = args
        arr = (C.llama_logit_bias * len(biases))()
        for i, (token, bias) in enumerate(biases):
            arr[i].token = token
            # +inf as the largest float: the same choice, and -inf (a grammar's refusal,
            # applied first by SamplerChain's second draw) plus it stays -inf, not NaN.
            arr[i].bias = min(bias, _FLT_MAX)
        smpl = C.llama_sampler_init_logit_bias(model.n_vocab, len(biases), arr)
    elif kind == "dry":
        multiplier, base, allowed_length, last_n, breakers = args
        encoded = [b.encode("utf-8") for b in breakers]
        arr_b = (ctypes.c_char_p * len(encoded))(*encoded)
        smpl = C.llama_sampler_init_dry(model.vocab, multiplier, base, allowed_length, last_n,
                                        arr_b, len(encoded))
    elif kind == "grammar":  # (GBNF text[, the name of its root rule])
        grammar, root = (*args, "root")[:2]
        depth = _nesting(grammar)
        if depth > MAX_GRAMMAR_NESTING:  # (llama.cpp's parser recurses per group: the stack overflows)
            raise UsageError(f"invalid grammar: groups nested {depth} deep (at most {MAX_GRAMMAR_NESTING})")
        with native_stderr_captured() as said:  # the parser reports errors on fd 2
            smpl = C.llama_sampler_init_grammar(model.vocab, grammar.encode("utf-8"), root.encode())
        detail = " ".join(said.text.split())
        if not smpl:
            raise UsageError(f"invalid grammar: {detail}" if detail else "invalid grammar")
        if detail:
            log.warning("%s", detail)
    else:
        raise LlamaError(f"unknown sampler kind {kind!r}")
    if not smpl:
        raise UsageError(f"llama.cpp rejected the {kind} sampler settings {args!r}")
    return smpl
