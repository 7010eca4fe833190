"""What a run prints: a progress bar on a terminal, one line per logged step otherwise.

A progress bar rewrites its line with carriage returns, which a log file (``> run.log 2>&1``,
a job scheduler, CI) keeps as noise; there, and with ``disable_tqdm``, each logged step is one
plain line instead. The bar's postfix stays short enough for an 80-column terminal.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

# The postfix's share of an 80-column line: tqdm's own text ("GRPO:  10%|...| 30/300
# [04:31<40:43,  9.05s/it, ...]") takes about 45 columns before the bar gets any.
POSTFIX_WIDTH = 32


def _isatty(stream: TextIO | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def show_bar(disable_tqdm: bool, is_main: bool, stream: TextIO | None = None) -> bool:
    """Whether to draw tqdm's bar: on the main rank, not disabled, and on a terminal (tqdm
    writes to stderr)."""
    return is_main and not disable_tqdm and _isatty(sys.stderr if stream is None else stream)


def print_step_lines(bar_shown: bool, is_main: bool, stream: TextIO | None = None) -> bool:
    """Whether each logged step gets a line on stdout: when there is no bar, or stdout goes to
    a file (the bar, on the terminal's stderr, does not reach it)."""
    return is_main and (not bar_shown or not _isatty(sys.stdout if stream is None else stream))


def _short(name: str) -> str:
    return name.removesuffix("_reward")


def progress_postfix(
    logs: Mapping[str, float],
    reward_names: Sequence[str],
    correctness: str | None = None,
    width: int = POSTFIX_WIDTH,
) -> str:
    """``reward 0.51 accuracy 0.50 len 41``: the mean reward, then the correctness reward,
    the other rewards, the mean completion length and the KL (when not 0), as many as fit in
    ``width`` characters (tqdm shows the step time itself)."""
    items = [f"reward {logs.get('reward', 0.0):.2f}"]
    ordered = sorted(reward_names, key=lambda name: name != correctness)
    for name in ordered:
        value = logs.get(f"rewards/{name}/mean")
        if value is not None:
            items.append(f"{_short(name)} {value:.2f}")
    if "completions/mean_length" in logs:
        items.append(f"len {logs['completions/mean_length']:.0f}")
    if logs.get("kl"):
        items.append(f"kl {logs['kl']:.3f}")
    text = items[0]
    for item in items[1:]:
        if len(text) + 1 + len(item) > width:
            break
        text += " " + item
    return text


def step_line(logs: Mapping[str, float], max_steps: int, reward_names: Sequence[str]) -> str:
    """One logged step as one line, for a log file."""
    parts = [f"step {int(logs.get('step', 0))}/{max_steps}", f"reward {logs.get('reward', 0):.3f}"]
    rewards = [
        f"{_short(name)} {logs[f'rewards/{name}/mean']:.2f}"
        for name in reward_names
        if f"rewards/{name}/mean" in logs
    ]
    if rewards:
        parts.append(" ".join(rewards))
    if "completions/mean_length" in logs:
        parts.append(f"len {logs['completions/mean_length']:.0f}")
    parts.append(f"kl {logs.get('kl', 0.0):.4f}")
    if "time/step" in logs:
        parts.append(f"{logs['time/step']:.1f} s/step")
    return "[groupwise] " + " | ".join(parts)


def eval_line(metrics: Mapping[str, Any], step: int) -> str:
    """An evaluation's results as one line: the mean reward and each reward function's mean."""
    parts = [f"reward {metrics.get('eval/reward', 0.0):.3f}"]
    prefix, suffix = "eval/rewards/", "/mean"
    for key, value in metrics.items():
        if key.startswith(prefix) and key.endswith(suffix):
            parts.append(f"{_short(key[len(prefix) : -len(suffix)])} {value:.3f}")
    count = metrics.get("eval/num_prompts")
    where = f" on {int(count)} prompts" if count else ""
    return f"[groupwise] eval at step {step}{where}: " + " | ".join(parts)


@contextlib.contextmanager
def quiet_transformers_bars() -> Iterator[None]:
    """transformers' own progress bars (``Writing model shards`` on every save) off within the
    block: a checkpoint save inside the training bar would print a second bar under it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if was_on:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


# -- log_completions: TRL's table of the logged step's completions --------------------------------


def completion_text(entry: Any) -> Any:
    """A prompt or completion as TRL's table shows it: a conversation (a list of messages) as
    each message's upper-cased role, then its reasoning, content and tool calls; anything else
    as ``str``. Returns rich's ``Text``."""
    from rich.text import Text

    text = Text()
    if not (isinstance(entry, list) and all(isinstance(m, dict) for m in entry)):
        text.append(str(entry))
        return text
    for j, msg in enumerate(entry):
        text.append(f"{msg.get('role', '').upper()}\n", style="bold red")
        reasoning = msg.get("reasoning_content") or msg.get("thinking")
        if reasoning:
            text.append(reasoning, style="italic dim white")
            text.append("\n")
        content = msg.get("content")
        if isinstance(content, list):  # a multimodal message: typed blocks
            for block in content:
                if block.get("type") == "text":
                    text.append(block["text"])
                elif block.get("type") == "image":
                    text.append("[IMAGE]", style="bold cyan")
        elif isinstance(content, str):
            text.append(content)
        for k, call in enumerate(msg.get("tool_calls") or []):
            if k > 0:
                text.append("\n")
            function = call.get("function", {})
            raw = function.get("arguments", {})
            arguments = raw if isinstance(raw, dict) else json.loads(raw)
            listed = ", ".join(f"{name}={value!r}" for name, value in arguments.items())
            text.append(f"{function.get('name', '?')}({listed})")
        if j < len(entry) - 1:
            text.append("\n\n")
    return text


def print_completions_sample(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    rewards: Mapping[str, Sequence[float]],
    advantages: Sequence[float] | None,
    step: int,
    num_samples: int | None = None,
    extra: Mapping[str, Sequence[Any]] | None = None,
    seed: int | None = None,
) -> None:
    """TRL's ``print_prompt_completions_sample``: one rich table in a "Step N" panel, a row per
    completion (prompt, completion, each reward function's reward, the advantage, then the
    ``extra`` columns). ``num_samples`` rows drawn at random (None, or as many as there are:
    all; 0: nothing printed). The draw uses its own generator (``seed``), so printing leaves
    the run's random state as it was."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    extra = dict(extra or {})
    rewards = dict(rewards)
    indices = list(range(len(prompts)))
    if num_samples is not None and num_samples < len(prompts):
        if num_samples <= 0:
            return
        indices = random.Random(seed).sample(indices, num_samples)
    table = Table(show_header=True, header_style="bold white", expand=True)
    table.add_column("Prompt", style="bright_yellow")
    table.add_column("Completion", style="bright_green")
    for name in rewards:
        table.add_column(name, style="bold cyan", justify="right")
    if advantages is not None:
        table.add_column("Advantage", style="bold magenta", justify="right")
    for name in extra:
        table.add_column(name, style="bright_white")
    for i in indices:
        row = [completion_text(prompts[i]), completion_text(completions[i])]
        row += [f"{values[i]:.2f}" for values in rewards.values()]
        if advantages is not None:
            row.append(f"{advantages[i]:.2f}")
        row += [completion_text(values[i]) for values in extra.values()]
        table.add_row(*row)
        table.add_section()  # a rule between rows
    Console().print(Panel(table, expand=False, title=f"Step {step}", border_style="bold white"))
