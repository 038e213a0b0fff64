"""Streaming detokenization: whole characters only, stop strings never half-printed."""

from __future__ import annotations

from infer.runtime.textstream import TextStream


def feed_all(stream: TextStream, chunks: list[bytes]) -> list[str]:
    out = [stream.feed(c) for c in chunks]
    out.append(stream.finish())
    return out


def test_multibyte_character_split_across_tokens_is_never_split():
    euro = "€".encode()  # 3 bytes
    out = feed_all(TextStream(), [b"a", euro[:1], euro[1:2], euro[2:], b"b"])
    assert out == ["a", "", "", "€", "b", ""]


def test_stop_string_across_pieces_is_not_printed():
    s = TextStream(stop=["STOP"])
    out = feed_all(s, [b"hello S", b"TO", b"P and more"])
    assert "".join(out) == "hello "
    assert s.stopped_by == "STOP"
    assert out[0] == "hello "  # "S" is held back: it may begin the stop string


def test_held_back_text_is_released_when_it_is_not_a_stop():
    s = TextStream(stop=["STOP"])
    out = feed_all(s, [b"ST", b"ART"])
    assert out == ["", "START", ""]
    assert s.stopped_by is None


def test_partial_stop_at_the_end_is_released():
    s = TextStream(stop=["</answer>"])
    assert "".join(feed_all(s, [b"yes </ans"])) == "yes </ans"


def test_earliest_of_several_stops_wins():
    s = TextStream(stop=["world", "lo w"])
    assert "".join(feed_all(s, [b"hello world"])) == "hel"
    assert s.stopped_by == "lo w"


def test_incomplete_utf8_at_the_end_becomes_replacement_character():
    assert "".join(feed_all(TextStream(), [b"ok", "é".encode()[:1]])) == "ok\ufffd"
