"""Command line: ``groupwise train [CONFIG.yaml] [--field value ...]``, ``eval``, ``chat``, ``demo``
(and ``memory``, ``report``, ``vllm-serve``).

The command line is one module a part: :mod:`.args` (the config from the arguments),
:mod:`..wiring.rows` (the task's rows), and one module a command: :mod:`.train` (train, demo),
:mod:`.evaluate` (eval) and :mod:`.chat`; ``groupwise memory`` and ``groupwise report`` are
their packages' own command lines. Here: the usage text, the dispatch, and how errors and
Ctrl-C end the program.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..config.grpo_config import GRPOConfig, option_help
from ..errors import ConfigError, UserError, cli_style
from ..wiring.rows import apply_long_prompt_policy as apply_long_prompt_policy
from ..wiring.rows import build_datasets as build_datasets
from ..wiring.rows import check_reward_columns as check_reward_columns

# The commands' public names are importable from here too; main() calls the commands by
# these names, so patching one here replaces it.
from .args import CLI_ALIASES as CLI_ALIASES
from .args import MODEL_FILES as MODEL_FILES
from .args import _config_from_argv, _folder_config
from .chat import _pop_prompts, run_chat
from .evaluate import run_eval
from .train import DEMO_CONFIG, run_demo, run_train
from .train import DEMO_OUTPUT_DIR as DEMO_OUTPUT_DIR

# The package the commands import from ("groupwise"): its modules are looked up by name.
_ROOT = __package__.rpartition(".")[0]

# Only light modules are imported here: torch and transformers take seconds to import, and
# `groupwise --help` or a mistyped option needs neither. Each command imports what it uses.


def _is_user_error(err: BaseException) -> bool:
    """Errors in what the user gave: printed as one paragraph, without a traceback (a bug keeps
    its traceback). A reward function's failure is the user's code, reported the same way; its
    class is looked up only if its module was imported (otherwise it cannot have been raised)."""
    if isinstance(err, UserError):
        return True
    scoring = sys.modules.get(f"{_ROOT}.rewards.scoring")
    return scoring is not None and isinstance(err, scoring.RewardFunctionError)


USAGE = """usage: groupwise <command> [CONFIG.yaml] [--option value ...]

