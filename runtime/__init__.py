"""infer's inference runtime on llama.cpp's C API: model, context, sampling, sessions."""

import logging

# Library code never prints: llama.cpp's log goes to the "infer.llama" logger, and
# without this handler Python's last-resort handler would write warnings to stderr.
logging.getLogger("infer").addHandler(logging.NullHandler())
