"""A command's GRPOConfig from its arguments: ``[CONFIG.yaml] [--option value ...]``, TRL's
names (``--model_name_or_path``, ``--dataset_name``, ``--config``), ``--resume`` with the run's
own config.yaml, and a run or model folder for ``eval`` / ``chat``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..config.grpo_config import GRPOConfig, parse_cli_overrides
from ..errors import ConfigError

# TRL's command-line names for options groupwise spells differently (`trl grpo
# --model_name_or_path M --dataset_name D --config F`): accepted on the command line and in YAML.
CLI_ALIASES = {"model_name_or_path": "model", "dataset_name": "task"}


def _apply_aliases(values: dict[str, Any], where: str) -> dict[str, Any]:
    values = dict(values)
    for alias, name in CLI_ALIASES.items():
        if alias not in values:
            continue
        value = values.pop(alias)
        if name in values and values[name] != value:
            raise ConfigError(
                f"{where}: {alias} (TRL's name) and {name} are the same option and disagree "
                f"({value!r} vs {values[name]!r}); give one"
            )
        values[name] = value
    return values


def _yaml_with_aliases(path: str, overrides: dict[str, Any]) -> GRPOConfig:
    """``GRPOConfig.from_yaml``, with TRL's script names (model_name_or_path, dataset_name) in
    the file read as groupwise's."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        raw = None  # from_yaml reports it
    if isinstance(raw, dict) and any(alias in raw for alias in CLI_ALIASES):
        values = {**_apply_aliases(raw, str(path)), **overrides}
        return GRPOConfig.from_dict(values, source=str(path))
    return GRPOConfig.from_yaml(path, overrides)


def _run_config(overrides: dict[str, Any]) -> str | None:
    """``--resume`` without a config file: the config.yaml the run wrote into its output_dir
    (or, for ``--resume RUN/checkpoint-N``, into the checkpoint's run folder), so that the
    resumed run has the run's own options; None when there is none."""
    resume = overrides.get("resume_from_checkpoint")
    folder = overrides.get("output_dir")
    if folder is None and resume not in (None, "auto"):
        folder = str(Path(resume).parent)
    if folder is None:
        return None
    path = Path(folder) / "config.yaml"
    if not path.is_file():
        return None
    # The folder as found now (config.yaml holds it as given then, maybe from another cwd).
    overrides.setdefault("output_dir", folder)
    return str(path)


def _config_from_argv(argv: list[str], base: dict[str, Any] | None = None) -> GRPOConfig:
    config_path = None
    if argv and not argv[0].startswith("--"):
        config_path, argv = argv[0], argv[1:]
    overrides = _apply_aliases(parse_cli_overrides(argv), "command line")
    if "config" in overrides:  # TRL's --config FILE
        if config_path is not None:
            raise ConfigError(
                f"two config files: {config_path} and --config {overrides['config']}; give one"
            )
        config_path = overrides.pop("config")
    if "resume" in overrides:  # --resume [PATH]: the newest checkpoint in output_dir, or PATH
        value = overrides.pop("resume")
        overrides["resume_from_checkpoint"] = "auto" if value == "true" else value
    if config_path is None and base is None and overrides.get("resume_from_checkpoint"):
        config_path = _run_config(overrides)
        if config_path is not None:
            given = sorted(set(overrides) - {"resume_from_checkpoint", "output_dir"})
            more = f", with {', '.join('--' + n for n in given)} on top" if given else ""
            print(f"[groupwise] resuming with the run's own options from {config_path}{more}")
    if config_path is not None and os.path.isdir(config_path):
        raise ConfigError(
            f"{config_path} is a folder, not a YAML config; to continue the run there: "
            f"groupwise train --output_dir {config_path} --resume (its options are read from "
            f"{Path(config_path) / 'config.yaml'})"
        )
    if config_path is not None:
        values = dict(base or {})
        return _yaml_with_aliases(config_path, {**values, **overrides})
    return GRPOConfig.from_dict({**(base or {}), **overrides}, source="command line")


MODEL_FILES = ("config.json", "adapter_config.json")


def _folder_config(folder: str, rest: list[str], command: str) -> GRPOConfig:
    """``groupwise eval RUN`` / ``chat RUN``: the model in a run folder (or a checkpoint, or any
    model folder), with the run's own task and generation settings from its config.yaml (the
    run folder's, also for one of its checkpoints), the options in ``rest`` on top. eval
    writes its results into that folder."""
    from ..trainer.checkpoints import latest_checkpoint

    path = Path(folder)
    model = path
    if not any((path / name).is_file() for name in MODEL_FILES):
        model = latest_checkpoint(path)  # a run stopped before its final save
        if model is None:
            raise ConfigError(
                f"{folder}: holds no model ({' or '.join(MODEL_FILES)}) and no checkpoint-<step> "
                f"folder; give a run folder, a checkpoint or a model folder, e.g. groupwise "
                f"{command} runs/demo"
            )
    run_config = next(
        (c for c in (path / "config.yaml", path.parent / "config.yaml") if c.is_file()), None
    )
    overrides = _apply_aliases(parse_cli_overrides(rest), "command line")
    values: dict[str, Any] = {"model": str(model)}
    if command == "eval":
        values["eval_output"] = str(model / "eval.json")  # next to the model it describes
    values["resume_from_checkpoint"] = None
    values["overwrite_output_dir"] = False
    values.update(overrides)
    if run_config is None:
        print(f"[groupwise] {model}: no config.yaml of a run next to it; default settings")
        return GRPOConfig.from_dict(values, source="command line")
    args = _yaml_with_aliases(str(run_config), values)
    print(
        f"[groupwise] {model} with the run's task and generation settings from {run_config} "
        f"(task {args.task}, max_completion_length {args.max_completion_length}, temperature "
        f"{args.temperature})"
    )
    return args
