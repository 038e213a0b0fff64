"""Time to first token of a short chat message: after a 3,000-token history vs an empty chat.

    python benchmarks/chat_ttft.py MODEL.gguf [-r 5] [-t THREADS] [-fa auto|on|off] [-ctk T -ctv T]

The history is prefilled once and its KV state kept; each measured turn restores it,
sends the same short message and is undone. The empty-chat figure is the same
message on a conversation with no history, measured in the same run. Target: ≤ 1.3×.
"""

from __future__ import annotations

import argparse
import os
import statistics

from infer.runtime.conversation import Conversation
from infer.runtime.params import ContextParams
from infer.runtime.sampling import SamplingParams
from infer.runtime.session import Completion, Session

MESSAGE = "Thanks. In one sentence, what did we just discuss?"
PARAGRAPH = ("The river rises in the hills north of the town and runs south through farmland, "
             "where it is crossed by three stone bridges built in the eighteenth century. ")


def ttft(conv: Conversation, params: SamplingParams) -> float:
    done = next(e for e in conv.send(MESSAGE, params) if isinstance(e, Completion))
    conv.undo()
    return done.timings.ttft_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-fa", "--flash-attn", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("-ctk", "--cache-type-k", default="f16")
    ap.add_argument("-ctv", "--cache-type-v", default="f16")
    args = ap.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=1)
    cparams = ContextParams(n_ctx=4096, n_threads=args.threads, flash_attn=args.flash_attn,
                            cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v)
    with Session.open(args.model, cparams) as session:
        history = Conversation(session)
        while not history.messages or len(history.tokens()) < 3000:
            history.messages += [{"role": "user", "content": PARAGRAPH * 8},
                                 {"role": "assistant", "content": PARAGRAPH * 4}]
        n_history = len(history.tokens())
        session.prefill(history.tokens())
        saved = session.save_state()
        empty = Conversation(session)
        with_history, without = [], []
        for _ in range(args.repetitions):
            without.append(ttft(empty, params))
            session.restore_state(*saved)  # bring the history back into the cache
            with_history.append(ttft(history, params))
        a, b = statistics.median(with_history), statistics.median(without)
    print(f"model: {args.model}   threads: {args.threads}   history: {n_history} tokens   "
          f"flash attention: {args.flash_attn}   KV: {args.cache_type_k}/{args.cache_type_v}")
    print(f"time to first token, empty chat      {b:8.1f} ms")
    print(f"time to first token, 3,000-token chat {a:7.1f} ms")
    print(f"ratio                                 {a / b:7.2f}  (target <= 1.3)")


if __name__ == "__main__":
    main()
