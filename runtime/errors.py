"""The errors infer raises: one hierarchy for the runtime and the model layer.

Each error also inherits the built-in exception it resembles, so callers that
know nothing of infer can still catch it. The CLI maps each class to an exit
code and a one-line message (``infer.cli.errors``); library code never exits.
"""

from __future__ import annotations


class InferError(Exception):
    """Base class of every error infer raises on purpose."""


class UsageError(InferError, ValueError):
    """A bad parameter value or input from the user (exit code 2)."""


class FieldError(UsageError):
    """A bad value of one field of a request (`field`: its path, as "tools[0].function.name");
    `unsupported`: the field asks for what infer does not do."""

    def __init__(self, field: str, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.field, self.unsupported = field, unsupported


class ContextOverflowError(UsageError):
    """The prompt plus the requested tokens do not fit the context."""

    def __init__(self, *, prompt_tokens: int, max_tokens: int | None, n_ctx: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx
        wanted = f"{prompt_tokens} prompt tokens"
        if max_tokens:
            wanted += f" + {max_tokens} requested tokens"
        super().__init__(
            f"{wanted} do not fit the context of {n_ctx} tokens "
            "(raise -c/--ctx-size or shorten the input)"
        )


class MediaError(UsageError):
    """An image or audio file infer cannot take: unreadable, corrupt, of a kind the model's
    projector does not decode, too large, or given to a model without a projector (exit 2)."""


class ModelError(InferError):
    """The model cannot be used: missing, corrupt, unsupported (exit code 3)."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """No model matches the reference the user gave."""


class InvalidModelFileError(ModelError):
    """The file is not a well-formed GGUF file."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: not a valid GGUF file: {reason}")


class TemplateError(ModelError):
    """The chat template is broken or tried something the sandbox forbids."""


class NetworkError(InferError, ConnectionError):
    """The Hub could not be reached or refused the request (exit code 4)."""


class ResourceError(InferError, MemoryError):
    """Out of memory or disk, or llama.cpp could not allocate (exit code 5)."""


class LlamaError(InferError, RuntimeError):
    """llama.cpp reported a failure that is neither the user's nor the model file's."""
