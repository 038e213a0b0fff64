"""Fill-in-the-middle prompts: the code before and after the cursor (and other files of the
project) in the order the model was trained on, with its FIM tokens from the GGUF.

The layout is llama-server's (`format_prompt_infill`), so that the same request gives the same
tokens: where the vocabulary has FIM_REP and FIM_SEP, `[FIM_REP]myproject\\n`, then
`[FIM_SEP]NAME\\nTEXT` for each extra file and `[FIM_SEP]filename\\n` (without FIM_SEP each
file follows a "--- snippet ---" line); then BOS where the model adds one,
`[FIM_PRE]prefix prompt[FIM_SUF]suffix[FIM_MID]`, where `prompt` is the text typed after the
prefix so far. The prefix keeps its last 3/4 of a batch of tokens, the suffix its first
quarter, as llama-server's. The files keep their last tokens that fit beside the rest and the
tokens to generate (llama-server keeps those that fit in the context less a batch and twice
its server-wide token limit: with its defaults, where the batch is the context, that is two
tokens, "filename\n", cut from its separator). A model without FIM_PRE, FIM_SUF and FIM_MID
cannot fill in: InferError says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infer.runtime.errors import InferError

_SNIPPET = "\n\n--- snippet ---\n\n"


def infill_tokens(model: Any, prefix: str, suffix: str, *, extra: Sequence[tuple[str, str]] = (),
                  prompt: str = "", n_batch: int = 2048, n_ctx: int = 4096, n_predict: int = 0) -> list[int]:
    """The prompt's tokens for filling in between `prefix` and `suffix`; `extra`: (file name,
    text) of other files for context; `n_batch`, `n_ctx` (the context a request may use) and
    `n_predict` (the tokens to generate) bound the parts."""
    fim = model.fim_tokens()
    if min(fim["pre"], fim["suf"], fim["mid"]) < 0:
        raise InferError("this model has no fill-in-the-middle tokens (FIM_PRE, FIM_SUF and FIM_MID in its "
                         "vocabulary): use a code model trained for infilling")

    def tokens(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False) if text else []

    context: list[int] = [fim["rep"], *tokens("myproject\n")] if fim["rep"] >= 0 else []
    for name, text in extra:
        context += [fim["sep"], *tokens(f"{name}\n")] if fim["sep"] >= 0 else tokens(_SNIPPET)
        context += tokens(text)
    if fim["sep"] >= 0:
        context += [fim["sep"], *tokens("filename\n")]
    typed = tokens(prompt)
    before, after = tokens(prefix), tokens(suffix)
    before = before[len(before) - min(len(before), 3 * (n_batch // 4)):]
    after = after[:min(len(after), max(0, n_batch // 4 - (2 + len(typed))))]
    head = [model.bos] if model.add_bos else []
    core = [*head, fim["pre"], *before, *typed, fim["suf"], *after, fim["mid"]]
    n_context = min(max(0, n_ctx - len(core) - n_predict), len(context))
    return [*context[len(context) - n_context:], *core]