commands:
  train   run GRPO; options come from CONFIG.yaml and/or --option value (any GRPOConfig field)
  eval    evaluate --model (a path, checkpoint or built-in) on the task's held-out prompts:
          greedy accuracy, and with --eval_num_generations N unbiased pass@k / mean@k, overall
          and per difficulty; --compare_model M adds the paired difference with a 95% CI.
          groupwise eval RUN: the run's model with its task and generation settings
          (RUN/config.yaml); results in RUN/eval.json
  chat    groupwise chat RUN [--prompt TEXT ...]: the trained model's answers to your prompts
          (or to 3 held-out prompts of the run's task), with the run's generation settings
  demo    fine-tune SmolLM2-135M-Instruct on arithmetic on the CPU, with held-out greedy
          accuracy before and after (--option value overrides the demo's settings)
  memory  plan the memory of a run, PPO vs GRPO side by side (groupwise memory --help);
          --measure runs one real step of each and prints predicted vs measured
  vllm-serve  groupwise vllm-serve MODEL [vLLM options]: a vLLM server to generate on, for
          --generation_engine vllm --vllm_mode server (groupwise vllm-serve --help)
  report  groupwise report RUN_DIR [RUN_DIR ...]: one run: RUN_DIR/report.html (held-out
          accuracy before -> after, curves, warnings, changed options, example completions);
          several: one page comparing them (compare-A-vs-B.html here, or --output FILE)

TRL's names work too: --model_name_or_path, --dataset_name (a data file, a saved datasets
folder, or a hub id), --config FILE.

train options worth knowing: --resume (continue from the newest checkpoint in output_dir; with
--output_dir RUN alone it takes the run's own options from RUN/config.yaml),
--overwrite_output_dir (start over in a folder that holds an earlier run), --debug (tracebacks),
--algorithm ppo (the actor-critic baseline), --use_peft true (LoRA), --report_to tensorboard

precision (docs/gpu.md): on a bf16 GPU the default is fp32 weights and AdamW state with
bf16 autocast for forward, backward and generation (--bf16_autocast auto; TRL's --bf16 true means
the same); on CPU, fp32 throughout. --dtype bfloat16 stores the trained weights in bf16 with no
fp32 master copy: less memory, but updates below ~1/512 of a weight are lost (it warns).
--generation_dtype bfloat16 generates in bf16 while an fp32 update corrects for the difference.
--tf32 (CUDA; default: torch's own setting), --attn_implementation sdpa|eager|flash_attention_2.

e.g. groupwise train --model tiny-random --task arithmetic --max_steps 5 --output_dir runs/x
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "memory":
        from ..memory import main as memory_main

        return memory_main(rest)
    if command == "report":
        from ..report import main as report_main

        return report_main(rest)
    if command == "vllm-serve":
        from .vllm_serve import main as vllm_serve_main

        return vllm_serve_main(rest)
    if any(a in ("-h", "--help") for a in rest):
        print(USAGE)
        print("options (GRPOConfig fields, default in brackets):")
        meanings = option_help()
        for name, value in GRPOConfig.field_defaults().items():
            print(f"  --{name} [{value}]  {meanings[name]}".rstrip())
        return 0
    debug = "--debug" in rest or os.environ.get("GROUPWISE_DEBUG", "") not in ("", "0")
    rest = [a for a in rest if a != "--debug"]
    if command not in ("train", "eval", "demo", "chat"):
        print(f"groupwise: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    watch = _StartupInterrupt()
    try:
        with cli_style(), watch:  # errors name options as flags: --name value
            _run_command(command, rest, watch)
    except Exception as err:
        if debug and _is_user_error(err):
            raise
        code = _exit_code(err)
        if watch.seen and code is None and not debug:  # a half-finished import after Ctrl-C
            return interrupted()
        if code is None:
            raise
        return code
    except KeyboardInterrupt:  # a second Ctrl-C, or one during start-up: the shell's 130
        if debug:
            raise
        return interrupted()
    return 0


def _exit_code(err: Exception) -> int | None:
    """Print ``err`` as the command line reports it and return the exit status; None for a bug
    (it keeps its traceback)."""
    if _is_user_error(err):
        print(f"groupwise: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, UserError) else 1  # 1: a reward function failed
    checkpoint = sys.modules.get(f"{_ROOT}.trainer.checkpoints")
    if checkpoint is not None and isinstance(err, checkpoint.TrainingInterrupted):
        print(f"groupwise: {err}", file=sys.stderr)
        return 128 + err.signum
    if checkpoint is not None and isinstance(err, checkpoint.TrainingStopped):
        print(f"groupwise: stopped: {err}", file=sys.stderr)
        return 1
    return None


# Set when a Ctrl-C stopped the command before anything was saved (``python -m groupwise`` then
# exits at once, see groupwise/__main__.py).
INTERRUPTED = False


def interrupted() -> int:
    """Say that a Ctrl-C stopped the command before anything was saved; the shell's 130."""
    global INTERRUPTED
    INTERRUPTED = True
    print("groupwise: interrupted (nothing saved)", file=sys.stderr)
    return 130


class _StartupInterrupt:
    """Ctrl-C while torch and transformers are imported is only recorded, and :meth:`check`
    raises it once those imports are done: a KeyboardInterrupt raised inside an extension's
    import can abort the interpreter, and some library code there catches every exception (a
    bare ``except``) and would swallow it. After :meth:`check`, Ctrl-C raises at once, until the
    trainer installs its own handler (finish the step, save, stop) for the run itself."""

    def __init__(self) -> None:
        self.seen = False
        self.importing = True
        self.previous: Any = None

    def __enter__(self) -> _StartupInterrupt:
        import signal
        import threading

        # An inherited SIG_IGN (nohup, a background job of a script) stays: Python's rule too.
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        ):
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def _handler(self, signum: int, frame: Any) -> None:
        self.seen = True
        if not self.importing:
            raise KeyboardInterrupt

    def check(self) -> None:
        self.importing = False
        if self.seen:
            raise KeyboardInterrupt


def _run_command(command: str, rest: list[str], watch: _StartupInterrupt | None = None) -> None:
    import importlib

    prompts: list[str] = []
    if command == "chat":
        prompts, rest = _pop_prompts(rest)
    folder = rest[0] if rest and not rest[0].startswith("--") else None
    if command in ("eval", "chat") and folder is not None and os.path.isdir(folder):
        args = _folder_config(rest[0], rest[1:], command)
    elif command == "chat":
        raise ConfigError(
            "chat: give a run or model folder first, e.g. groupwise chat runs/demo "
            '--prompt "What is 7 * 3?"'
        )
    else:
        args = _config_from_argv(rest, base=DEMO_CONFIG if command == "demo" else None)
    # What every command imports anyway (seconds), then a Ctrl-C during it is honoured.
    importlib.import_module(".trainer.ppo" if args.algorithm == "ppo" else ".trainer.grpo", _ROOT)
    if watch is not None:
        watch.check()
    if not sys.stderr.isatty():  # a log file: transformers' bars would fill it with \r updates
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if command == "train":
        run_train(args)
    elif command == "eval":
        run_eval(args)
    elif command == "chat":
        run_chat(args, prompts)
    else:
        run_demo(args)
