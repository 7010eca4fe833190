"""A model object given to the trainer (TRL's ``GRPOTrainer(model=<PreTrainedModel or
PeftModel>, train_dataset=...)``): the run's records name that model and the dataset, and a
model the user quantised to 4 bits and wrapped with LoRA (TRL's QLoRA recipe) is trained as
it is, its options read from the model itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from groupwise import GRPOConfig, GRPOTrainer
from groupwise.errors import ConfigError
from groupwise.runtime.models import smollm2_tokenizer, tiny_random_model
from groupwise.runtime.quantization import is_4bit, model_4bit_settings, quantize_4bit
from groupwise.wiring.model import dataset_label

ROWS = [{"prompt": f"Say something number {i}"} for i in range(8)]


def _reward(completion_ids, **kwargs):
    return [len(ids) / 10 for ids in completion_ids]


def _parity(completion_ids, **kwargs):
    """Rewards that differ within a group, so that one step moves the adapter."""
    return [float(ids[0] % 2) for ids in completion_ids]


def _tiny_args(**overrides) -> GRPOConfig:
    """tiny_config's run without naming a model, task or output folder (as a TRL script)."""
    values = dict(max_steps=1, learning_rate=1e-2, beta=0.0, num_generations=4,
                  per_device_train_batch_size=8, max_completion_length=4, disable_tqdm=True,
                  seed=0)  # fmt: skip
    return GRPOConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("org") / "tiny-llama"
    tiny_random_model().save_pretrained(folder)
    return folder


