"""``groupwise.GRPOConfig()`` against ``trl.GRPOConfig()``: every field of the installed TRL's
config (TrainingArguments' included) reads back TRL's default from groupwise's, except the
deliberate differences listed in :data:`groupwise.config.trl_parity.DIFFERENCES`, and every
entry of that list still differs."""

from __future__ import annotations

import dataclasses
import enum
import warnings
from typing import Any

import pytest

from groupwise import GRPOConfig
from groupwise.config.trl_parity import (
    DIFFERENCES,
    TRL_VERSION,
    Difference,
    differences_in_effect,
    prompt_cut_message,
    prompt_cut_warning,
)

trl = pytest.importorskip("trl")

# TRL's _BaseConfig resolves bf16=None to `not fp16`, True; a CPU refuses that default (without
# use_cpu), so there the TRL config is built with bf16=False and bf16's default is TRL's rule.
_TRL_BF16_DEFAULT = True
_MISSING = object()


def _value(value: Any) -> Any:
    """A read-back value in a comparable form: enums as their value, sequences as lists,
    dataclass objects (AcceleratorConfig) as dicts, a torch.device as its string."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _value(v) for k, v in dataclasses.asdict(value).items()}
    if type(value).__name__ == "device":
        return str(value)
    return value


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, GRPOConfig, set[str]]:
    """(TRL's default config, groupwise's default config, the names given to build TRL's)."""
    import os

    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))  # neither may write, but nothing lands in the tree
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            given: dict[str, Any] = {}
            try:
                reference = trl.GRPOConfig()
            except ValueError:  # no bf16 GPU: TRL's bf16=True default is refused
                given = {"bf16": False}
                reference = trl.GRPOConfig(**given)
            ours = GRPOConfig()
    finally:
        os.chdir(here)
    return reference, ours, set(given)


def _trl_default(reference: Any, name: str, given: set[str]) -> Any:
    if name == "bf16" and name in given:
        return _TRL_BF16_DEFAULT
    return _value(getattr(reference, name, _MISSING))


def _ours(config: GRPOConfig, name: str) -> Any:
    try:
        return _value(getattr(config, name))
    except AttributeError:
        return _MISSING


def _trl_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(trl.GRPOConfig) if f.init and f.name[0] != "_"]


def test_the_installed_trl_is_the_version_compared_against():
    assert trl.__version__ == TRL_VERSION, (
        f"trl {trl.__version__} is installed, the differences were checked against "
        f"{TRL_VERSION}: review DIFFERENCES against the new release and update TRL_VERSION"
    )


def test_every_trl_field_reads_back_trls_default_unless_declared(configs):
    reference, ours, given = configs
    unreadable, differing = [], []
    for name in _trl_fields():
        theirs, mine = _trl_default(reference, name, given), _ours(ours, name)
        if mine is _MISSING:
            unreadable.append(name)
        elif mine != theirs and (name not in DIFFERENCES or DIFFERENCES[name].same_default):
            differing.append(f"{name}: groupwise {mine!r}, TRL {theirs!r}")
    assert not differing, (
        "defaults that differ from TRL's without being declared in "
        f"groupwise.config.trl_parity.DIFFERENCES: {differing}"
    )
    assert not unreadable, f"TRL names groupwise's config cannot read back: {unreadable}"


def test_every_declared_difference_still_differs(configs):
    reference, ours, given = configs
    stale = []
    for name, difference in DIFFERENCES.items():
        theirs, mine = _trl_default(reference, name, given), _ours(ours, name)
        assert mine is not _MISSING, f"{name} is declared but groupwise has no such option"
        if difference.same_default:
            # Only the meaning differs: both must read back the same default.
            if mine != theirs:
                stale.append(f"{name}: declared same_default, but {mine!r} != {theirs!r}")
        elif mine == theirs:
            stale.append(f"{name}: declared as differing, but both read back {mine!r}")
    assert not stale, f"stale entries in DIFFERENCES: {stale}"


@pytest.mark.parametrize(
    "given, name",
    [({"eval_strategy": "steps"}, "eval_steps"), ({"save_strategy": "steps"}, "save_steps"),
     ({"num_train_epochs": 2}, "max_steps")],
)  # fmt: skip
def test_options_trl_resolves_from_other_defaults_resolve_the_same(given, name):
    # TRL fills eval_steps from logging_steps, save_steps from its own default and max_steps
    # from num_train_epochs when they are left out: groupwise must fill them from the same
    # (now TRL's) defaults.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference, ours = trl.GRPOConfig(bf16=False, **given), GRPOConfig(**given)
    assert getattr(ours, name) == getattr(reference, name)


def test_the_declared_options_that_trl_lacks_are_still_absent_from_it(configs):
    reference, _, _ = configs
    fields = set(_trl_fields())
    absent = [name for name in DIFFERENCES if name not in fields]
    # device is a TrainingArguments property (not a field); max_prompt_length left TRL in 1.0.
    assert sorted(absent) == ["device", "max_prompt_length"]
    assert not hasattr(reference, "max_prompt_length")
    assert type(reference.device).__name__ == "device"  # a torch.device, not an option


def test_each_declared_difference_says_both_sides_and_why():
    for name, difference in DIFFERENCES.items():
        assert isinstance(difference, Difference)
        for text in (difference.groupwise, difference.trl, difference.reason):
            assert text.strip() and "|" not in text, name  # a "|" would break the docs' table


