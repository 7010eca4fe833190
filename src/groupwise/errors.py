"""Errors in what the user gave (an option, a file, a model, an output folder).

Each carries one paragraph that names the file, line, column or option and says what to do;
the command line prints it without a traceback (``--debug`` or ``GROUPWISE_DEBUG=1`` shows it
for a bug report). Anything else that escapes the command line is a bug and keeps its traceback.
They subclass ``ValueError`` (``OutputDirError``: ``OSError``) so code that caught the plain
type before still does.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

# True while the command line runs: errors then name options as flags (--name value), which is
# what the user typed; from Python they name keyword arguments (name=value).
_CLI_STYLE: contextvars.ContextVar[bool] = contextvars.ContextVar("cli_style", default=False)


@contextlib.contextmanager
def cli_style() -> Iterator[None]:
    """Within the block, :func:`option` spells options as command-line flags."""
    token = _CLI_STYLE.set(True)
    try:
        yield
    finally:
        _CLI_STYLE.reset(token)


def option(cli: str, python: str) -> str:
    """How an error tells the user to set an option: ``cli`` (e.g. ``--resume``) under the
    command line, ``python`` (e.g. ``resume_from_checkpoint="auto"``) from Python."""
    return cli if _CLI_STYLE.get() else python


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message (its ``repr`` when the message is empty): a library's
    exception quoted inside one of these errors' one-paragraph messages, without its traceback
    or the pages of detail some libraries append."""
    text = str(err).strip()
    return text.splitlines()[0] if text else repr(err)


class UserError(Exception):
    """An error the user can fix; the message says what and where."""


class ConfigError(UserError, ValueError):
    """A bad option: the message names the option and what was expected."""


class DataError(UserError, ValueError):
    """A data file (or built-in task) that cannot be read: names the file and line."""


class ModelLoadError(UserError, ValueError):
    """A model that cannot be found or loaded: names the model (and file)."""


class OutputDirError(UserError, OSError):
    """An output folder that cannot be used, or that holds an earlier run."""


class TaskSizeError(ConfigError):
    """More problems asked of a built-in task than it can generate: names the task, the option
    (``num_train_prompts`` or ``num_eval_prompts``) and the most it has."""

    def __init__(self, task: str, split: str, asked: int, maximum: int, *, exact: bool = True,
                 hint: str = "") -> None:  # fmt: skip
        self.task, self.split, self.asked, self.maximum = task, split, asked, maximum
        self.exact = exact
        self.option = "num_eval_prompts" if split == "eval" else "num_train_prompts"
        about = "" if exact else "about "
        super().__init__(
            f"task {task!r} can generate at most {about}{maximum} distinct {split} problems"
            f"{hint}, but {self.option}={asked} asks for more; set {self.option} to at most "
            f"{maximum}, or choose a larger task"
        )


class GenerationServerError(UserError, RuntimeError):
    """The generation server (``vllm_mode: server``) cannot be reached or refused a request:
    names the server, the route and what it answered."""
