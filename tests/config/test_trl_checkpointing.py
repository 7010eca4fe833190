"""transformers 5's activation checkpointing names, read as TRL 1.16 reads them (checked against
the installed trl.GRPOConfig): ``activation_checkpointing`` is ``gradient_checkpointing`` (the
newer name winning), the kwargs' ``offload`` is ``activation_offloading``, every_n_layers other
than 1 is refused, and the keys applied are not reported as ignored."""

import warnings

import pytest
import trl

from groupwise import GRPOConfig
from groupwise.config.grpo_config import parse_cli_overrides
from groupwise.config.trl import IgnoredOptionsWarning
from groupwise.errors import ConfigError

CASES = [
    {},
    {"activation_checkpointing": False},
    {"activation_checkpointing": True},
    {"gradient_checkpointing": False},
    {"activation_checkpointing": True, "gradient_checkpointing": False},
    {"activation_checkpointing": False, "gradient_checkpointing": True},
    {"activation_checkpointing_kwargs": {"offload": True}},
    {"gradient_checkpointing_kwargs": {"offload": True}},
    {"activation_checkpointing_kwargs": {"offload": False},
     "gradient_checkpointing_kwargs": {"offload": True}},
]  # fmt: skip


def _trl(**options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.GRPOConfig(output_dir="unused", use_cpu=True, bf16=False, **options)


@pytest.mark.parametrize("options", CASES)
def test_checkpointing_names_mean_what_they_mean_in_trl(options):
    theirs = _trl(**options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredOptionsWarning)
        ours = GRPOConfig(**options)
    assert ours.gradient_checkpointing == theirs.activation_checkpointing
    assert ours.activation_checkpointing == theirs.activation_checkpointing
    kwargs = theirs.activation_checkpointing_kwargs or {}
    assert ours.activation_offloading == bool(kwargs.get("offload", False))
    assert ours.activation_checkpointing_kwargs == theirs.activation_checkpointing_kwargs
    assert ours.gradient_checkpointing_kwargs == theirs.gradient_checkpointing_kwargs


def test_applied_keys_are_not_reported_and_others_are():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOConfig(activation_checkpointing_kwargs={"offload": True, "use_reentrant": False})
    assert not [w for w in caught if issubclass(w.category, IgnoredOptionsWarning)]
    with pytest.warns(
        IgnoredOptionsWarning, match=r"gradient_checkpointing_kwargs=\{'use_reentrant': True\}"
    ):
        GRPOConfig(gradient_checkpointing_kwargs={"use_reentrant": True, "offload": False})


def test_every_n_layers_and_a_conflicting_offload_are_refused_with_the_option():
    with pytest.raises(ConfigError, match="activation_checkpointing_kwargs every_n_layers=2"):
        GRPOConfig(activation_checkpointing_kwargs={"every_n_layers": 2})
    with pytest.raises(ConfigError, match="offload=True means activation_offloading=True"):
        GRPOConfig(activation_checkpointing_kwargs={"offload": True}, activation_offloading=False)


def test_the_command_line_and_yaml_spellings(tmp_path):
    overrides = parse_cli_overrides(["--activation_checkpointing", "false"])
    assert GRPOConfig.from_dict(overrides).gradient_checkpointing is False
    path = tmp_path / "run.yaml"
    path.write_text('activation_checkpointing_kwargs: {"offload": true}\n', encoding="utf-8")
    assert GRPOConfig.from_yaml(path).activation_offloading is True