# ----------------------------------------------------------------------------------------------
# What a run says at its start


def _config(**options: Any) -> GRPOConfig:
    return GRPOConfig(output_dir="runs/x", **options)


def test_a_run_with_trls_settings_throughout_says_nothing():
    config = _config(bf16=False)
    assert differences_in_effect(config, "cpu", autocast=False) == []


def test_a_run_without_output_dir_says_where_it_writes():
    (line,) = [
        line for line in differences_in_effect(GRPOConfig(bf16=False)) if "output_dir" in line
    ]
    assert "runs/<model>-<task>-<time>" in line and "trainer_output" in line


def test_bf16_left_to_auto_says_what_it_became_on_this_device():
    (cpu,) = differences_in_effect(_config(), "cpu", autocast=False)
    assert cpu.startswith("bf16 was not given") and "float32" in cpu and "on this cpu" in cpu
    (gpu,) = [line for line in differences_in_effect(_config(), "cuda", autocast=True)
              if line.startswith("bf16")]  # fmt: skip
    assert "bf16 autocast on this cuda" in gpu
    assert differences_in_effect(_config(bf16=True), "cpu", autocast=True) == []


def test_tool_rounds_are_said_only_for_runs_with_tools_and_no_limit_given():
    (line,) = differences_in_effect(_config(bf16=False, tools=["calculator"]))
    assert "at most 3 tool rounds" in line and "TRL: no limit" in line
    assert (
        differences_in_effect(
            _config(bf16=False, tools=["calculator"], max_tool_calling_iterations=5)
        )
        == []
    )


def test_constant_schedule_with_warmup_is_said():
    (line,) = differences_in_effect(
        _config(bf16=False, lr_scheduler_type="constant_with_warmup", warmup_steps=3)
    )
    assert "warms up over 3" in line and "TRL's constant has no warmup" in line
    assert differences_in_effect(_config(bf16=False, lr_scheduler_type="constant")) == []


def test_cispo_without_epsilon_high_says_its_cap():
    (line,) = differences_in_effect(_config(bf16=False, loss_type="cispo"))
    assert "weight cap is 5" in line and "TRL: epsilon, 0.2" in line
    assert differences_in_effect(_config(bf16=False, loss_type="cispo", epsilon_high=4.0)) == []


def test_the_correction_mode_is_said_where_the_samplers_log_probs_are_recorded():
    (line,) = differences_in_effect(_config(bf16=True), "cuda", autocast=True)  # auto: static
    assert "token_truncate caps each token's weight" in line and "sequence_mask" in line
    (line,) = differences_in_effect(_config(bf16=False, generation_dtype="bfloat16"))
    assert line.startswith("rollout_correction_mode was not given")
    assert differences_in_effect(_config(bf16=False, generation_engine="static")) != []
    # Not said: on a CPU with the HF engine in fp32 (no sampler log-probs), when set, when off.
    assert differences_in_effect(_config(bf16=False), "cpu") == []
    assert (
        differences_in_effect(
            _config(bf16=True, rollout_correction_mode="sequence_mask"), "cuda", autocast=True
        )
        == []
    )
    assert differences_in_effect(_config(bf16=True, rollout_correction=False), "cuda") == []


def test_cadences_inside_a_generation_batch_are_said():
    """num_iterations=2: two optimizer steps per generation batch; logging_steps=10 and
    save_steps=500 are multiples of 2 (nothing to say), logging_steps=5 is not."""
    assert differences_in_effect(_config(bf16=False, num_iterations=2)) == []
    (line,) = differences_in_effect(_config(bf16=False, num_iterations=2, logging_steps=5))
    assert "trains 2 optimizer steps" in line and "logging_steps=5" in line
    assert "save_steps" not in line and "TRL: at that optimizer step" in line


def test_vllm_context_length_is_said_with_the_vllm_engine():
    config = _config(bf16=False, max_prompt_length=100, max_completion_length=28,
                     rollout_correction_mode="sequence_mask")  # fmt: skip
    config.generation_engine = "vllm"  # building a vLLM config needs vLLM installed
    (line,) = differences_in_effect(config)
    assert "= 128 tokens" in line


def test_every_line_belongs_to_a_declared_difference():
    from groupwise.config import trl_parity

    assert set(trl_parity._IN_EFFECT) <= set(DIFFERENCES)


def test_the_prompt_cut_is_said_once_naming_the_limit():
    warning = prompt_cut_warning(7)
    assert warning is not None and "max_prompt_length=7" in str(warning)
    assert str(warning) == prompt_cut_message(7) and TRL_VERSION in str(warning)
    assert prompt_cut_warning(None) is None


def test_prompt_batches_warn_at_the_first_cut_prompt_only(tokenizer):
    from groupwise.curriculum.base import PromptBatches
    from groupwise.runtime.distributed import DistributedContext

    rows = [{"prompt": "word " * 40}, {"prompt": "hi"}] * 2
    batches = PromptBatches(
        rows, tokenizer, 2, 8, seed=0, dist=DistributedContext(), shuffle=False,
        cut_warning=prompt_cut_warning(8),
    )  # fmt: skip
    with pytest.warns(UserWarning, match="max_prompt_length=8") as caught:
        first = batches.next()
    assert len(caught) == 1
    assert max(len(ids) for ids in first.prompt_ids) == 8  # the last 8 tokens kept
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches.next()  # cut again, said no more
