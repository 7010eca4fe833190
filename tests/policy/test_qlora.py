"""QLoRA (a frozen 4-bit base under the LoRA adapter) and bitsandbytes' 8-bit AdamW in the
policy: the reference is the 4-bit base with the adapter disabled (no copy), the adapter's
gradients are those of the dequantised model, the runs learn, and resume is exact."""

import copy

import bitsandbytes as bnb
import bitsandbytes.functional as bnbf
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from conftest import TargetToken, first_token_parity, tiny_config
from groupwise import GRPOTrainer
from groupwise.runtime.models import tiny_random_model
from groupwise.runtime.quantization import is_4bit, keep_trainable_layout, quantize_4bit

ROWS = [{"prompt": f"Say something number {i}", "answer": str(i)} for i in range(16)]
CPU = torch.device("cpu")


def _reward(completions, completion_ids, **kwargs):
    # Fraction of token ids below 64: an easy, dense signal for the random model.
    return [sum(t < 64 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def _qlora(tmp_path, **overrides):
    qlora = dict(use_peft=True, load_in_4bit=True, use_bnb_nested_quant=True, lora_r=4,
                 lora_alpha=8, lora_dropout=0.0, max_steps=3, learning_rate=5e-3,
                 beta=0.04)  # fmt: skip
    return tiny_config(tmp_path, **{**qlora, **overrides})


def _base_4bit():
    model = quantize_4bit(tiny_random_model(), "nf4", True, torch.float32, CPU)
    return keep_trainable_layout(model)  # as build_model leaves it


def test_qlora_reference_is_the_4bit_base_with_the_adapter_disabled(tmp_path):
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=_qlora(tmp_path))
    assert trainer.ref_model is None  # no second copy of the base
    assert is_4bit(trainer.model)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    for _ in range(3):
        trainer.train_step()
    base = _base_4bit()
    policy = trainer.policy
    rollout = trainer.engine.generate(torch.tensor([[5, 9, 3, 7]]), [2])
    rows = torch.arange(rollout.completion_ids.shape[0])
    with policy.reference_weights():
        reference = policy.reference_logprobs(rollout, rows)
    with torch.no_grad():
        ids = torch.cat([rollout.prompt_ids[rollout.group_ids], rollout.completion_ids], 1)
        logits = base(input_ids=ids).logits[:, rollout.prompt_ids.shape[1] - 1 : -1]
        expected = torch.log_softmax(logits / policy.options.generation.temperature, -1)
        expected = expected.gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
        policy_logps = policy.logprobs(rollout, rows)[0]
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(reference[mask], expected[mask], rtol=1e-5, atol=1e-5)
    assert (policy_logps[mask] - reference[mask]).abs().max() > 1e-4  # the adapter learned
    # The 4-bit base never moves: its packed weights are the fresh quantisation's, bit for bit.
    fresh = dict(base.named_modules())
    for name, module in trainer.model.get_base_model().named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            original = fresh[name.replace(".base_layer", "")]
            assert torch.equal(module.weight.data, original.weight.data), name


def test_adapter_gradients_on_4bit_equal_those_on_the_dequantized_model():
    # The reference implementation: the same LoRA on a plain fp32 model holding the
    # dequantised weights (bitsandbytes.functional.dequantize_4bit). An eval-mode forward
    # first, as generation does before every update.
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                        task_type="CAUSAL_LM", init_lora_weights=False)  # fmt: skip
    four = keep_trainable_layout(_base_4bit())
    plain = tiny_random_model()
    for name, module in four.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            weight = bnbf.dequantize_4bit(module.weight.data, module.weight.quant_state)
            plain.get_submodule(name).weight.data = weight
    torch.manual_seed(1)
    four = get_peft_model(four, config)
    torch.manual_seed(1)
    plain = get_peft_model(plain, copy.deepcopy(config))
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 40, 41], [8, 1, 6, 6, 30, 31, 32, 2]])
    grads = []
    for model in (four, plain):
        model.eval()
        with torch.no_grad():
            model(input_ids=ids[:, :1])
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 2 * 2 * 7
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-6, msg=name)
    first = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert grads[0][first].abs().sum() > 0  # layer 0's adapter gets the gradient back


