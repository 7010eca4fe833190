"""groupwise's GRPOConfig under TRL's own parser: a TRL script ported by switching only
``from trl import GRPOConfig`` keeps ``trl.TrlParser((ScriptArguments, GRPOConfig,
ModelConfig))``, which is transformers' HfArgumentParser: one option per ``init`` field. The
options TRL's GRPOConfig lacks are ``init=False`` (no clash with ModelConfig or the script's
dataclass); TRL's names groupwise translates or ignores are parser-only fields."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import warnings
from dataclasses import dataclass, field

import pytest
import torch
import trl
import yaml
from transformers import HfArgumentParser

from groupwise import ConfigError, GRPOConfig
from groupwise.config.trl import IgnoredOptionsWarning

ARGV = [
    "--dtype", "bfloat16", "--reward_funcs", "accuracy", "format", "--output_dir", "X",
    "--beta", "0.1", "--learning_rate", "1e-5", "--bf16", "false",
]  # fmt: skip
VALUES = {"dtype": "bfloat16", "reward_funcs": ["accuracy", "format"], "output_dir": "X",
          "beta": 0.1, "learning_rate": 1e-5, "bf16": False}  # fmt: skip


@dataclass
class ScriptArgs(trl.ScriptArguments):
    """TRL's grpo.py pattern: the script's own reward_funcs beside ScriptArguments'."""

    reward_funcs: list[str] = field(default_factory=lambda: ["accuracy"])


def _quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call(*args, **kwargs)


def _check(script, config, model):
    assert model.dtype == "bfloat16"  # ModelConfig's: the script builds model_init_kwargs
    assert script.reward_funcs == ["accuracy", "format"]
    assert (config.beta, config.learning_rate, config.output_dir) == (0.1, 1e-5, "X")
    assert config.bf16 is False and config.bf16_autocast is False  # TRL's name, translated
    # GRPOConfig's own dtype and reward_funcs stay at their defaults: TRL's config has neither.
    assert (config.dtype, config.reward_funcs) == ("auto", None)
    assert type(config) is GRPOConfig


def test_the_tables_match_the_installed_trl():
    """A TRL upgrade that adds (or drops) a GRPOConfig field fails here."""
    from groupwise.config.trl_fields import TRL_GRPO_FIELDS, TRL_ONLY_TYPES

    theirs = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert TRL_GRPO_FIELDS == theirs
    options = set(GRPOConfig.field_names())
    assert set(TRL_ONLY_TYPES) == theirs - options
    by_name = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    # Only the names TRL's GRPOConfig has are options HfArgumentParser offers.
    assert {n for n, f in by_name.items() if f.init} == theirs
    assert {n for n, f in by_name.items() if not f.init} == options - theirs


@pytest.mark.parametrize("parser_type", [trl.TrlParser, HfArgumentParser])
def test_trl_parser_takes_groupwise_config_beside_trl_model_config(parser_type):
    parser = parser_type((ScriptArgs, GRPOConfig, trl.ModelConfig))
    if parser_type is trl.TrlParser:
        parsed = _quiet(parser.parse_args_and_config, ARGV)
    else:
        parsed = _quiet(parser.parse_args_into_dataclasses, ARGV)
    _check(*parsed)


def test_parse_dict_and_parse_yaml_file(tmp_path):
    parser = trl.TrlParser((ScriptArgs, GRPOConfig, trl.ModelConfig))
    _check(*_quiet(parser.parse_dict, VALUES))
    path = tmp_path / "args.yaml"
    path.write_text(yaml.safe_dump(VALUES))
    _check(*_quiet(HfArgumentParser((ScriptArgs, GRPOConfig, trl.ModelConfig)).parse_yaml_file,
                   path))  # fmt: skip
    # TRL's --config recipe: the YAML values are the defaults, the command line overrides them.
    path.write_text(yaml.safe_dump({**VALUES, "beta": 0.3, "push_to_hub": False}))
    script, config, model = _quiet(parser.parse_args_and_config,
                                   ["--config", str(path), "--beta", "0.1"])  # fmt: skip
    _check(script, config, model)
    assert config.push_to_hub is False


