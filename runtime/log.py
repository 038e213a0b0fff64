"""The library's loggers: `logger("infer.NAME")`.

Library code never prints; what it has to say goes to loggers under "infer" (llama.cpp's
own log to "infer.llama"), and `-v` gives them a handler on stderr (cli/flags.py).
Without the NullHandler installed here, Python's last-resort handler would write their
warnings to stderr anyway.

Only the modules that log import this: `logging` costs about 7 ms of start-up, which
`infer run` through a server does without.
"""

from __future__ import annotations

import logging

logging.getLogger("infer").addHandler(logging.NullHandler())


def logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