def test_qlora_learns(tmp_path):
    # test_lora_learns' settings on the 4-bit base.
    args = _qlora(tmp_path, max_steps=12, learning_rate=1e-2, beta=0.0, temperature=0.1,
                  lora_r=8, num_generations=8, per_device_train_batch_size=16,
                  max_completion_length=8)  # fmt: skip
    rows = [{"prompt": "Say something"}] * 4  # one context: the target is always reachable
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=args)
    trainer.train()
    rewards = [row["reward"] for row in trainer.log_history]
    # Measured: 0.06 -> 0.99 (mean of the last four steps); test_lora_learns' bounds.
    assert rewards[0] < 0.2, rewards
    assert sum(rewards[-4:]) / 4 > 0.8, rewards


def test_qlora_saves_the_adapter_which_reloads_on_the_4bit_base(tmp_path):
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=_qlora(tmp_path))
    trainer.train()
    run = tmp_path / "run"
    assert (run / "adapter_model.safetensors").is_file()
    assert not (run / "model.safetensors").exists()  # the adapter only, as TRL saves
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        reloaded = PeftModel.from_pretrained(_base_4bit(), run)(input_ids=ids).logits
    torch.testing.assert_close(reloaded, expected, rtol=1e-5, atol=1e-5)


def test_adamw8bit_full_fine_tune_learns(tmp_path):
    # test_grpo_learns_target_token's run with bitsandbytes' 8-bit AdamW states.
    args = tiny_config(tmp_path, optim="adamw_8bit", max_steps=12, learning_rate=1e-2,
                       num_generations=8, per_device_train_batch_size=16,
                       max_completion_length=8, temperature=0.1)  # fmt: skip
    rows = [{"prompt": "Say something"}] * 4
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=args)
    assert type(trainer.policy.network.optimizer).__name__ == "AdamW8bit"
    trainer.train()
    states = [s["state1"] for s in trainer.policy.network.optimizer.state.values() if "state1" in s]
    assert any(s.dtype == torch.uint8 for s in states)  # 8-bit states were used
    rewards = [row["reward"] for row in trainer.log_history]
    assert rewards[0] < 0.2, rewards
    assert sum(rewards[-4:]) / 4 > 0.8, rewards


def test_adamw8bit_resume_is_exact(tmp_path):
    def args(folder, **more):
        return tiny_config(tmp_path / folder, optim="adamw_8bit", learning_rate=5e-3, **more)

    full = GRPOTrainer("tiny-random", _reward, ROWS, args=args("a", max_steps=4))
    full.train()
    GRPOTrainer("tiny-random", _reward, ROWS, args=args("b", max_steps=2, save_steps=2)).train()
    rest = GRPOTrainer(
        "tiny-random", _reward, ROWS,
        args=args("b", max_steps=4, save_steps=2, resume_from_checkpoint="auto"),
    )  # fmt: skip
    rest.train()
    assert type(rest.policy.network.optimizer).__name__ == "AdamW8bit"
    for (name, p), q in zip(full.model.named_parameters(), rest.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_qlora_with_gradient_checkpointing_gives_the_same_adapter_gradients(tmp_path):
    # prepare_for_kbit_training's input grads: with checkpointed layers whose inputs need no
    # grad (the frozen embeddings), the adapters inside must still get their gradients.
    grads = []
    for checkpointing in (False, True):
        args = _qlora(tmp_path / str(checkpointing), max_steps=1, beta=0.0, max_grad_norm=1e9,
                      gradient_checkpointing=checkpointing, learning_rate=0.0)  # fmt: skip
        trainer = GRPOTrainer("tiny-random", first_token_parity, ROWS, args=args)
        trainer.train()
        grads.append({n: p.grad for n, p in trainer.model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    first = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    assert grads[1][first] is not None and grads[1][first].abs().sum() > 0
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-7, msg=name)
