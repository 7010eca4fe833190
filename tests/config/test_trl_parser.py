"""TRL's parser pattern with groupwise's GRPOConfig: ``TrlParser((ScriptArguments, GRPOConfig,
ModelConfig))`` with the names both declare, TRL's names on the command line, ``--config``
YAML, ``@dataclass`` subclasses (the pattern of open-r1's configs.py), and ModelConfig's
helpers against TRL's meaning (``get_peft_config``, ``get_quantization_config``)."""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from dataclasses import dataclass, field

import pytest
from transformers import HfArgumentParser

from groupwise import (
    ConfigError,
    GRPOConfig,
    ModelConfig,
    ScriptArguments,
    TrlParser,
    get_kbit_device_map,
    get_peft_config,
    get_quantization_config,
)


def _parse(argv, types=(ScriptArguments, GRPOConfig, ModelConfig), **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TrlParser(types).parse_args_and_config(argv, **kwargs)


def test_hf_argument_parser_alone_offers_only_trls_names():
    """HfArgumentParser adds one option per init field: GRPOConfig's options that TRL's lacks
    (dtype, use_peft, ...) are init=False, so they clash with no other dataclass there (TRL's
    own ModelConfig: tests/config/test_trl_hf_parser.py). This ModelConfig keeps the
    trust_remote_code of TRL before 1.7 (open-r1 reads it), which TRL's GRPOConfig now has as
    well: only this TrlParser takes the two together."""
    parser = HfArgumentParser((ScriptArguments, GRPOConfig))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, config = parser.parse_args_into_dataclasses(["--beta", "0.1"])
    assert (config.dtype, config.use_peft, config.beta) == ("auto", False, 0.1)
    with pytest.raises(argparse.ArgumentError, match="option strings: --trust_remote_code"):
        HfArgumentParser((ScriptArguments, GRPOConfig, ModelConfig))
    # A dataclass declaring a name TRL's GRPOConfig has still conflicts, as under TRL.
    with pytest.raises(argparse.ArgumentError, match="conflicting option string: --beta"):
        HfArgumentParser((_Beta, GRPOConfig))


@dataclass
class _Beta:
    beta: float = 0.5


def test_shared_model_names_reach_model_config_and_grpo_config():
    script, config, model = _parse([
        "--dataset_name", "data", "--model_name_or_path", "tiny-random", "--dtype", "bfloat16",
        "--attn_implementation", "eager", "--use_peft", "--lora_r", "4", "--lora_alpha", "8",
        "--lora_dropout", "0.1", "--lora_target_modules", "q_proj", "v_proj", "--max_steps", "2",
    ])  # fmt: skip
    assert script.dataset_name == "data" and script.dataset_train_split == "train"
    assert (model.dtype, model.attn_implementation, model.use_peft) == ("bfloat16", "eager", True)
    assert (model.lora_r, model.lora_alpha, model.lora_dropout) == (4, 8, 0.1)
    assert model.lora_target_modules == ["q_proj", "v_proj"]
    # TRL loads the model with ModelConfig's dtype and attention only through the script's
    # model_init_kwargs: GRPOConfig keeps its own (model_init_kwargs sets them, as in TRL).
    assert config.dtype == "auto" and config.attn_implementation == "sdpa"
    assert not config.is_set("dtype") and not config.is_set("attn_implementation")
    assert config.use_peft
    assert (config.lora_r, config.lora_alpha, config.lora_dropout) == (4, 8, 0.1)
    assert config.lora_target_modules == ["q_proj", "v_proj"]
    assert config.max_steps == 2 and type(config) is GRPOConfig


def test_defaults_stay_each_dataclasss_own_and_only_given_options_count_as_set():
    _, config, model = _parse(["--learning_rate", "1e-5"])
    assert model.dtype == "float32" and model.attn_implementation is None  # TRL's defaults
    assert config.dtype == "auto" and config.attn_implementation == "sdpa"  # groupwise's
    assert config.learning_rate == 1e-5
    assert config.explicit_options == {"learning_rate"}
    assert config.is_set("learning_rate") and not config.is_set("max_steps")


def test_trl_names_on_the_command_line():
    _, config, _ = _parse([
        "--bf16", "False", "--use_cpu", "--optim", "adamw_torch_fused", "--push_to_hub", "False",
        "--logging-dir", "logs", "--scale_rewards", "false", "--warmup-steps", "0.25",
    ])  # fmt: skip
    assert config.bf16_autocast is False and config.bf16 is False
    assert config.device == "cpu" and config.use_cpu
    assert config.scale_rewards == "none" and config.warmup_ratio == 0.25
    assert config.trl_ignored == {"push_to_hub": False, "logging_dir": "logs"}
    assert config.push_to_hub is False  # read back as a TRL script does
    with pytest.raises(ConfigError, match="fp16=True is not supported"):
        _parse(["--fp16", "True"])


def test_bad_values_name_the_option():
    with pytest.raises(ConfigError, match="option 'max_steps' expects an integer"):
        _parse(["--max_steps", "two"])
    with pytest.raises(ConfigError, match="option 'lora_r' expects an integer"):
        _parse(["--lora_r", "x"])
    with pytest.raises(ValueError, match="not used by the TrlParser: \\['--no_such_option'"):
        _parse(["--no_such_option", "1"])


def test_config_file_then_command_line(tmp_path, monkeypatch):
    monkeypatch.delenv("GW_TRL_PARSER_VAR", raising=False)
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "env:\n  GW_TRL_PARSER_VAR: seven\nmodel_name_or_path: tiny-random\ndataset_name: d\n"
        "max_steps: 4\nbf16: false\nlora_r: 8\nuse_peft: true\nreward_funcs: [format, accuracy]\n"
    )
    script, config, model = _parse(["--config", str(path), "--max_steps", "3"])
    assert script.dataset_name == "d" and model.model_name_or_path == "tiny-random"
    assert config.max_steps == 3  # the command line overrides the file
    assert config.bf16_autocast is False and config.reward_funcs == ["format", "accuracy"]
    assert model.lora_r == config.lora_r == 8 and model.use_peft and config.use_peft
    assert config.explicit_options >= {"max_steps", "lora_r", "use_peft", "reward_funcs"}
    import os

    assert os.environ["GW_TRL_PARSER_VAR"] == "seven"
    path.write_text("max_steps: 2\nnot_an_option: 1\n")
    with pytest.raises(ConfigError, match="unknown options in the config file"):
        _parse(["--config", str(path)])
    *_, rest = _parse(["--config", str(path)], return_remaining_strings=True)
    assert rest == ["--not_an_option", "1"]


