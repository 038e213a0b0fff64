"""Chat replies on a terminal: Markdown rendered while it streams, as the screen finally shows it."""

from __future__ import annotations

import io

import pyte
from rich.console import Console

from infer.cli.render import MarkdownReply, PlainReply


def rendered(source: str, *, step: int = 3, height: int = 24) -> str:
    """The screen after `source` streamed in pieces of `step` characters to a terminal of `height` rows."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, force_interactive=True, width=80, height=height,
                      color_system="standard")
    reply = MarkdownReply(console)
    for i in range(0, len(source), step):
        reply.write(source[i:i + step])
    reply.close()
    screen = pyte.Screen(80, 500)  # taller than the output: nothing scrolls away
    pyte.Stream(screen).feed(out.getvalue().replace("\n", "\r\n"))
    return "\n".join(line.rstrip() for line in screen.display).strip("\n")


def test_markdown_is_rendered_not_shown_as_source():
    screen = rendered("# Title\n\nSome **bold** text and `code`.\n\n- one\n- two\n\n"
                      "```python\nprint('hi')\n```\nAfter the code.")
    lines = [line.strip() for line in screen.splitlines() if line.strip()]
    assert lines == ["Title", "Some bold text and code.", "• one", "• two", "print('hi')",
                     "After the code."]


def test_blocks_are_separated_by_one_blank_line():
    screen = rendered("First paragraph.\n\nSecond paragraph.\n\n- a list\n\nThird.")
    assert screen.splitlines() == ["First paragraph.", "", "Second paragraph.", "", " • a list", "",
                                   "Third."]


def test_a_code_block_taller_than_the_screen_shows_every_line_once_in_order():
    code = "".join(f"line {i:02d}\n" for i in range(60))
    screen = rendered("Here:\n\n```\n" + code + "```\n\nDone.", step=1, height=20)
    shown = [line.strip() for line in screen.splitlines() if line.strip().startswith("line ")]
    assert shown == [f"line {i:02d}" for i in range(60)]
    assert "```" not in screen and screen.splitlines()[-1] == "Done."


def test_a_reply_cut_short_keeps_what_was_written():
    out = io.StringIO()
    reply = MarkdownReply(Console(file=out, force_terminal=True, force_interactive=True, width=80))
    reply.write("An unfinished **sent")
    reply.close()  # as after Ctrl-C
    screen = pyte.Screen(80, 10)
    pyte.Stream(screen).feed(out.getvalue().replace("\n", "\r\n"))
    assert "An unfinished **sent" in "\n".join(screen.display)


def test_plain_reply_is_the_text_as_written_ending_on_a_new_line():
    out = io.StringIO()
    reply = PlainReply(out)
    for piece in ["Some **bold**", " text"]:
        reply.write(piece)
    reply.close()
    assert out.getvalue() == "Some **bold** text\n"
    out2 = io.StringIO()
    reply = PlainReply(out2)
    reply.write("ends here\n")
    reply.close()
    assert out2.getvalue() == "ends here\n"
