"""A tiny random-weight sentence-transformers BERT (issue 37): a WordPiece tokenizer trained here
with the `tokenizers` library (lowercasing BertNormalizer, [CLS] text [SEP]), a transformers
BertModel of random weights, and the sentence-transformers modules that pool its tokens (mean,
cls or last) and normalize. Saved as safetensors, as the Hub has them."""

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
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

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
    # weights larger than BERT's initial 0.02: each text's vector then differs clearly from another's
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=n_embd, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=2 * n_embd, max_position_embeddings=128,
                        initializer_range=0.2)
    torch.manual_seed(seed)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder, safe_serialization=True)
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
    return folder
