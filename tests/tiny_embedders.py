"""Tiny random-weight sentence-transformers models (issue 37), saved as safetensors as the Hub
has them, each with the modules that pool its tokens (mean, cls or last) and normalize:

- a BERT with a WordPiece tokenizer trained here with the `tokenizers` library (lowercasing
  BertNormalizer, [CLS] text [SEP]);
- a Qwen3-Embedding: the Qwen 3 decoder on the qwen3 fixture tokenizer, last-token pooling;
- an XLM-RoBERTa (bge-m3's shape) with a SentencePiece Unigram tokenizer trained here with the
  `sentencepiece` library (NFKC as a precompiled charsmap), as an embedder or a cross-encoder."""

from __future__ import annotations

import json
from pathlib import Path

# Text the tokenizer learns its pieces from: words, numbers, punctuation, some accents and CJK.
CORPUS = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "A cat sat on the mat; the dog slept by the door.",
    "Embeddings map texts to vectors: similar texts, similar vectors.",
    "Search the documents, rank them, then ask the model.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Numbers: 1 2 3 4 5 6 7 8 9 10 100 1911 1940 1952 1999 2024.",
    "Café, naïve, façade, déjà vu, résumé, über, señor.",
    "北京 上海 东京 你好 世界",
    "Questions? Answers! Quotes 'single' and \"double\" (brackets) [square] {curly}.",
    "The museum opened in 1911. Its first director was Ada Lind.",
] * 20


def build_bert(folder: Path, *, pooling: str = "mean", n_embd: int = 64, seed: int = 0) -> Path:
    """Write the checkpoint into `folder` (created); `pooling`: "mean", "cls" or "lasttoken"."""
    import torch
    from transformers import BertConfig, BertModel

    vocab_size = _wordpiece(folder)
    # weights larger than BERT's initial 0.02: each text's vector then differs clearly from another's
    config = BertConfig(vocab_size=vocab_size, hidden_size=n_embd, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=2 * n_embd, max_position_embeddings=128,
                        initializer_range=0.2)
    torch.manual_seed(seed)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder, safe_serialization=True)
    _sentence_transformers(folder, pooling, n_embd)
    return folder


def build_bert_reranker(folder: Path, *, n_embd: int = 64, seed: int = 0) -> Path:
    """A cross-encoder: BertForSequenceClassification with one label (its score), one token
    type (as RoBERTa's rerankers: llama.cpp gives every token type 0)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=_wordpiece(folder), hidden_size=n_embd, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=2 * n_embd, max_position_embeddings=128,
                        initializer_range=0.2, num_labels=1, type_vocab_size=1)
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(folder, safe_serialization=True)
    return folder


def build_xlm_roberta(folder: Path, *, pooling: str | None = "cls", n_embd: int = 64,
                      seed: int = 0) -> Path:
    """An XLM-RoBERTa with a Unigram tokenizer trained on CORPUS: an embedder pooling by
    `pooling` (bge-m3 pools by cls), or with pooling None a cross-encoder
    (XLMRobertaForSequenceClassification with one label, bge-reranker-v2-m3's shape)."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaModel

    vocab_size = _unigram(folder)
    config = XLMRobertaConfig(vocab_size=vocab_size, hidden_size=n_embd, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=2 * n_embd,
                              max_position_embeddings=130, initializer_range=0.2, type_vocab_size=1,
                              pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5,
                              num_labels=1)
    torch.manual_seed(seed)
    if pooling is None:
        XLMRobertaForSequenceClassification(config).save_pretrained(folder, safe_serialization=True)
        return folder
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(folder, safe_serialization=True)
    _sentence_transformers(folder, pooling, n_embd)
    return folder


def _unigram(folder: Path) -> int:
    """A SentencePiece Unigram model trained on CORPUS, saved in `folder` (created) as XLM-R's
    tokenizer (fairseq's ids: <s> <pad> </s> <unk> first, <mask> last); its size."""
    import io

    import sentencepiece as spm
    from transformers import XLMRobertaTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=140,
                                   model_type="unigram", character_coverage=1.0,
                                   normalization_rule_name="nmt_nfkc", minloglevel=2)
    (folder / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    tok = XLMRobertaTokenizer.from_pretrained(folder)  # (transformers' converter: tokenizer.json)
    tok.save_pretrained(folder)
    return len(tok)


def _wordpiece(folder: Path) -> int:
    """A WordPiece tokenizer trained on CORPUS, saved in `folder` (created); its size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                      cls_token="[CLS]", mask_token="[MASK]").save_pretrained(folder)
    return tok.get_vocab_size()


def build_qwen3_embedding(folder: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """A tiny random Qwen3-Embedding: the Qwen 3 decoder without its output layer (Qwen3Model), the
    qwen3 fixture tokenizer closing each text with <|endoftext|> (its EOS), last-token pooling."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3Model

    folder.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    tok = json.loads((folder / "tokenizer.json").read_text())
    eot = next(t for t in tok["added_tokens"] if t["content"] == "<|endoftext|>")
    tok["post_processor"] = {"type": "Sequence", "processors": [tok["post_processor"], {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eot["id"]],
                                              "tokens": ["<|endoftext|>"]}}}]}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|endoftext|>"}))
    hf = Qwen3Config(vocab_size=len(tok["model"]["vocab"]) + len(tok["added_tokens"]), hidden_size=64,
                     intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True)
    hf.architectures = ["Qwen3Model"]
    torch.manual_seed(seed)
    model = Qwen3Model(hf)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    _sentence_transformers(folder, "lasttoken", 64)
    return folder


def _sentence_transformers(folder: Path, pooling: str, n_embd: int) -> None:
    """modules.json and its modules: the model's tokens pooled (`pooling`), then normalized."""
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
               for i, (path, kind) in enumerate((("", "Transformer"), ("1_Pooling", "Pooling"),
                                                 ("2_Normalize", "Normalize")))]
    (folder / "modules.json").write_text(json.dumps(modules))
    settings = {"max_seq_length": 128, "do_lower_case": False}
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    modes = {f"pooling_mode_{m}": m == {"mean": "mean_tokens", "cls": "cls_token"}.get(pooling, pooling)
             for m in ("mean_tokens", "cls_token", "max_tokens", "lasttoken")}
    pooled = {"word_embedding_dimension": n_embd, **modes}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooled))
    (folder / "2_Normalize").mkdir(exist_ok=True)
