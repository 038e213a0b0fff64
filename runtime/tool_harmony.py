"""gpt-oss' harmony headers (issue 33): a message's header takes the recipient, the channel and
the content type in either order. Its chat template writes an earlier call as
``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{…}<|call|>``,
the model (as OpenAI's harmony guide shows it) as ``<|start|>assistant<|channel|>commentary
to=functions.NAME <|constrain|>json<|message|>{…}<|call|>``. Where the learned call header
has that shape, the second order is the syntax's `alternate`: read as well as the first, and
allowed by the calls' grammar."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

_HEADER = re.compile(r"(<\|channel\|>)(\w+) (\w+)(<\|message\|>)")


def harmony_order(syntax: Any) -> Any:
    """`syntax` (runtime.tool_syntax.ToolSyntax) with the harmony header's other order as its
    alternate, where it has one."""
    header = _HEADER.fullmatch(syntax.name_close)
    recipient = syntax.section_open.strip()
    if header is None or not recipient.startswith("to=") or syntax.call_open:
        return syntax
    channel, content_type, message = header[1] + header[2], header[3], header[4]
    other = dataclasses.replace(syntax, section_open=f"{channel} {recipient}",
                                name_close=f" <|constrain|>{content_type}{message}")
    return dataclasses.replace(syntax, alternate=other)

