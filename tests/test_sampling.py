"""Sampling: constraints do the work on a random model; defaults layer as documented."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import run_cli
from tiny_model import build_llama_gguf

from infer.runtime.errors import UsageError
from infer.runtime.sampling import SamplingParams, parse_logit_bias

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "kind": {"enum": ["a", "b", 3]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "tags", "kind"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_json_schema_output_parses_and_validates(tiny_qwen, seed):
    r = run_cli("run", tiny_qwen, "Describe a person.", "--json-schema", json.dumps(SCHEMA),
                "--seed", seed, "-n", "400", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "eos", out  # the grammar ended it, not the token limit
    jsonschema.validate(json.loads(out["text"]), SCHEMA)


def test_schema_keywords_the_grammar_cannot_enforce_are_refused(tiny_qwen):
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}
    r = run_cli("run", tiny_qwen, "x", "--json-schema", json.dumps(schema))
    assert r.returncode == 2
    assert "properties.age.minimum" in r.stderr


def test_json_schema_from_file(tiny_qwen, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "array", "items": {"type": "boolean"}, "maxItems": 4}))
    r = run_cli("run", tiny_qwen, "x", "--json-schema", f"@{schema}", "--seed", "4", "-n", "100")
    assert r.returncode == 0, r.stderr
    value = json.loads(r.stdout)
    assert isinstance(value, list) and all(isinstance(v, bool) for v in value)


def test_gbnf_grammar_constrains_output(tiny_qwen):
    grammar = 'root ::= ("yes" | "no") " " [0-9] [0-9]'
    for seed in (1, 2):
        r = run_cli("run", tiny_qwen, "Answer.", "--grammar", grammar, "--seed", seed, "-n", "20")
        assert r.returncode == 0, r.stderr
        word, number = r.stdout.strip().split(" ")
        assert word in ("yes", "no") and len(number) == 2 and number.isdigit()


def test_logit_bias_forces_a_token(tiny_qwen):
    # Token 9693 is "yes" in the Qwen 2 vocabulary; a huge bias makes it the only choice.
    r = run_cli("run", tiny_qwen, "x", "--logit-bias", "9693+1000", "-n", "3", "--seed", "1",
                "--json")
    assert json.loads(r.stdout)["text"] == "yes" * 3


def test_model_recommended_sampling_applies_and_flags_override(fixtures, models_dir):
    path = build_llama_gguf(models_dir / "greedy-default.gguf", vocab="llama-spm",
                            sampling={"temp": 0.0})
    a = json.loads(run_cli("run", path, "Hi", "-n", "8", "--json").stdout)
    b = json.loads(run_cli("run", path, "Hi", "-n", "8", "--json").stdout)
    assert a["text"] == b["text"]  # the model asks for temperature 0: deterministic
    hot = {json.loads(run_cli("run", path, "Hi", "-n", "8", "--temp", "1.5", "--json",
                                 "--seed", s).stdout)["text"] for s in ("1", "2", "3")}
    assert len(hot) > 1  # the flag overrides the model's default


def test_ignore_eos_generates_the_full_count(tiny_qwen):
    out = json.loads(run_cli("run", tiny_qwen, "x", "--grammar", 'root ::= "a"', "--ignore-eos",
                             "-n", "1", "--json").stdout)
    assert out["usage"]["completion_tokens"] == 1


def test_resolve_layers_defaults_model_and_flags():
    p = SamplingParams.resolve({"temperature": 0.3, "top_k": 20}, {"top_k": 5})
    assert (p.temperature, p.top_k, p.top_p) == (0.3, 5, 0.95)


@pytest.mark.parametrize("kwargs", [
    {"temperature": -0.1}, {"top_p": -0.1}, {"top_p": 1.01}, {"top_k": -1}, {"min_p": 1.5},
    {"typical_p": -0.5}, {"repeat_penalty": 0}, {"mirostat": 5}, {"xtc_probability": 2},
    {"mirostat_tau": 0}, {"mirostat_eta": 0}, {"presence_penalty": float("inf")},
    {"dry_base": 0.5}, {"top_n_sigma": -2}, {"max_tokens": -2}, {"stop": ("",)}, {"seed": -5},
    {"grammar": "root ::= \"a\"", "json_schema": "{}"}, {"temperature": float("nan")},
])
def test_out_of_range_values_are_usage_errors(kwargs):
    with pytest.raises(UsageError):
        SamplingParams(**kwargs)


def test_logit_bias_parsing():
    assert parse_logit_bias("15043+1") == (15043, 1.0)
    assert parse_logit_bias("2-inf") == (2, float("-inf"))
    with pytest.raises(UsageError):
        parse_logit_bias("+1")


def kinds(p: SamplingParams) -> list[str]:
    from infer.runtime.sampling import sampler_specs

    return [s.kind for s in sampler_specs(p.with_seed(), n_vocab=100, eog_tokens=lambda: [2])]


def test_default_chain_follows_llama_cpp_order():
    assert kinds(SamplingParams()) == ["top_k", "top_p", "min_p", "temp", "dist"]


def test_chain_includes_every_sampler_that_is_switched_on():
    p = SamplingParams(logit_bias=((5, 1.0),), grammar='root ::= "a"', repeat_penalty=1.1,
                       dry_multiplier=0.8, typical_p=0.9, xtc_probability=0.5, top_n_sigma=1.5)
    assert kinds(p) == ["logit_bias", "grammar", "penalties", "dry", "top_n_sigma", "top_k", "typical",
                        "top_p", "min_p", "xtc", "temp", "dist"]


def test_greedy_and_mirostat_replace_the_random_draw():
    assert kinds(SamplingParams(temperature=0)) == ["greedy"]
    assert kinds(SamplingParams(mirostat=2)) == ["temp", "mirostat_v2"]
    assert kinds(SamplingParams(temperature=0, ignore_eos=True)) == ["logit_bias", "greedy"]


# --- a grammar checks the drawn token first (runtime/llama/sampler_chain.py, SamplerChain) ---

STORY = [{"role": "user", "content": "Write a story about a cat."}]
LOWERCASE = "root ::= [a-z ,.]+"  # the model's first choice, "Once", is refused


def _allowed(model, grammar_sampler, logits):
    """Which tokens `grammar_sampler` (in its current state) allows, as a boolean array."""
    import ctypes

    import numpy as np

    from infer.runtime.llama import sampler_chain as L

    row = np.ascontiguousarray(logits, dtype=np.float32)
    cur = L._Candidates(model.n_vocab).fill(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
    L.C.llama_sampler_apply(grammar_sampler, ctypes.byref(cur))
    data = np.ctypeslib.as_array(cur.data, shape=(cur.size,))
    out = np.zeros(model.n_vocab, dtype=bool)
    out[data["id"][np.isfinite(data["logit"])]] = True
    return out


def test_greedy_under_a_grammar_takes_the_likeliest_token_it_allows(smollm2):
    """The chain draws without the grammar and draws again with it only when the grammar refuses
    the token. Greedy decoding must still take, at every step, the likeliest of the tokens the
    grammar allows: checked against the grammar applied to the whole vocabulary."""
    import numpy as np

    from infer.runtime.llama import sampler_chain as L
    from infer.runtime.params import ContextParams
    from infer.runtime.prompt import chat_prompt
    from infer.runtime.sampling import build_sampler_chain
    from infer.runtime.session import Session

    with Session.open(smollm2, ContextParams(n_ctx=512, n_threads=2)) as s:
        s.prefill(chat_prompt(s.model, STORY).tokens)
        judge = L._make_sampler(s.model, L.SamplerSpec("grammar", (LOWERCASE,)))
        refused = 0
        try:
            with build_sampler_chain(SamplingParams(temperature=0, grammar=LOWERCASE), s.model) as chain:
                for _ in range(40):
                    logits = np.asarray(s.context.logits(-1), dtype=np.float32)
                    allowed = _allowed(s.model, judge, logits)
                    refused += not allowed[int(np.argmax(logits))]
                    best = int(np.argmax(np.where(allowed, logits, -np.inf)))
                    token = chain.sample(s.context)
                    assert token == best
                    L.C.llama_sampler_accept(judge, token)
                    s.decode_token(token)
        finally:
            L.C.llama_sampler_free(judge)
    assert refused >= 1  # the second draw was exercised


def test_a_grammar_overrules_an_infinite_logit_bias(smollm2):
    """+inf on a token the grammar refuses: the grammar wins (no NaN from -inf + inf), and
    without the grammar the bias forces the token."""
    from infer.runtime.params import ContextParams
    from infer.runtime.prompt import chat_prompt
    from infer.runtime.sampling import build_sampler_chain
    from infer.runtime.session import Session

    with Session.open(smollm2, ContextParams(n_ctx=512, n_threads=2)) as s:
        capital = s.model.tokenize("Once", add_special=False, parse_special=False)[0]
        s.prefill(chat_prompt(s.model, STORY).tokens)
        for grammar in (None, LOWERCASE):
            params = SamplingParams(temperature=0.8, seed=5, grammar=grammar,
                                    logit_bias=((capital, float("inf")),))
            with build_sampler_chain(params, s.model) as chain:
                token = chain.sample(s.context)
            text = s.model.token_bytes(token).decode("utf-8", "replace")
            if grammar is None:
                assert token == capital
            else:
                assert token != capital and text and all(c in "abcdefghijklmnopqrstuvwxyz ,." for c in text)