def test_only_values_other_than_the_default_count_as_given():
    """HfArgumentParser passes every option it offers, defaults included: a value equal to the
    option's default counts as not given (is_set, and the rules on what was given)."""
    parser = HfArgumentParser((ScriptArgs, GRPOConfig, trl.ModelConfig))
    default_seed = GRPOConfig.field_defaults()["seed"]
    _, config, _ = _quiet(parser.parse_args_into_dataclasses,
                          ["--learning_rate", "1e-5", "--seed", str(default_seed)])  # fmt: skip
    assert config.explicit_options == {"learning_rate"}
    assert not config.is_set("seed") and not config.is_set("beta")
    assert config.trl_ignored == {}  # no TRL name was given: nothing reported
    # parse_dict passes only the keys given: each counts, at its default value too.
    _, config, _ = _quiet(parser.parse_dict, {"seed": default_seed})
    assert config.is_set("seed")


def test_trl_names_on_trls_parser_are_read_as_groupwise_reads_them():
    parser = trl.TrlParser((ScriptArgs, GRPOConfig, trl.ModelConfig))
    with pytest.warns(IgnoredOptionsWarning, match="push_to_hub=True"):
        _, config, _ = parser.parse_args_and_config(["--push_to_hub", "--use_cpu"])
    assert config.push_to_hub is True and config.device == "cpu" and config.use_cpu
    assert "push_to_hub" not in config.to_dict() and "use_cpu" not in vars(config)
    with pytest.raises(ConfigError, match="fp16=True is not supported"):
        parser.parse_args_and_config(["--fp16", "true"])


def test_the_hidden_options_are_still_options_everywhere(tmp_path):
    config = GRPOConfig(model="m", dtype="bfloat16", use_peft=True, reward_funcs=["format"])
    assert (config.model, config.dtype, config.use_peft) == ("m", "bfloat16", True)
    assert config.is_set("dtype") and not config.is_set("lora_r")
    assert GRPOConfig("m").model == "m"  # positional values follow the fields, as before
    assert config.to_dict()["dtype"] == "bfloat16" and "bf16" not in config.to_dict()
    path = tmp_path / "config.yaml"
    config.to_yaml(path)
    assert GRPOConfig.from_yaml(path) == config
    assert GRPOConfig.from_dict({"dtype": "bfloat16"}).dtype == "bfloat16"
    copied = config.replace(beta=0.2)
    assert (copied.dtype, copied.model, copied.beta) == ("bfloat16", "m", 0.2)
    assert copied.is_set("dtype") and copied.is_set("beta")
    replaced = dataclasses.replace(config, beta=0.3)  # drops init=False fields by itself
    assert (replaced.dtype, replaced.use_peft, replaced.beta) == ("bfloat16", True, 0.3)
    assert replaced.is_set("beta") and not replaced.is_set("lora_r")
    assert copy.deepcopy(config) == config and pickle.loads(pickle.dumps(config)) == config
    with pytest.raises(ConfigError, match="dtype"):
        GRPOConfig(dtype="float16")  # the hidden options are validated as before
    signature = inspect.signature(GRPOConfig)
    assert list(signature.parameters)[0] == "model"
    assert signature.parameters["bf16"].kind is inspect.Parameter.KEYWORD_ONLY


@dataclass
class OpenR1Config(GRPOConfig):
    """open-r1's configs.py pattern: its own fields on a GRPOConfig subclass."""

    benchmarks: list[str] = field(default_factory=list)
    chat_template: str | None = None


