"""Images in the prompt (issue 36): `infer run --image` on a tiny random-weight text model and a
tiny LLaVA-style projector (tests/tiny_vision.py), against llama.cpp's own llama-mtmd-cli on the
same files, image and settings (greedy, flash attention off on both sides). llama-mtmd-cli is
built from the installed llama-cpp-python's source distribution by
`benchmarks/build_llama_tools.sh llama-server llama-mtmd-cli`, which the README's test command
runs first. And every bad input: one line, exit 2, nothing else.
"""

from __future__ import annotations

import itertools
import subprocess
import wave
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import QWEN_TEMPLATE, assert_one_line_error, llama_tool, run_cli
from tiny_model import build_llama_gguf
from tiny_vision import build_mmproj_gguf, png_bytes, write_png

GREEDY = ("-n", "16", "--temperature", "0", "--flash-attn", "off")


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory, fixtures: Path) -> SimpleNamespace:
    """A text model whose output each position of the prompt moves (weights 0.1: an image
    changes the reply), its projector, a projector for another model, and two images."""
    d = tmp_path_factory.mktemp("vision")
    model = build_llama_gguf(d / "tiny-vision.gguf", vocab="llama-bpe", weight_scale=0.1,
                             chat_template=QWEN_TEMPLATE)
    with wave.open(str(d / "beep.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x10" * 1600)
    return SimpleNamespace(model=model, mmproj=build_mmproj_gguf(d / "mmproj.gguf"),
                           other=build_mmproj_gguf(d / "mmproj-32.gguf", n_embd_text=32),
                           a=write_png(d / "a.png", seed=1), b=write_png(d / "b.png", seed=2),
                           wav=d / "beep.wav", dir=d)


@pytest.fixture(scope="module")
def mtmd_cli() -> Path:
    return llama_tool("llama-mtmd-cli")


def _theirs(mtmd_cli: Path, vision: SimpleNamespace, images: list[Path], prompt: str) -> str:
    args = [str(mtmd_cli), "-m", str(vision.model), "--mmproj", str(vision.mmproj), "-p", prompt,
            "-n", "16", "--temp", "0", "-fa", "off", "-t", "2"]
    for image in images:
        args += ["--image", str(image)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip("\n")


def test_greedy_text_with_images_equals_llama_mtmd_clis(vision: SimpleNamespace, mtmd_cli: Path) -> None:
    """One image before the prompt (read from a file, and from stdin), then two at the markers
    the prompt places them at: the same tokens as llama-mtmd-cli's. The two images give
    different replies (the image is read, not just its place)."""
    base = ["run", vision.model, "--mmproj", vision.mmproj, *GREEDY]
    ours_a = run_cli(*base, "--image", "-", "Describe it.", input=vision.a.read_bytes())
    ours_b = run_cli(*base, "--image", vision.b, "Describe it.")
    both = "Compare <__media__> with <__media__>."
    ours_ab = run_cli(*base, "--image", vision.a, "--image", vision.b, both)
    for ours in (ours_a, ours_b, ours_ab):
        assert ours.returncode == 0 and ours.stderr == "", ours.stderr
    assert ours_a.stdout.strip("\n") == _theirs(mtmd_cli, vision, [vision.a], "Describe it.")
    assert ours_b.stdout.strip("\n") == _theirs(mtmd_cli, vision, [vision.b], "Describe it.")
    assert ours_ab.stdout.strip("\n") == _theirs(mtmd_cli, vision, [vision.a, vision.b], both)
    assert ours_a.stdout != ours_b.stdout


def _bad(vision: SimpleNamespace, case: str) -> tuple[list, bytes | None]:
    d = vision.dir
    (d / "empty.png").write_bytes(b"")
    (d / "notes.txt").write_text("not a picture\n")
    (d / "cut.png").write_bytes(png_bytes(48, 40, seed=3)[:60])
    base = ["run", vision.model, "--mmproj", vision.mmproj, "-n", "2"]
    return {
        "empty": ([*base, "--image", d / "empty.png", "Hi"], None),
        "not an image": ([*base, "--image", d / "notes.txt", "Hi"], None),
        "truncated": ([*base, "--image", d / "cut.png", "Hi"], None),
        "missing": ([*base, "--image", d / "nope.png", "Hi"], None),
        "a folder": ([*base, "--image", d, "Hi"], None),
        "no projector": (["run", vision.model, "--image", vision.a, "Hi"], None),
        "audio to a vision projector": ([*base, "--audio", vision.wav, "Hi"], None),
        "another model's projector": (["run", vision.model, "--mmproj", vision.other, "--image", vision.a,
                                       "Hi"], None),
        "markers for more media": ([*base, "--image", vision.a, "<__media__> and <__media__>"], None),
        "an image where audio is asked": ([*base, "--audio", vision.a, "Hi"], None),
        "two media from stdin": ([*base, "--image", "-", "--image", "-", "Hi"], vision.a.read_bytes()),
        "more than --max-media": ([*base, "--max-media", "1", "--image", vision.a, "--image", vision.b, "Hi"],
                                  None),
    }[case]


@pytest.mark.parametrize(("case", "words"), [
    ("empty", "empty.png: the file is empty"),
    ("not an image", "notes.txt: not a PNG, JPEG, WebP, GIF or BMP image"),
    ("truncated", "cut.png: not an image or audio file this model reads"),
    ("missing", "nope.png: no such file"),
    ("a folder", "is a folder"),
    ("no projector", "a.png: reading image needs the model's projector: give --mmproj"),
    ("audio to a vision projector", "beep.wav: this model's projector takes no audio"),
    ("another model's projector", "mmproj-32.gguf: libmtmd could not load the projector"),
    ("markers for more media", "2 media markers"),
    ("an image where audio is asked", "a.png: a PNG file is image, not audio"),
    ("two media from stdin", "only one --image or --audio can read standard input"),
    ("more than --max-media", "2 images and audio files, over --max-media 1"),
])
def test_bad_media_are_one_line_and_exit_2(vision: SimpleNamespace, case: str, words: str) -> None:
    args, stdin = _bad(vision, case)
    assert_one_line_error(run_cli(*args, input=stdin), 2, words)


def _stats(line: str) -> tuple[int, int, int]:
    """/stats' prompt tokens, cached and prefilled of the last turn."""
    import re

    m = re.search(r"(\d+) prompt tokens \((\d+) cached, (\d+) prefilled\)", line)
    assert m, line
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def test_a_chat_reads_an_image_once_and_later_turns_find_it_in_the_cache(vision: SimpleNamespace) -> None:
    """A message that is only an image's path attaches it: the reply is infer run's to that
    image alone. /image attaches to the next message. Each later turn finds the images before
    it in the KV cache (cached, not encoded again); /save and /load keep the media."""
    script = (f"{vision.b}\n/stats\n/image {vision.a}\nDescribe it.\n/stats\nAnd the colours?\n/stats\n"
              "/save pics\n")
    chat = run_cli("chat", vision.model, "--mmproj", vision.mmproj, "--plain", *GREEDY, input=script)
    assert chat.returncode == 0 and "error" not in chat.stderr, chat.stderr
    assert "a.png goes with the next message" in chat.stderr
    alone = run_cli("run", vision.model, "--mmproj", vision.mmproj, *GREEDY, "--image", vision.b,
                    "<__media__>")
    assert alone.returncode == 0 and chat.stdout.startswith(alone.stdout.strip("\n")), (alone, chat.stdout)
    turns = [_stats(line) for line in chat.stdout.splitlines() if "prompt tokens (" in line]
    assert turns[0][1] == 0 and turns[0][2] == turns[0][0]  # turn 1: all prefilled, the image too
    for before, after in itertools.pairwise(turns):
        # the turn before (its prompt, its image in it) from the cache; the reply as far as the
        # random model's text tokenizes back to the same tokens
        assert after[1] >= before[0] and after[2] < after[0] - before[0], turns
    resumed = run_cli("chat", vision.model, "--mmproj", vision.mmproj, "--plain", *GREEDY,
                      "--session", "pics", input="One word?\n/stats\n")
    assert resumed.returncode == 0 and "error" not in resumed.stderr, resumed.stderr
    assert "loaded session 'pics'" in resumed.stderr and "again" not in resumed.stderr
    assert _stats(resumed.stdout.splitlines()[-1])[1] >= turns[-1][0]  # both images from the saved state


def test_a_hub_model_brings_its_repositorys_projector(vision: SimpleNamespace,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """owner/repo: the projector comes with the model (the best precision of those there, as
    llama.cpp's -hf takes one), `infer show` says what the model reads, --no-mmproj leaves it."""
    from hub_server import HubServer

    repo = "acme/tiny-vision-GGUF"
    with HubServer() as hub:
        hub.add_repo(repo, {"tiny-vision-Q8_0.gguf": vision.model.read_bytes(),
                            "mmproj-tiny-vision-f16.gguf": vision.mmproj.read_bytes(),
                            "mmproj-tiny-vision-q8_0.gguf": vision.other.read_bytes()}, lfs_min_size=1024)
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        ran = run_cli("run", repo, *GREEDY, "--image", vision.a, "Describe it.")
        assert ran.returncode == 0, ran.stderr
        assert hub.downloads[(repo, "mmproj-tiny-vision-f16.gguf")] == 1
        assert (repo, "mmproj-tiny-vision-q8_0.gguf") not in hub.downloads
        here = run_cli("run", vision.model, "--mmproj", vision.mmproj, *GREEDY, "--image", vision.a,
                       "Describe it.")
        assert ran.stdout == here.stdout
        shown = run_cli("show", repo)
        assert "reads" in shown.stdout and "text, images" in shown.stdout, shown.stdout
        assert_one_line_error(run_cli("run", repo, "--no-mmproj", "--image", vision.a, "Hi"), 2,
                              "needs the model's projector")
        # a model cached without its projector (--no-mmproj, or an older infer) gets it by a pull
        other = "acme/tiny-vision-2-GGUF"
        hub.add_repo(other, {"tiny-vision-Q8_0.gguf": vision.model.read_bytes(),
                             "mmproj-tiny-vision-f16.gguf": vision.mmproj.read_bytes()}, lfs_min_size=1024)
        assert run_cli("pull", other, "--no-mmproj").stdout.count("\n") == 1
        assert (other, "mmproj-tiny-vision-f16.gguf") not in hub.downloads
        pulled = run_cli("pull", other)
        assert pulled.returncode == 0, pulled.stderr
        assert pulled.stdout.strip().endswith("mmproj-tiny-vision-f16.gguf"), pulled.stdout
        assert hub.downloads[(other, "tiny-vision-Q8_0.gguf")] == 1


def test_the_tiles_of_one_image_are_runs_of_their_own() -> None:
    """A projector that cuts an image into tiles (SmolVLM's) gives one chunk per tile, all with
    the image's id: each tile is a run of its own pseudo-token, evaluated on its own, and the
    same image in the next prompt gives the same runs (the KV cache's prefix holds it)."""
    from infer.runtime.llama import Chunk
    from infer.runtime.media import Medium, media_prompt, run_start, spans

    class Tiler:
        vision, audio = True, False

        def chunks(self, text, media, *, add_special):
            tile = [Chunk("image", 3, digest="d" * 64, handle=i) for i in range(2)]
            return [Chunk("text", 2, (5, 6)), *tile, Chunk("text", 1, (7,))], lambda: None

    image = Medium("a.png", "image", b"\x89PNG")
    first = media_prompt(Tiler(), "<__media__>", [image], add_special=True)
    assert first.tokens[:2] == [5, 6] and first.tokens[-1] == 7 and len(first.tokens) == 9
    assert len(set(first.tokens[2:5])) == 1 and len(set(first.tokens[5:8])) == 1
    assert first.tokens[2] != first.tokens[5] and all(t < 0 for t in first.tokens[2:8])
    pieces = [(a, b, m.handle if m is not None else None) for a, b, m in spans(first.tokens, 0, 9, 512,
                                                                                first.media)]
    assert pieces == [(0, 2, None), (2, 5, 0), (5, 8, 1), (8, 9, None)]
    assert run_start(first.tokens, 6) == 5 and run_start(first.tokens, 3) == 2
    again = media_prompt(Tiler(), "<__media__>", [image], add_special=True)
    assert again.tokens == first.tokens


def test_explain_counts_the_projector(vision: SimpleNamespace) -> None:
    shown = run_cli("run", vision.model, "--mmproj", vision.mmproj, "--explain")
    assert shown.returncode == 0, shown.stderr
    assert "projector (images, audio): 0 MiB kept on CPU" in shown.stdout, shown.stdout
    assert "projector" not in run_cli("run", vision.model, "--explain").stdout


def test_the_server_reads_images_in_chat_requests(vision: SimpleNamespace, tmp_path: Path) -> None:
    """OpenAI's image_url parts (data: URLs) through the official client: the reply is infer
    run's for the same image and text, and the same request again finds the image in the
    cache; Anthropic's image blocks and Ollama's images give the same reply; bad parts are
    400s naming the part."""
    import base64

    import openai
    from serve_helpers import Server

    url = "data:image/png;base64," + base64.b64encode(vision.a.read_bytes()).decode()
    ask = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": "Describe it."}]}]
    s = Server(str(vision.model), "--mmproj", str(vision.mmproj), "-np", "2", "-c", "2048",
               "--spec-type", "none", "--flash-attn", "off", "--max-media", "1", "--allow-remote-media",
               home=tmp_path / "home")
    files_server = _file_server(vision.dir)
    files = f"http://127.0.0.1:{files_server.server_address[1]}"
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        asked = {"model": str(vision.model), "messages": ask, "temperature": 0, "max_tokens": 16}
        reply = client.chat.completions.create(**asked)
        ran = run_cli("run", vision.model, "--mmproj", vision.mmproj, *GREEDY, "--image", vision.a,
                      "Describe it.")
        assert reply.choices[0].message.content == ran.stdout.strip("\n")
        again = client.chat.completions.create(**asked)
        assert again.choices[0].message.content == reply.choices[0].message.content
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert cached >= reply.usage.prompt_tokens - 1, again.usage  # the image's positions too
        # Anthropic's image blocks and Ollama's images: the same prompt, the same reply
        import anthropic
        import ollama

        b64 = base64.b64encode(vision.a.read_bytes()).decode()
        blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
                  {"type": "text", "text": "Describe it."}]
        message = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0).messages.create(
            model=str(vision.model), max_tokens=16, messages=[{"role": "user", "content": blocks}],
            extra_body={"temperature": 0})
        assert message.content[0].text == reply.choices[0].message.content
        chat = ollama.Client(host=s.url).chat(
            model=str(vision.model), options={"temperature": 0, "num_predict": 16},
            messages=[{"role": "user", "content": "Describe it.", "images": [b64]}])
        assert chat.message.content == reply.choices[0].message.content
        expected = reply.choices[0].message.content
        _the_same_through_urls_responses_and_the_cli(s.url, files, client, vision, expected)
        two = [{"role": "user", "content": [ask[0]["content"][0], *ask[0]["content"]]}]
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=str(vision.model), messages=two, max_tokens=4)
        assert "over the limit of 1" in caught.value.body["message"], caught.value.body
        nopng = "data:image/png;base64," + base64.b64encode(b"not a png").decode()
        for part in (url[:-8] + "!!!!", files + "/missing.png", nopng):
            bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": part}}]}]
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model=str(vision.model), messages=bad, max_tokens=4)
            assert caught.value.body["param"] == "messages[0].content[0].image_url.url", caught.value.body
    finally:
        files_server.shutdown()
        assert s.stop() == 0, "".join(s.log)


