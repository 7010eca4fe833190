"""TRL 1.16 / transformers TrainingArguments names on groupwise's GRPOConfig: refused values,
step ratios, the importance-sampling bounds, JSON-string dicts, reading names back, and setting
them after construction, each compared with the installed ``trl.GRPOConfig`` where TRL decides."""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import pickle
import warnings
from typing import Any

import pytest

from groupwise.config.grpo_config import GRPOConfig, parse_cli_overrides
from groupwise.config.trl import (
    TRL_IGNORED,
    TRL_REFUSED,
    TRL_TRANSLATED,
    IgnoredOptionsWarning,
    is_trl_name,
)
from groupwise.config.trl_readback import TRL_DEFAULTS
from groupwise.errors import ConfigError

trl = pytest.importorskip("trl")


@pytest.fixture(scope="module")
def trl_config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), bf16=False)


def _quiet(**kwargs: Any) -> GRPOConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredOptionsWarning)
        return GRPOConfig(**kwargs)


def _plain(value: Any) -> Any:
    """TRL's value as groupwise holds it: enums by their value, AcceleratorConfig as a dict."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "to_dict") and dataclasses.is_dataclass(value):
        # TrainingArguments pops use_configured_state once it sets its devices up
        return {k: v for k, v in value.to_dict().items() if k != "use_configured_state"}
    return value


# --- 1. refused values never reach YAML's parser raw --------------------------------------------


@pytest.mark.parametrize(
    "name, value",
    [
        ("vllm_structured_outputs_regex", "[0-9]+"),
        ("optim_args", "a: b: c"),
        ("lr_scheduler_kwargs", "{bad"),
        ("data_seed", "[1"),
        ("neftune_noise_alpha", "5"),
    ],
)
def test_refused_value_is_a_config_error_naming_it(name: str, value: str, tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        GRPOConfig(**{name: value})
    with pytest.raises(ConfigError, match=name):
        GRPOConfig.from_dict({name: value})
    path = tmp_path / "c.yaml"
    path.write_text(f"{name}: {json.dumps(value)}\n")
    with pytest.raises(ConfigError, match=name):
        GRPOConfig.from_yaml(path)
    with pytest.raises(ConfigError, match=name):
        GRPOConfig.from_yaml(path, parse_cli_overrides([f"--{name}", value]))


@pytest.mark.parametrize("value", ["null", "None", "", None])
def test_refused_name_at_its_off_value_is_ignored(value: Any) -> None:
    assert "data_seed" in _quiet(data_seed=value).trl_ignored
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredOptionsWarning)
        config = GRPOConfig.from_dict({"lr_scheduler_kwargs": "{}"})
    assert config.lr_scheduler_kwargs in ("{}", {})


# --- 2. ratio cadences ---------------------------------------------------------------------------


def test_ratio_cadences_resolve_against_max_steps() -> None:
    config = GRPOConfig(max_steps=10, save_steps=0.25, eval_steps=0.5, logging_steps=0.15)
    resolved = config.for_dataset(1000)
    # transformers: ceil(max_steps * ratio)
    assert (resolved.save_steps, resolved.eval_steps, resolved.logging_steps) == (3, 5, 2)
    assert all(isinstance(getattr(resolved, n), int)
               for n in ("save_steps", "eval_steps", "logging_steps"))  # fmt: skip


def test_ratio_cadences_resolve_after_epochs_are_counted() -> None:
    # 20 rows, 8 completions / 8 per prompt = 1 prompt per step -> 20 steps per epoch, 2 epochs
    config = GRPOConfig(max_steps=-1, num_train_epochs=2, save_steps=0.1, num_generations=8,
                        per_device_train_batch_size=8)  # fmt: skip
    resolved = config.for_dataset(20)
    assert resolved.max_steps == 40
    assert resolved.save_steps == 4


def test_ratio_cadences_from_yaml_and_the_command_line(tmp_path: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("max_steps: 8\nsave_steps: 0.25\n")
    config = GRPOConfig.from_yaml(path, parse_cli_overrides(["--eval_steps", "0.5",
                                                             "--logging_steps=0.3"]))  # fmt: skip
    assert (config.save_steps, config.eval_steps, config.logging_steps) == (0.25, 0.5, 0.3)
    resolved = config.for_dataset(100)
    assert (resolved.save_steps, resolved.eval_steps, resolved.logging_steps) == (2, 4, 3)


def test_ratio_cadences_from_the_cli_and_trl_parser() -> None:
    from groupwise.cli.args import _config_from_argv
    from groupwise.config.trl_parser import TrlParser

    config = _config_from_argv(["--save_steps", "0.25", "--max_steps", "8"])
    assert config.save_steps == 0.25 and config.for_dataset(100).save_steps == 2
    (config,) = TrlParser((GRPOConfig,)).parse_args_into_dataclasses(
        ["--logging_steps", "0.5", "--max_steps", "4"]
    )
    assert config.logging_steps == 0.5 and config.for_dataset(100).logging_steps == 2


@pytest.mark.parametrize("name", ["save_steps", "eval_steps", "logging_steps"])
def test_non_integer_cadence_at_or_above_one_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        GRPOConfig(**{name: 2.5})
    with pytest.raises(ConfigError, match=name):
        GRPOConfig.from_dict({name: "2.5"})
    assert getattr(GRPOConfig(**{name: 4.0}), name) == 4


# --- 3. importance-sampling bounds ---------------------------------------------------------------


def test_clip_min_not_below_clip_max_is_refused_as_trl_does() -> None:
    with pytest.raises(ValueError, match="clip_min"):
        trl.GRPOConfig(output_dir="unused", bf16=False, vllm_importance_sampling_clip_min=3.0,
                       vllm_importance_sampling_clip_max=3.0)  # fmt: skip
    with pytest.raises(ConfigError, match="rollout_correction_clip_min"):
        GRPOConfig(vllm_importance_sampling_clip_min=3.0, vllm_importance_sampling_clip_max=3.0)
    with pytest.raises(ConfigError, match="rollout_correction_clip_min"):
        GRPOConfig(rollout_correction_clip_min=4.0)  # clip_max 3.0 by default
    assert GRPOConfig(rollout_correction_clip_min=0.5).rollout_correction_clip_min == 0.5


def test_truncate_mode_without_bounds_is_refused_as_trl_does() -> None:
    options = dict(vllm_importance_sampling_mode="token_truncate",
                   vllm_importance_sampling_clip_max=None)  # fmt: skip
    with pytest.raises(ValueError, match="_truncate"):
        trl.GRPOConfig(output_dir="unused", bf16=False, **options)
    with pytest.raises(ConfigError, match="rollout_correction_clip"):
        GRPOConfig(**options)
    # without the correction TRL accepts it, and so does groupwise
    trl.GRPOConfig(output_dir="unused", bf16=False, vllm_importance_sampling_correction=False,
                   **options)  # fmt: skip
    GRPOConfig(vllm_importance_sampling_correction=False, **options)


# --- 4. JSON strings for dict options ------------------------------------------------------------


def test_json_string_dicts_are_parsed_as_trl_parses_them(trl_config: Any) -> None:
    text = '{"enable_thinking": false, "n": "3"}'
    theirs = trl.GRPOConfig(output_dir="unused", bf16=False, chat_template_kwargs=text)
    ours = GRPOConfig(chat_template_kwargs=text)
    assert ours.chat_template_kwargs == theirs.chat_template_kwargs == {
        "enable_thinking": False, "n": 3}  # fmt: skip
    assert GRPOConfig(generation_kwargs='{"temperature": 0.5}').temperature == 0.5
    config = _quiet(model_init_kwargs='{"quantization_config": {"load_in_4bit": true}}',
                    use_peft=True)  # fmt: skip
    assert config.load_in_4bit is True
    ours = _quiet(gradient_checkpointing_kwargs='{"use_reentrant": "false"}')
    assert ours.gradient_checkpointing_kwargs == {"use_reentrant": False}


@pytest.mark.parametrize("name", ["chat_template_kwargs", "generation_kwargs",
                                  "model_init_kwargs", "deepspeed"])  # fmt: skip
def test_bad_json_string_dict_names_the_option(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        GRPOConfig(**{name: "{enable_thinking: "})


def test_bad_yaml_dict_from_the_command_line_names_the_option() -> None:
    with pytest.raises(ConfigError, match="chat_template_kwargs"):
        GRPOConfig.from_dict({"chat_template_kwargs": "{bad: [x"})


# --- 5. reading TRL's names back -----------------------------------------------------------------


def _trl_only_names() -> list[str]:
    """TRL's names that are no groupwise option (translated, ignored or refused here)."""
    ours = {name for name in GRPOConfig.field_names() if not is_trl_name(name)}
    return sorted({f.name for f in dataclasses.fields(trl.GRPOConfig)} - ours)


