"""LoRA (peft): only the adapter trains, the reference is the adapter-disabled model (no copy),
saving writes the adapter (and optionally the merged model), and resume is exact."""

import copy

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from conftest import TargetToken, tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.runtime.models import load_model_and_tokenizer

ROWS = [{"prompt": f"Say something number {i}", "answer": str(i)} for i in range(16)]


def _reward(completions, completion_ids, **kwargs):
    # Fraction of token ids below 64: an easy, dense signal for the random model.
    return [sum(t < 64 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def _args(tmp_path, **overrides) -> GRPOConfig:
    lora = dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, max_steps=3,
                learning_rate=5e-3, beta=0.04)  # fmt: skip
    return tiny_config(tmp_path, **{**lora, **overrides})


def test_lora_reference_is_the_adapter_disabled_base(tmp_path):
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path))
    assert trainer.ref_model is None  # no second copy of the weights
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base, _ = load_model_and_tokenizer("tiny-random", None, seed=0)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}

    logs = trainer.train_step()
    assert abs(logs["kl"]) < 1e-6  # B = 0 at init: policy == reference on the first step
    trainer.train_step()
    trainer.train_step()
    # The base weights never move; the reference log-probs equal the untouched base model's.
    wrapped = trainer.model.get_base_model().state_dict()
    for name, value in base_state.items():
        key = next(k for k in wrapped if k.replace(".base_layer", "") == name)
        assert torch.equal(wrapped[key], value), name
    ids = torch.tensor([[5, 9, 3, 7, 11, 2]])
    with torch.no_grad():
        with trainer.model.disable_adapter():
            ref_logits = trainer.model(input_ids=ids).logits
        policy_logits = trainer.model(input_ids=ids).logits
        base_logits = base(input_ids=ids).logits
    torch.testing.assert_close(ref_logits, base_logits, rtol=0, atol=1e-6)
    assert not torch.allclose(policy_logits, base_logits, atol=1e-4)  # the adapter learned


def test_lora_saves_adapter_and_merged_model(tmp_path):
    trainer = GRPOTrainer(
        "tiny-random", _reward, ROWS, args=_args(tmp_path, save_merged_model=True)
    )
    trainer.train()
    run = tmp_path / "run"
    assert (run / "adapter_model.safetensors").is_file()
    assert (run / "adapter_config.json").is_file()
    assert not (run / "model.safetensors").exists()  # the adapter only, not a full copy
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        base, _ = load_model_and_tokenizer("tiny-random", None, seed=0)
        reloaded = PeftModel.from_pretrained(base, run)(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(run / "merged")(input_ids=ids).logits
    torch.testing.assert_close(reloaded, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged, expected, rtol=1e-4, atol=1e-4)


def test_lora_resume_is_exact(tmp_path):
    full = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "a", max_steps=4))
    full.train()
    GRPOTrainer(
        "tiny-random", _reward, ROWS, args=_args(tmp_path / "b", max_steps=2, save_steps=2)
    ).train()
    rest = GRPOTrainer(
        "tiny-random",
        _reward,
        ROWS,
        args=_args(tmp_path / "b", max_steps=4, save_steps=2, resume_from_checkpoint="auto"),
    )
    rest.train()
    for (name, p), q in zip(full.model.named_parameters(), rest.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_lora_learns(tmp_path):
    args = _args(
        tmp_path,
        max_steps=12,
        learning_rate=1e-2,
        beta=0.0,
        temperature=0.1,
        lora_r=8,
        num_generations=8,
        per_device_train_batch_size=16,
        max_completion_length=8,
    )
    rows = [{"prompt": "Say something"}] * 4  # one context: the target is always reachable
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=copy.deepcopy(args))
    trainer.train()
    rewards = [row["reward"] for row in trainer.log_history]
    # Measured: 0.03 -> 0.97 (lr 1e-2, seed 0); the same run without updates stays ~0.03.
    assert rewards[0] < 0.2, rewards
    assert sum(rewards[-4:]) / 4 > 0.8, rewards


def test_lora_on_a_builtin_base_saves_an_adapter_groupwise_can_load(tmp_path, monkeypatch):
    import json

    import huggingface_hub

    from groupwise.cli import main

    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path, max_steps=1))
    trainer.train()
    run = tmp_path / "run"
    for folder in (run, run / "checkpoint-1") if (run / "checkpoint-1").exists() else (run,):
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "tiny-random", folder

    def no_hub(*args, **kwargs):
        raise AssertionError(f"the hub was asked for {args} {kwargs}")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    monkeypatch.setattr("transformers.utils.hub.hf_hub_download", no_hub, raising=False)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        loaded, _ = load_model_and_tokenizer(str(run), None, seed=0)
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
    argv = ["eval", "--model", str(run), "--num_eval_prompts", "2", "--max_completion_length",
            "4", "--output_dir", str(tmp_path / "eval")]  # fmt: skip
    assert main(argv) == 0
    assert (tmp_path / "eval" / "eval.json").is_file()


def test_an_adapter_without_a_base_is_a_clear_error(tmp_path):
    from groupwise.errors import ModelLoadError

    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": null}')
    with pytest.raises(ModelLoadError, match="names no base model"):
        load_model_and_tokenizer(str(tmp_path))