def test_a_dataclass_subclass_under_trls_parser():
    parser = trl.TrlParser((ScriptArgs, OpenR1Config, trl.ModelConfig))
    _, config, model = _quiet(parser.parse_args_and_config,
                              [*ARGV, "--benchmarks", "math_500", "aime24"])  # fmt: skip
    assert type(config) is OpenR1Config and config.benchmarks == ["math_500", "aime24"]
    assert (config.beta, config.bf16_autocast, config.dtype) == (0.1, False, "auto")
    assert "bf16" not in vars(config)  # a TRL name holds no value: read back through views
    sub = _quiet(OpenR1Config, dtype="bfloat16", chat_template="t", bf16=True)
    assert (sub.dtype, sub.chat_template, sub.bf16) == ("bfloat16", "t", True)
    assert sub.replace(seed=1).dtype == "bfloat16"


def test_model_init_kwargs_dtype_and_attention_are_honoured():
    """TRL loads the model with model_init_kwargs (trl/trainer/utils.py create_model_from_path:
    its dtype, float32 when absent; its attn_implementation): the same options here."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", IgnoredOptionsWarning)
        config = GRPOConfig(model_init_kwargs={"dtype": "bfloat16",
                                               "attn_implementation": "eager"})  # fmt: skip
        assert (config.dtype, config.attn_implementation) == ("bfloat16", "eager")
        assert GRPOConfig(model_init_kwargs={"dtype": torch.float32}).dtype == "float32"
        assert GRPOConfig(model_init_kwargs={"torch_dtype": "bfloat16"}).dtype == "bfloat16"
    with pytest.raises(ConfigError, match="model_init_kwargs\\['dtype'\\]=torch.float16"):
        GRPOConfig(model_init_kwargs={"dtype": torch.float16})
    with pytest.raises(ConfigError, match="dtype='float32'"):
        GRPOConfig(dtype="float32", model_init_kwargs={"dtype": "bfloat16"})
    with pytest.warns(IgnoredOptionsWarning, match="'dtype': 'auto'"):
        assert GRPOConfig(model_init_kwargs={"dtype": "auto"}).dtype == "auto"


def test_model_init_kwargs_set_by_trls_grpo_script():
    """TRL's grpo.py assigns model_init_kwargs from ModelConfig after parsing: nothing is reported
    when they say what the run does, and ModelConfig's dtype becomes the weights' dtype."""
    from groupwise.trainer.trl_api import with_model_init_kwargs

    for dtype, expected in (("float32", "float32"), ("bfloat16", "bfloat16")):
        args = GRPOConfig()
        args.model_init_kwargs = dict(revision="main", trust_remote_code=False,
                                      attn_implementation=None, dtype=dtype)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("error", IgnoredOptionsWarning)
            applied = with_model_init_kwargs(args)
        assert (applied.dtype, applied.attn_implementation) == (expected, "sdpa")
    args = GRPOConfig(attn_implementation="sdpa")
    args.model_init_kwargs = {"attn_implementation": "eager"}
    with pytest.raises(ConfigError, match="attn_implementation='eager'"):
        with_model_init_kwargs(args)
    # --model_init_kwargs on the command line: it reads back whole, so that grpo.py's
    # model_init_kwargs.update(training_args.model_init_kwargs) keeps the user's dtype over
    # ModelConfig's, as in TRL; only the keys that set nothing are reported.
    parser = trl.TrlParser((ScriptArgs, GRPOConfig, trl.ModelConfig))
    with pytest.warns(IgnoredOptionsWarning) as caught:
        _, args, model = parser.parse_args_and_config(
            ["--model_init_kwargs", '{"dtype": "bfloat16", "device_map": "auto"}'])  # fmt: skip
    assert "model_init_kwargs={'device_map': 'auto'}" in str(caught[0].message)
    assert args.dtype == "bfloat16"
    assert args.model_init_kwargs == {"dtype": "bfloat16", "device_map": "auto"}
    merged = dict(revision="main", attn_implementation=model.attn_implementation,
                  dtype=model.dtype)  # fmt: skip
    merged.update(args.model_init_kwargs)
    args.model_init_kwargs = merged
    with pytest.warns(IgnoredOptionsWarning, match="'device_map': 'auto'"):
        assert with_model_init_kwargs(args).dtype == "bfloat16"