def test_defaults_table_covers_every_trl_name() -> None:
    names = set(_trl_only_names())
    assert names <= set(TRL_DEFAULTS)
    assert (TRL_IGNORED | set(TRL_TRANSLATED) | set(TRL_REFUSED)) - {"logging_dir"} <= names


def test_defaults_table_matches_trl(trl_config: Any) -> None:
    declared = {"bf16"}  # groupwise: None (auto); the TRL config here was built with bf16=False
    for name in _trl_only_names():
        if name in declared:
            continue
        ours = TRL_DEFAULTS[name]
        theirs = _plain(getattr(trl_config, name))
        if name == "activation_checkpointing":  # TRL mirrors gradient_checkpointing (True there)
            assert theirs is trl_config.gradient_checkpointing
            continue
        if name == "accelerator_config":  # built by TrainingArguments: a view builds it too
            assert ours is None and theirs == _plain(GRPOConfig().accelerator_config)
            continue
        assert ours == theirs, name


def test_every_trl_name_reads_back_trls_value_when_not_given(trl_config: Any) -> None:
    config = GRPOConfig()
    for name in _trl_only_names():
        theirs = _plain(getattr(trl_config, name))
        ours = _plain(getattr(config, name))
        if name == "bf16":
            assert ours is None  # auto (declared difference)
        elif name == "activation_checkpointing":
            assert ours is config.gradient_checkpointing  # mirrors it, as TRL's does
        elif name == "vllm_importance_sampling_mode":
            assert ours == "token_truncate"  # rollout_correction_mode (declared difference)
        else:
            assert ours == theirs, name


