"""`infer batch MODEL [INPUT]`: many prompts through one model, decoded together.

Results are JSONL, one object per input line, written as they are ready (each
line in one write), so that a stopped run keeps what it finished and `--resume`
goes on from there. Lines that fail get an error object and the batch goes on;
the exit code is then 2.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from infer.cli import options as o
from infer.cli.batch_input import Item, check_template, done_ids, read_items
from infer.cli.batch_requests import line_prompt_flags, local_requests, server_body
from infer.cli.errors import shielded
from infer.cli.flags import (
    context_params,
    load_plan,
    log_to_stderr,
    read_text_file,
    resolve,
    sampling_overrides,
    spec_params,
)
from infer.cli.placement import explain, report
from infer.cli.stdin import decode_stdin
from infer.runtime.errors import InferError, UsageError

if TYPE_CHECKING:
    from infer.cli import remote


@o.model_command(
    ("model", Annotated[str, typer.Argument(
        help="A .gguf file, an alias from models.toml, or a Hub repo owner/repo[:QUANT].",
        show_default=False)], ...),
    ("input", Annotated[str, typer.Argument(
        help="JSONL requests (or plain lines with --lines); '-' is stdin.")], "-"),
    ("output", Annotated[Path | None, typer.Option(
        "-o", "--output", help="Write the JSONL results here instead of stdout.")], None),
    ("parallel", Annotated[int | None, typer.Option(
        "-np", "--parallel", help="Sequences decoded together (default: from the model's size and -c).",
        show_default=False)], None),
    ("plain_lines", Annotated[bool, typer.Option(
        "--lines", help="Each input line is a prompt in plain text.")], False),
    ("template", Annotated[str | None, typer.Option(
        "--template", help='Wrap each plain line, e.g. "Classify: {line}".')], None),
    ("system", Annotated[str | None, typer.Option("-s", "--system", help="System prompt for every line.")],
     None),
    ("ordered", Annotated[bool, typer.Option(
        "--ordered/--unordered", help="Keep input order, or write each result when it is done.")], True),
    ("resume", Annotated[bool, typer.Option(
        "--resume", help="Skip the lines whose results OUTPUT already holds; append the rest.")], False),
    o.SERVER,
    o.CHAT_TEMPLATE_FILE,
    *o.prompt_options(),
    o.MMPROJ,
    o.NO_MMPROJ,
    o.MAX_MEDIA,
)
def batch(ctx: typer.Context, **flags: Any) -> int:
    """Run every prompt of INPUT, several at a time; one JSON result per line."""
    return int(shielded(execute, ctx.params))


def execute(flags: Mapping[str, Any]) -> int:
    from infer.cli import remote

    if flags["verbose"]:
        log_to_stderr()
    if flags["parallel"] is not None and not 1 <= flags["parallel"] <= 256:
        raise UsageError("--parallel must be between 1 and 256")
    if flags["resume"] and flags["output"] is None:
        raise UsageError("--resume needs -o/--output: the results of the earlier run")
    check_template(flags["template"])
    line_prompt_flags(flags)  # (checked before anything loads)
    if flags["template"] is not None and not flags["plain_lines"]:
        raise UsageError("--template wraps plain lines: use it with --lines")
    overrides = sampling_overrides(flags)
    where = remote.address(flags)
    if where is not None:  # the server decodes; --parallel is how many requests are in flight
        remote.refuse_local_flags(flags, o.defaults(batch))
        return _through_server(flags, where, _items(flags), overrides)
    from infer.runtime.sampling import SamplingParams

    SamplingParams.resolve({}, overrides)
    context_params(flags)
    speculation = spec_params(flags)
    if speculation.type == "draft":
        raise UsageError("infer batch speculates with prompt lookup only: -md/--model-draft is for "
                         "infer run and infer chat")
    if flags["explain"]:
        resolved = resolve(flags)
        explain(_plan(flags, resolved).placed, resolved.reference)
        return 0
    items = _items(flags)
    resolved = resolve(flags)
    code = _write_results(flags, items, lambda todo, out: _run(flags, resolved, todo, overrides, speculation,
                                                               out))
    resolved.record_use()
    return code


def _plan(flags: Mapping[str, Any], resolved: Any) -> Any:
    """The planned load: --parallel sequences (or the default for the model's size) and one
    more KV stream, for the prefix the prompts share."""
    from infer.runtime.loading import Slots

    return load_plan(flags, resolved, slots=Slots(flags["parallel"], extra=1))


def _items(flags: Mapping[str, Any]) -> list[Item]:
    return list(read_items(_input_lines(flags["input"]), plain=flags["plain_lines"],
                           template=flags["template"], system=flags["system"]))


def _write_results(flags: Mapping[str, Any], items: list[Item], run: Any) -> int:
    """`run(todo, out)` over the items not done yet (--resume), into OUTPUT or stdout; the exit code."""
    output = Path(flags["output"]) if flags["output"] is not None else None
    skip = _finished(output) if output is not None and flags["resume"] else set()
    todo = [item for item in items if json.dumps(item.id) not in skip]
    out = _open_output(output, append=flags["resume"])
    try:
        failed = run(todo, out)
    finally:
        if out is not sys.stdout:
            out.close()
    return 2 if failed else 0


def _through_server(flags: Mapping[str, Any], where: remote.Address, items: list[Item],
                    overrides: dict[str, Any]) -> int:
    """Each line as a request to the server at `where`, --parallel (default 16) in flight: the
    server's continuous batch decodes them together. The same result lines as without."""
    import threading

    from infer.cli import remote
    from infer.cli.result_json import result_json
    from infer.cli.run_tools import expect_calls

    prompt_flags = line_prompt_flags(flags)

    def run(todo: list[Item], out: IO[str]) -> int:
        writer = _Writer(out, todo, ordered=flags["ordered"], model=flags["model"], to_json=result_json)
        lock = threading.Lock()
        waiting = list(reversed(todo))
        fatal: list[InferError] = []

        def work() -> None:
            while not fatal:
                with lock:
                    if not waiting:
                        return
                    item = waiting.pop()
                try:
                    if item.error is not None:
                        raise UsageError(item.error)
                    body = server_body(flags, item, overrides, prompt_flags)
                    completion = remote.generate(where, "/v1/chat/completions", body)
                    expect_calls(completion, item.tools)
                except UsageError as e:  # this line's mistake (the server said 400): the batch goes on
                    with lock:
                        writer.error(item.index, str(e))
                        progress.advance(0)
                except InferError as e:  # unreachable, busy, no such model: the batch stops
                    fatal.append(e)
                else:
                    with lock:
                        writer.result(item.index, completion)
                        progress.advance(completion.usage.completion_tokens)

        with _Progress(len(todo)) as progress:
            workers = [threading.Thread(target=work, daemon=True) for _ in range(flags["parallel"] or 16)]
            for w in workers:
                w.start()
            for w in workers:
                while w.is_alive():
                    w.join(0.1)  # (in slices: Ctrl-C reaches this thread)
        writer.flush_ready()
        if fatal:
            raise fatal[0]
        return writer.failed

    return _write_results(flags, items, run)


def _run(flags: Mapping[str, Any], resolved: Any, items: list[Item], overrides: dict[str, Any],
         speculation: Any, out: IO[str]) -> int:
    from infer.cli.result_json import result_json
    from infer.cli.speculation import describe
    from infer.runtime.kv_pool import fits_shares
    from infer.runtime.llama import Context
    from infer.runtime.results import Usage
    from infer.runtime.scheduler import Scheduler
    opened = _plan(flags, resolved).open_model()
    cparams, parallel, defaults = opened.params, opened.parallel, opened.sampling_defaults
    with opened.model as model:
        if flags["verbose"]:
            report(opened.placed, model)
        template = None
        if flags["chat_template_file"] is not None:
            template = read_text_file(flags["chat_template_file"], "chat template file")
        projector = _projector(flags, resolved, model, cparams)
        requests, errors, finishes = local_requests(model, items, defaults, overrides,
                                                    line_prompt_flags(flags), template, projector,
                                                    max_media=flags["max_media"])
        prefix = _shared_prefix(requests)
        # Split KV streams where every line fits one (faster), else one pool (runtime/kv_pool.py)
        split = fits_shares(cparams.n_ctx or 0, cparams.n_seq_max, len(prefix),
                            (len(r.tokens) - len(prefix) + (r.params.max_tokens or 1) for r in requests))
        with Context(model, replace(cparams, kv_unified=not split)) as ctx:
            scheduler = Scheduler(model, ctx, parallel=parallel, shared_prefix=prefix,
                                  speculation=speculation)
            guessed = Usage()  # speculation's totals, for -v
            writer = _Writer(out, items, ordered=flags["ordered"], model=resolved.reference,
                             to_json=result_json)
            try:
                with _Progress(len(items)) as progress:
                    for key, error in errors:
                        writer.error(key, error)
                        progress.advance(0)
                    for outcome in scheduler.run(requests):
                        if outcome.completion is None:
                            writer.error(outcome.key, outcome.error or "failed")
                            progress.advance(0)
                        else:
                            usage = outcome.completion.usage
                            guessed.draft_tokens += usage.draft_tokens
                            guessed.accepted_tokens += usage.accepted_tokens
                            finishes[outcome.key](outcome.completion, model)
                            writer.result(outcome.key, outcome.completion)
                            progress.advance(outcome.completion.usage.completion_tokens)
            finally:
                scheduler.close()
                writer.flush_ready()
                if projector is not None:
                    projector.close()
    if flags["verbose"]:
        sys.stderr.write(f"infer: {len(items)} lines, {writer.failed} failed; {scheduler.prefilled_tokens} "
                         f"prompt tokens prefilled (a shared prefix of {len(prefix)} once)\n")
        if speculation.enabled:
            sys.stderr.write(f"infer: {describe(guessed)}\n")
    return writer.failed


def _shared_prefix(requests: list[Any]) -> list[int]:
    """The tokens all the requests begin with (its text: a medium is evaluated in each slot)."""
    from infer.runtime.session import common_prefix_len

    if len(requests) < 2:
        return []
    prefix = requests[0].tokens
    for r in requests[1:]:
        prefix = prefix[:common_prefix_len(prefix, r.tokens)]
    return prefix[:next((i for i, t in enumerate(prefix) if t < 0), len(prefix))]


def _projector(flags: Mapping[str, Any], resolved: Any, model: Any, cparams: Any) -> Any:
    """The projector of the model (--mmproj's, or its repository's) where a line has media."""
    from infer.cli.media import projector_path

    path = projector_path(flags, resolved)
    if path is None:
        return None
    from infer.runtime.llama import Projector, flash_attention

    return Projector(path, model, n_threads=cparams.n_threads or 2, use_gpu=model.local_gpu,
                     flash_attn=flash_attention(cparams, model.local_gpu))


class _Writer:
    """Writes results as JSONL: in input order (held until their turn) or as they come."""

    def __init__(self, out: IO[str], items: list[Item], *, ordered: bool, model: str, to_json: Any) -> None:
        self.out, self.ordered, self.model, self.to_json = out, ordered, model, to_json
        self.ids = {item.index: item.id for item in items}
        self.order = [item.index for item in items]
        self.next = 0  # position in `order` of the next line to write when ordered
        self.ready: dict[int, str] = {}
        self.failed = 0

    def result(self, index: int, completion: Any) -> None:
        self._put(index, {"id": self.ids[index], **self.to_json(self.model, completion)})

    def error(self, index: int, message: str) -> None:
        self.failed += 1
        self._put(index, {"id": self.ids[index], "error": message})

    def _put(self, index: int, data: dict[str, Any]) -> None:
        line = json.dumps(data, ensure_ascii=False) + "\n"
        if not self.ordered:
            self._write(line)
            return
        self.ready[index] = line
        self.flush_ready()

    def flush_ready(self) -> None:
        while self.next < len(self.order) and self.order[self.next] in self.ready:
            self._write(self.ready.pop(self.order[self.next]))
            self.next += 1

    def _write(self, line: str) -> None:
        self.out.write(line)
        self.out.flush()


class _Progress:
    """done/total, generated tokens per second and time left on stderr, when it is a terminal."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Any = None
        self.tokens = 0

    def __enter__(self) -> _Progress:
        if sys.stderr.isatty() and self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[speed]}"), TimeRemainingColumn(), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("batch", total=self.total, speed="")
            import time

            self.started = time.perf_counter()
        return self

    def advance(self, tokens: int) -> None:
        if self.bar is None:
            return
        import time

        self.tokens += tokens
        speed = self.tokens / max(time.perf_counter() - self.started, 1e-9)
        self.bar.update(self.task, advance=1, speed=f"{speed:.1f} tokens/s")

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _input_lines(name: str) -> Iterator[str]:
    if name == "-":
        if sys.stdin.isatty():
            raise UsageError("give an INPUT file, or pipe the requests into stdin")
        return iter(decode_stdin(sys.stdin.buffer.read()).splitlines())
    try:
        return iter(Path(name).read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        raise UsageError(f"input {name}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"input {name}: cannot be read ({e})") from None


def _finished(output: Path) -> set[str]:
    """Ids already done in OUTPUT; a last line cut short by an earlier stop is removed."""
    try:
        data = output.read_bytes()
    except FileNotFoundError:
        return set()
    if data and not data.endswith(b"\n"):
        with output.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
        data = data[: data.rfind(b"\n") + 1]
    return done_ids(data.decode("utf-8", errors="replace").splitlines())


def _open_output(output: Path | None, *, append: bool) -> IO[str]:
    if output is None:
        return sys.stdout
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
        return os.fdopen(fd, "w", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"output {output}: cannot be written ({e})") from None