def _file_server(folder: Path) -> Any:
    """A plain HTTP server of `folder`'s files on 127.0.0.1 (remote images), serving."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def _the_same_through_urls_responses_and_the_cli(server: str, files: str, client: Any,
                                                 vision: SimpleNamespace, expected: str) -> None:
    """The image by http URL (--allow-remote-media: OpenAI's and Anthropic's), in a Responses
    input_image part, and from `infer run --image` and `infer chat` through INFER_SERVER: each the
    reply the same image gave as a data: URL."""
    import anthropic

    model, url = str(vision.model), files + "/a.png"
    ask = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": "Describe it."}]}]
    fetched = client.chat.completions.create(model=model, messages=ask, temperature=0, max_tokens=16)
    assert fetched.choices[0].message.content == expected
    blocks = [{"type": "image", "source": {"type": "url", "url": url}},
              {"type": "text", "text": "Describe it."}]
    message = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0).messages.create(
        model=model, max_tokens=16, messages=[{"role": "user", "content": blocks}],
        extra_body={"temperature": 0})
    assert message.content[0].text == expected
    import base64

    data = "data:image/png;base64," + base64.b64encode(vision.a.read_bytes()).decode()
    response = client.responses.create(model=model, temperature=0, max_output_tokens=16, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data},
                                     {"type": "input_text", "text": "Describe it."}]}])
    assert response.output_text == expected
    through = {"INFER_SERVER": server}
    greedy = ("-n", "16", "--temperature", "0")
    ran = run_cli("run", model, *greedy, "--image", vision.a, "Describe it.", env=through)
    assert ran.returncode == 0 and ran.stdout.strip("\n") == expected, ran
    chat = run_cli("chat", model, "--plain", *greedy, input=f"{vision.a}\n", env=through)
    assert chat.returncode == 0 and "error" not in chat.stderr, chat.stderr
    alone = client.chat.completions.create(model=model, temperature=0, max_tokens=16, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data}}]}])
    assert chat.stdout.startswith(alone.choices[0].message.content), (chat.stdout, alone)


def test_batch_lines_carry_images_as_paths_or_base64(vision: SimpleNamespace, tmp_path: Path) -> None:
    """`infer batch` lines with "images" (a path, or base64) and OpenAI image parts: each line's
    text is infer run's for its image (one line at a time: the same prefill splits); a line
    whose image is bad fails alone."""
    import base64
    import json

    b64 = base64.b64encode(vision.b.read_bytes()).decode()
    url = "data:image/png;base64," + base64.b64encode(vision.a.read_bytes()).decode()
    lines = [{"id": "path", "prompt": "Describe it.", "images": [str(vision.a)]},
             {"id": "base64", "prompt": "Describe it.", "images": [b64]},
             {"id": "part", "messages": [{"role": "user", "content": [
                 {"type": "image_url", "image_url": {"url": url}},
                 {"type": "text", "text": "Describe it."}]}]},
             {"id": "bad", "prompt": "Describe it.", "images": [str(tmp_path / "nope.png")]}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = run_cli("batch", vision.model, src, "--mmproj", vision.mmproj, "--parallel", "1", "-n", "16",
                   "--temperature", "0", "--flash-attn", "off", "--spec-type", "none")
    results = {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert done.returncode == 2 and "nope.png: no such file" in results["bad"]["error"], done.stdout
    for name, image in (("path", vision.a), ("base64", vision.b), ("part", vision.a)):
        ran = run_cli("run", vision.model, "--mmproj", vision.mmproj, *GREEDY, "--image", image,
                      "Describe it.")
        assert results[name]["text"] == ran.stdout.strip("\n"), (name, results[name])


def test_greedy_text_with_audio_equals_llama_mtmd_clis(vision: SimpleNamespace, mtmd_cli: Path) -> None:
    """A tiny random Ultravox-style audio projector (tests/tiny_audio.py): `--audio` reads a WAV
    as llama-mtmd-cli does (the same tokens), here and through a server (an OpenAI input_audio
    part); an image given to it is refused, exit 2."""
    from tiny_audio import build_audio_mmproj_gguf, write_wav

    projector = build_audio_mmproj_gguf(vision.dir / "mmproj-audio.gguf")
    wav = write_wav(vision.dir / "tone.wav")
    ours = run_cli("run", vision.model, "--mmproj", projector, *GREEDY, "--audio", wav, "Transcribe it.")
    assert ours.returncode == 0 and ours.stderr == "", ours.stderr
    done = subprocess.run([str(mtmd_cli), "-m", str(vision.model), "--mmproj", str(projector),
                           "--audio", str(wav), "-p", "Transcribe it.", "-n", "16", "--temp", "0",
                           "-fa", "off", "-t", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ours.stdout.strip("\n") == done.stdout.strip("\n") and ours.stdout.strip()
    from serve_helpers import Server  # the same through a server: an input_audio part

    s = Server(str(vision.model), "--mmproj", str(projector), "-np", "1", "-c", "1024", "--spec-type", "none",
               "--flash-attn", "off", home=vision.dir / "home-audio")
    try:
        served = run_cli("run", vision.model, "-n", "16", "--temperature", "0", "--audio", wav,
                         "Transcribe it.", env={"INFER_SERVER": s.url})
        assert served.returncode == 0 and served.stdout == ours.stdout, served
    finally:
        assert s.stop() == 0, "".join(s.log)
    assert_one_line_error(run_cli("run", vision.model, "--mmproj", projector, "--image", vision.a, "Hi"), 2,
                          "a.png: this model's projector takes no image")