@pytest.mark.parametrize(
    "given, name, expected",
    [
        ({"max_tool_calling_iterations": 2}, "max_tool_calling_iterations", 2),
        ({"max_turns": 6}, "max_tool_calling_iterations", 5),
        (
            {"vllm_importance_sampling_correction": False},
            "vllm_importance_sampling_correction",
            False,
        ),
        (
            {"rollout_correction_mode": "token_truncate"},
            "vllm_importance_sampling_mode",
            "token_truncate",
        ),
        ({"vllm_importance_sampling_cap": 2.0}, "vllm_importance_sampling_cap", 2.0),
        ({"vllm_importance_sampling_cap": 2.0}, "vllm_importance_sampling_clip_max", 2.0),
        ({"rollout_correction_clip_min": 0.5}, "vllm_importance_sampling_clip_min", 0.5),
        ({"remove_unused_columns": True}, "remove_unused_columns", True),
        ({"torch_compile": True}, "torch_compile", True),
        ({"gradient_checkpointing": False}, "activation_checkpointing", False),
        ({"gradient_checkpointing": True}, "activation_checkpointing", True),
        (
            {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
            "activation_checkpointing_kwargs",
            {"use_reentrant": False},
        ),
    ],
)
def test_given_trl_name_reads_back(given: dict[str, Any], name: str, expected: Any) -> None:
    assert getattr(_quiet(**given), name) == expected
    theirs = (
        trl.GRPOConfig(output_dir="unused", bf16=False, **given)
        if not any(k.startswith("rollout_correction") or k == "max_turns" for k in given)
        else None
    )
    if theirs is not None:
        assert getattr(theirs, name) == expected


def test_runtime_properties_match_trl_in_one_process(trl_config: Any, monkeypatch: Any) -> None:
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    config = GRPOConfig(per_device_train_batch_size=8, per_device_eval_batch_size=8, device="cpu")
    for name in (
        "process_index",
        "local_process_index",
        "world_size",
        "parallel_mode",
        "should_log",
        "should_save",
        "train_batch_size",
        "eval_batch_size",
        "n_gpu",
    ):
        assert getattr(config, name) == getattr(trl_config, name), name
    from transformers.training_args import ParallelMode

    assert config.parallel_mode is ParallelMode.NOT_PARALLEL
    state, theirs = config.distributed_state, trl_config.distributed_state
    for name in (
        "num_processes",
        "process_index",
        "local_process_index",
        "is_main_process",
        "is_local_main_process",
        "distributed_type",
    ):
        assert getattr(state, name) == getattr(theirs, name), name
    with config.main_process_first(desc="map") as entered:
        assert entered is None
    assert config.get_warmup_steps(10) == trl_config.get_warmup_steps(10) == 0
    assert _quiet(warmup_steps=0.25).get_warmup_steps(10) == 3  # ceil(10 * 0.25)
    assert json.loads(config.to_json_string()) == json.loads(json.dumps(config.to_dict()))
    sanitized = config.to_sanitized_dict()
    assert sanitized["train_batch_size"] == 8 and sanitized["eval_batch_size"] == 8
    assert sanitized["report_to"] == "[]"  # lists become strings, as in TRL's
    assert isinstance(trl_config.to_sanitized_dict()["report_to"], str)


def test_runtime_properties_under_torchrun(monkeypatch: Any) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    config = GRPOConfig(per_device_train_batch_size=8, device="cpu")
    from transformers.training_args import ParallelMode

    assert (config.world_size, config.process_index, config.local_process_index) == (4, 3, 1)
    assert config.parallel_mode is ParallelMode.DISTRIBUTED
    assert not config.should_log and not config.should_save
    assert config.train_batch_size == 8  # per process: DDP, one device each
    assert not config.distributed_state.is_main_process


# --- 6. TRL names set after construction ---------------------------------------------------------


def test_ignored_name_set_later_is_recorded_and_reported() -> None:
    config = GRPOConfig()
    with pytest.warns(IgnoredOptionsWarning, match="transformers_continuous_batching_config"):
        config.transformers_continuous_batching_config = {"block_size": 128}
    assert config.trl_ignored["transformers_continuous_batching_config"] == {"block_size": 128}
    assert config.transformers_continuous_batching_config == {"block_size": 128}
    assert "transformers_continuous_batching_config" not in config.to_dict()


def test_refused_name_set_later_is_refused() -> None:
    config = GRPOConfig()
    with pytest.raises(ConfigError, match="neftune_noise_alpha"):
        config.neftune_noise_alpha = 5.0
    with pytest.warns(IgnoredOptionsWarning):
        config.neftune_noise_alpha = None  # its "off" value


def test_translated_name_set_later_sets_the_groupwise_option() -> None:
    config = GRPOConfig()
    config.max_tool_calling_iterations = 2
    assert config.max_turns == 3 and config.max_tool_calling_iterations == 2
    config.bf16 = False
    assert config.bf16_autocast is False and config.bf16 is False
    config.use_cpu = True
    assert config.device == "cpu"
    config.vllm_importance_sampling_clip_min = 0.5
    assert config.rollout_correction_clip_min == 0.5
    config.use_vllm = True
    assert config.generation_engine == "vllm" and config.use_vllm is True
    config.use_vllm = False  # TRL: transformers' own generation
    assert config.generation_engine == "hf" and config.use_vllm is False
    assert config.is_set("max_turns") and config.is_set("bf16_autocast")
    with pytest.raises(ConfigError, match="fp16"):
        config.fp16 = True
    assert "bf16" not in vars(config) and "use_cpu" not in vars(config)


def test_fields_and_copies_still_work_with_setattr() -> None:
    config = _quiet(remove_unused_columns=True, max_steps=7)
    config.learning_rate = 1e-5  # a field: a plain attribute
    assert config.learning_rate == 1e-5
    for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config)),
                   config.replace(beta=0.0)):  # fmt: skip
        assert copied.trl_ignored == {"remove_unused_columns": True}
        assert copied.learning_rate == 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("error", IgnoredOptionsWarning)
        assert dataclasses.replace(config, beta=0.0).beta == 0.0