def test_records_name_the_model_object_and_dataset(saved_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output folder is runs/ under the working dir
    model = AutoModelForCausalLM.from_pretrained(saved_model)
    trainer = GRPOTrainer(model=model, reward_funcs=_reward, train_dataset=ROWS,
                          args=_tiny_args(), processing_class=smollm2_tokenizer())  # fmt: skip
    name = trainer.output_dir.name
    assert name.startswith("tiny-llama-custom-") and "arithmetic" not in name
    trainer.train()
    config = yaml.safe_load((trainer.output_dir / "config.yaml").read_text())
    assert (config["model"], config["task"]) == (str(saved_model), "custom")
    # run.json lists the options that differ from their defaults: the model and task do.
    run = json.loads((trainer.output_dir / "run.json").read_text())
    assert {"model", "task"} <= set(run["defaults"])
    text = trainer.create_model_card().read_text()
    assert f"A fine-tune of `{saved_model}`" in text and "tiny-random" not in text


def test_a_named_task_and_an_unnamed_model_keep_what_was_given(tmp_path):
    args = _tiny_args(task="my-math", model="tiny-random", output_dir=str(tmp_path / "run"))
    tokenizer = smollm2_tokenizer()
    trainer = GRPOTrainer(tiny_random_model(), _reward, ROWS, args=args, processing_class=tokenizer)
    assert (trainer.args.model, trainer.args.task) == ("tiny-random", "my-math")
    unnamed = GRPOTrainer(tiny_random_model(), _reward, ROWS, processing_class=tokenizer,
                          args=_tiny_args(output_dir=str(tmp_path / "b")))  # fmt: skip
    assert unnamed.args.model == "LlamaForCausalLM"  # not the default's "tiny-random"


def test_dataset_label():
    from datasets import Dataset, DatasetInfo

    assert dataset_label(ROWS) == "custom"
    assert dataset_label(Dataset.from_list(ROWS)) == "custom"
    hub_info = DatasetInfo(dataset_name="deep_math", builder_name="parquet")
    hub = Dataset.from_list(ROWS, info=hub_info)
    assert dataset_label(hub) == "deep_math"
    # A local file's packaged builder names only the format.
    local = Dataset.from_list(ROWS, info=DatasetInfo(dataset_name="json", builder_name="json"))
    assert dataset_label(local) == "custom"


def _qlora_model(folder: Path, double_quant: bool = True):
    """TRL's QLoRA recipe: a 4-bit base from from_pretrained, prepared for k-bit training and
    wrapped with LoRA by peft, before the trainer sees it."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=double_quant,
                               bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    base = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quant,
                                                dtype=torch.float32)  # fmt: skip
    base = prepare_model_for_kbit_training(base)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def test_model_4bit_settings_are_read_from_the_layers():
    cpu = torch.device("cpu")
    assert model_4bit_settings(tiny_random_model()) is None
    nested = quantize_4bit(tiny_random_model(), "nf4", True, torch.float32, cpu)
    assert model_4bit_settings(nested) == ("nf4", True)
    plain = quantize_4bit(tiny_random_model(), "fp4", False, torch.float32, cpu)
    assert model_4bit_settings(plain) == ("fp4", False)


def test_a_qlora_peft_model_is_trained_as_it_is(saved_model, tmp_path):
    model = _qlora_model(saved_model)
    args = _tiny_args(output_dir=str(tmp_path / "run"))  # no use_peft, no load_in_4bit
    trainer = GRPOTrainer(model, _parity, ROWS, args=args, processing_class=smollm2_tokenizer())
    assert trainer.model is model and is_4bit(trainer.model)
    settings = (trainer.args.use_peft, trainer.args.load_in_4bit, trainer.args.lora_r,
                trainer.args.bnb_4bit_quant_type, trainer.args.use_bnb_nested_quant)  # fmt: skip
    assert settings == (True, True, 4, "nf4", True)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert trainer.log_history[-1]["step"] == 1
    after = dict(model.named_parameters())
    assert any(not torch.equal(after[n], p) for n, p in before.items())  # the adapter trained
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    keys = ("model", "use_peft", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant")
    recorded = tuple(config[k] for k in keys)
    assert recorded == (str(saved_model), True, True, "nf4", True)
    card = trainer.create_model_card().read_text()
    assert "library_name: peft" in card


def test_gradient_checkpointing_off_turns_off_what_the_model_came_with(saved_model, tmp_path):
    # prepare_model_for_kbit_training turns checkpointing on; the option decides (a checkpointing
    # model returns no prompt KV cache for the group's shared prompt forward).
    model = _qlora_model(saved_model)
    args = _tiny_args(output_dir=str(tmp_path / "run"), gradient_checkpointing=False)
    trainer = GRPOTrainer(model, _parity, ROWS, args=args, processing_class=smollm2_tokenizer())
    assert not model.get_base_model().is_activation_checkpointing
    trainer.train()
    assert trainer.log_history[-1]["step"] == 1


def test_a_4bit_model_conflicting_with_the_options_given_is_refused(saved_model, tmp_path):
    args = _tiny_args(output_dir=str(tmp_path / "run"), bnb_4bit_quant_type="fp4")
    with pytest.raises(ConfigError, match=r"bnb_4bit_quant_type='nf4'.*bnb_4bit_quant_type='fp4'"):
        GRPOTrainer(_qlora_model(saved_model), _reward, ROWS, args=args,
                    processing_class=smollm2_tokenizer())  # fmt: skip


def test_a_4bit_model_needs_an_adapter(tmp_path):
    from peft import LoraConfig

    cpu, tokenizer = torch.device("cpu"), smollm2_tokenizer()
    model = quantize_4bit(tiny_random_model(), "nf4", False, torch.float32, cpu)
    with pytest.raises(ConfigError, match="holds 4-bit .* peft_config"):
        GRPOTrainer(model, _reward, ROWS, args=_tiny_args(output_dir=str(tmp_path / "a")),
                    processing_class=tokenizer)  # fmt: skip
    # TRL's way: the 4-bit base with a peft_config; groupwise's: use_peft=True.
    lora = LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM")
    model = quantize_4bit(tiny_random_model(), "nf4", False, torch.float32, cpu)
    trainer = GRPOTrainer(model, _reward, ROWS, args=_tiny_args(output_dir=str(tmp_path / "b")),
                          peft_config=lora, processing_class=tokenizer)  # fmt: skip
    assert trainer.args.load_in_4bit and trainer.args.use_peft
    model = quantize_4bit(tiny_random_model(), "nf4", False, torch.float32, cpu)
    args = _tiny_args(output_dir=str(tmp_path / "c"), use_peft=True)
    trainer = GRPOTrainer(model, _reward, ROWS, args=args, processing_class=tokenizer)
    assert trainer.args.load_in_4bit