def test_parse_yaml_file_routes_names_as_the_command_line(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text("dataset_name: d\nmax_steps: 3\nbf16: false\nlora_r: 4\nuse_peft: true\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        script, config, model = TrlParser((ScriptArguments, GRPOConfig, ModelConfig)
                                          ).parse_yaml_file(path)  # fmt: skip
    assert script.dataset_name == "d" and config.max_steps == 3 and config.bf16_autocast is False
    assert model.lora_r == config.lora_r == 4 and model.use_peft and config.use_peft
    path.write_text("max_steps: 3\nnot_an_option: 1\n")
    with pytest.raises(ValueError, match="not used by the TrlParser: \\['not_an_option'\\]"):
        TrlParser((ScriptArguments, GRPOConfig)).parse_yaml_file(path)


# A training script's own argument classes, the pattern recipe repositories built on TRL use:
# options added by subclassing GRPOConfig with @dataclass, and script arguments that declare
# names GRPOConfig also has (reward_funcs, repetition_max_penalty) for the script to read.
@dataclass
class RecipeGRPOConfig(GRPOConfig):
    eval_suites: list[str] = field(default_factory=list)  # benchmarks to run after training
    system_prompt: str | None = None  # prepended to every prompt by the script
    samples_to_print: int = 0  # completions the script prints each step
    log_prompts_once: bool = True


@dataclass
class RecipeScriptArguments(ScriptArguments):
    reward_funcs: list[str] = field(default_factory=lambda: ["accuracy", "format"])
    repetition_max_penalty: float = -1.0  # the script's own repetition reward
    prompt_column: str = "prompt"


def test_script_subclass_configs_parse():
    script, config, model = _parse(
        ["--reward_funcs", "accuracy", "length", "--repetition_max_penalty", "-0.5",
         "--eval_suites", "math_500", "--bf16", "false", "--max_steps", "2", "--use_peft", "true",
         "--system_prompt", "Think first."],
        (RecipeScriptArguments, RecipeGRPOConfig, ModelConfig),
    )  # fmt: skip
    # The script's own names are the script's: GRPOConfig keeps its defaults (TRL's has none).
    assert script.reward_funcs == ["accuracy", "length"]
    assert script.repetition_max_penalty == -0.5
    assert config.reward_funcs is None and config.repetition_max_penalty == -1.0
    assert type(config) is RecipeGRPOConfig and config.eval_suites == ["math_500"]
    assert config.system_prompt == "Think first." and config.bf16_autocast is False
    assert model.use_peft and config.use_peft
    default_script, *_ = _parse([], (RecipeScriptArguments, RecipeGRPOConfig, ModelConfig))
    assert default_script.reward_funcs == ["accuracy", "format"]


def test_a_dataclass_subclass_keeps_trl_names_and_methods(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = RecipeGRPOConfig(bf16=False, max_steps=3, logging_dir="logs", eval_suites=["x"])
    assert config.bf16_autocast is False and config.trl_ignored == {"logging_dir": "logs"}
    assert [str(w.message).count("logging_dir") for w in caught] == [1]
    assert config.is_set("max_steps") and not config.is_set("beta")
    copied = config.replace(beta=0.0)
    assert type(copied) is RecipeGRPOConfig and copied.eval_suites == ["x"]
    assert copied.is_set("beta") and copied.trl_ignored == {"logging_dir": "logs"}
    with pytest.raises(ConfigError, match="unknown option 'bf17'"):
        RecipeGRPOConfig(bf17=True)
    assert "eval_suites" in RecipeGRPOConfig.field_names()
    # An instance made without the constructor (what copy and pickle do) answers too.
    bare = object.__new__(RecipeGRPOConfig)
    assert bare.trl_ignored == {} and not bare.is_set("max_steps")


def test_a_peft_config_on_a_subclass(tmp_path):
    from groupwise.trainer.trl_api import with_peft_config

    config = RecipeGRPOConfig(max_steps=1)
    model = ModelConfig(use_peft=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"])
    recorded = with_peft_config(config, get_peft_config(model))
    assert type(recorded) is RecipeGRPOConfig and recorded.use_peft and recorded.lora_r == 4
    assert recorded.lora_target_modules == ["q_proj", "v_proj"]


def test_trl_resolved_batch_sizes_are_accepted_when_they_agree():
    # TRL fills both: generation_batch_size = per_device_train_batch_size * ranks * steps.
    config = GRPOConfig(per_device_train_batch_size=8, steps_per_generation=2,
                        generation_batch_size=16, num_generations=4)  # fmt: skip
    assert config.micro_steps_per_generation == 2 and config.completions_per_generation == 16
    with pytest.raises(ConfigError, match="generation_batch_size=24 disagree.* = 16"):
        GRPOConfig(per_device_train_batch_size=8, steps_per_generation=2,
                   generation_batch_size=24, num_generations=4)  # fmt: skip


def test_get_peft_config_is_trls():
    assert get_peft_config(ModelConfig()) is None
    model = ModelConfig(use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.0,
                        lora_target_modules=["q_proj"], use_rslora=True)  # fmt: skip
    lora = get_peft_config(model)
    # TRL: a one-element list is the module name itself.
    assert lora.target_modules == "q_proj" and lora.bias == "none"
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.use_rslora) == (8, 16, 0.0, True)
    assert lora.task_type == "CAUSAL_LM"


def test_get_quantization_config_is_trls():
    assert get_quantization_config(ModelConfig()) is None
    four = get_quantization_config(
        ModelConfig(load_in_4bit=True, dtype="bfloat16", use_bnb_nested_quant=True)
    )
    assert four.load_in_4bit and four.bnb_4bit_quant_type == "nf4"
    assert str(four.bnb_4bit_compute_dtype) == "torch.bfloat16" and four.bnb_4bit_use_double_quant
    assert get_quantization_config(ModelConfig(load_in_8bit=True)).load_in_8bit
    with pytest.raises(ConfigError, match="load_in_8bit and load_in_4bit"):
        ModelConfig(load_in_8bit=True, load_in_4bit=True)
    assert get_kbit_device_map() is None  # no CUDA here


def test_model_config_and_script_arguments_have_trls_fields():
    model = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    assert model["dtype"] == "float32" and model["lora_task_type"] == "CAUSAL_LM"
    assert {"model_name_or_path", "model_revision", "load_in_4bit", "bnb_4bit_quant_storage",
            "lora_modules_to_save", "use_dora"} <= set(model)  # fmt: skip
    script = {f.name: f.default for f in dataclasses.fields(ScriptArguments)}
    assert script["dataset_test_split"] == "test" and script["dataset_streaming"] is False


def test_trust_remote_code_is_read_from_model_config_as_older_trl_scripts_do(tmp_path):
    """open-r1's get_model / get_tokenizer read model_args.trust_remote_code, TRL's ModelConfig
    field before TRL 1.7 moved it to the trainer configs: the parsed value lands on both, from
    the command line or a recipe file."""
    _, config, model = _parse(["--model_name_or_path", "m", "--trust_remote_code", "True"])
    assert (model.trust_remote_code, config.trust_remote_code) == (True, True)
    _, config, model = _parse(["--model_name_or_path", "m"])
    assert (model.trust_remote_code, config.trust_remote_code) == (False, False)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: m\ntrust_remote_code: true\n")
    _, config, model = _parse(["--config", str(recipe)])
    assert (model.trust_remote_code, config.trust_remote_code) == (True, True)


def test_scripts_read_trl_names_back_from_the_config():
    """TRL's grpo.py reads training_args.model_init_kwargs, open-r1's local_rank, fp16, do_eval:
    the value given, the translation, or TrainingArguments' default."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = GRPOConfig(use_cpu=True, bf16=True, hub_model_id="me/run", push_to_hub=True)
    assert (config.push_to_hub, config.hub_model_id) == (True, "me/run")
    assert config.bf16 is True and config.fp16 is False and config.use_cpu is True
    assert config.use_vllm is False
    plain = GRPOConfig()
    assert plain.model_init_kwargs is None and plain.push_to_hub is False
    assert (plain.local_rank, plain.do_eval) == (-1, False)
    assert plain.bf16 is None  # auto: on with a bf16 GPU
    plain.model_init_kwargs = {"dtype": "bfloat16"}  # TRL's script sets it after parsing
    assert plain.model_init_kwargs == {"dtype": "bfloat16"}
    assert "model_init_kwargs" not in plain.to_dict()
    copied = plain.replace(max_steps=5)  # what the trainer's for_dataset() makes
    assert copied.model_init_kwargs == {"dtype": "bfloat16"} and copied.max_steps == 5
    with pytest.raises(AttributeError, match="'GRPOConfig' object has no attribute 'n_gpus'"):
        plain.n_gpus  # noqa: B018


def test_torch_dtype_is_trls_older_name_of_dtype():
    """open-r1 reads model_args.torch_dtype (TRL's ModelConfig before the rename to dtype): one
    value under both names, on the command line, in YAML and in Python; like --dtype, it stays
    ModelConfig's (the script's model_init_kwargs carries it to the model, as in TRL)."""
    _, config, model = _parse(["--model_name_or_path", "m", "--torch_dtype", "bfloat16"])
    assert (model.dtype, model.torch_dtype, config.dtype) == ("bfloat16", "bfloat16", "auto")
    assert not config.is_set("dtype")
    _, config, model = _parse(["--model_name_or_path", "m", "--dtype", "bfloat16"])
    assert (model.dtype, model.torch_dtype, config.dtype) == ("bfloat16", "bfloat16", "auto")
    _, config, model = _parse(["--model_name_or_path", "m"])  # TRL 1.16's default, both names
    assert (model.dtype, model.torch_dtype) == ("float32", "float32")
    assert not config.is_set("dtype")
    _, config, model = TrlParser((ScriptArguments, GRPOConfig, ModelConfig)).parse_dict(
        {"model_name_or_path": "m", "torch_dtype": "bfloat16"})  # fmt: skip
    assert (model.dtype, config.dtype) == ("bfloat16", "auto")
    assert ModelConfig(torch_dtype="auto").dtype == "auto"
    with pytest.raises(ConfigError, match="torch_dtype is TRL's older name of dtype"):
        ModelConfig(dtype="bfloat16", torch_dtype="auto")


def test_report_to_reads_back_as_transformers_list():
    """open-r1's `"wandb" in training_args.report_to`: a list, as TrainingArguments holds it,
    also when no logger is wanted (default, "none")."""
    for argv, expected in (([], []), (["--report_to", "none"], []),
                           (["--report_to", "tensorboard"], ["tensorboard"])):  # fmt: skip
        _, config, _ = _parse(["--model_name_or_path", "m", *argv])
        assert config.report_to == expected and "wandb" not in config.report_to
    assert GRPOConfig(report_to=None).report_to == []


def test_trainingarguments_logging_names_read_back(monkeypatch):
    """open-r1 logs with training_args.get_process_log_level() and .n_gpu (TrainingArguments')."""
    from transformers.utils import logging as hf_logging

    config = GRPOConfig(device="cpu")
    assert config.n_gpu == 0  # CPU: no GPU, as TrainingArguments(use_cpu=True)
    assert config.get_process_log_level() == hf_logging.get_verbosity()  # "passive"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chatty = GRPOConfig(device="cpu", log_level="info", log_level_replica="error")
    assert chatty.get_process_log_level() == 20
    monkeypatch.setenv("LOCAL_RANK", "1")  # another process of the machine: the replica level
    assert chatty.get_process_log_level() == 40
    assert GRPOConfig(device="cpu").get_process_log_level() == 30  # replica default "warning"
