"""TRL GRPO options that change training: the loss variants luspo, sapo and vespo, cispo's
default cap, two-sided clipping (delta), top_entropy_quantile, the TR-DPO reference sync, the
sampling options, and the refusal of the ones groupwise does not implement. Expected values are
worked by hand from TRL's definitions (trl/trainer/grpo_trainer.py, ``_compute_loss``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import TargetToken
from conftest import tiny_config as _config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.algo.advantages import batch_normalize, normalize_then_sum
from groupwise.algo.grpo import high_entropy_mask, off_policy_sequence_mask, policy_loss
from groupwise.algo.variants import BatchCounts, MicroBatch, vespo_weights
from groupwise.errors import ConfigError
from groupwise.policy.loss import GRPOLoss
from groupwise.policy.weights import mix_weights

ROWS = [{"prompt": f"Say something number {i}"} for i in range(8)]


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ----------------------------------------------------------------------------------------------
# loss variants


def test_luspo_weighs_each_sequence_by_its_length():
    # GSPO ratio s_i = exp(mean_t(logp - old)) = 1 on-policy; the clipped term is -A_i per token.
    # LUSPO: (1/B) sum_i L_i (-A_i) with L = [3, 1], A = [1, -1]: (-3 + 1) / 2 = -1.
    # d/dlogp_it = -A_i / B (L_i times the 1/L_i of the mean inside s_i): -0.5 on the first
    # sequence, +0.5 on the second's one token. grpo (sequence mean) gives -A_i / (B L_i).
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, float("nan"), 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    loss, _ = policy_loss(logp, None, None, adv, mask, loss_type="luspo",
                          importance_sampling_level="sequence")  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -0.5, -0.5], [0.5, 0.0, 0.0]]))
    grpo_logp = logp.detach().clone().requires_grad_(True)
    grpo, _ = policy_loss(grpo_logp, None, None, adv, mask, loss_type="grpo",
                          importance_sampling_level="sequence")  # fmt: skip
    grpo.backward()
    assert grpo.item() == pytest.approx(0.0)
    assert grpo_logp.grad[0, 0].item() == pytest.approx(-1 / 6)


def test_sapo_soft_gate_by_hand():
    # rho = [e^0.5, 1], A = 2 > 0: tau = sapo_temperature_pos = 1. Per token
    # -(4 / tau) sigmoid(tau (rho - 1)) A = -8 sigmoid(rho - 1); sequence mean over 2 tokens.
    # d/dlogp = -4 A sigmoid'(rho - 1) rho / L (the gate's slope is 1/4 at rho = 1: REINFORCE).
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0]])
    mask = torch.ones(1, 2)
    loss, metrics = policy_loss(logp, old, None, torch.tensor([2.0]), mask, loss_type="sapo",
                                variant_options={"temperature_pos": 1.0,
                                                 "temperature_neg": 1.05})  # fmt: skip
    loss.backward()
    rho = math.exp(0.5)
    s = _sigmoid(rho - 1)
    assert loss.item() == pytest.approx((-8 * s - 8 * 0.5) / 2, rel=1e-6)
    expected = [-4 * 2 * s * (1 - s) * rho / 2, -4 * 2 * 0.25 / 2]
    torch.testing.assert_close(logp.grad, torch.tensor([expected]), rtol=1e-5, atol=1e-6)
    assert metrics["clip_ratio/region_mean"] == 0.0  # nothing is hard-clipped
    # A < 0 uses tau = sapo_temperature_neg = 1.05: -(4 / 1.05) sigmoid(1.05 (rho - 1)) * -1.
    options = {"temperature_pos": 1.0, "temperature_neg": 1.05}
    neg, _ = policy_loss(logp.detach(), old, None, torch.tensor([-1.0]), mask, loss_type="sapo",
                         variant_options=options)  # fmt: skip
    tau = 1.05
    per_token = [4 / tau * _sigmoid(tau * (rho - 1)), 4 / tau * 0.5]
    assert neg.item() == pytest.approx(sum(per_token) / 2, rel=1e-6)


def test_vespo_gamma_weight_by_hand():
    # log w = sum_t (logp - old) = 0.5 over the two real tokens (the NaN one is masked).
    # A = 2 >= 0: k = 2, lambda = 3: log phi = 3 + 2 * 0.5 - 3 e^0.5.
    # A = -1 < 0: k = 3, lambda = 2: log phi = 2 + 3 * 0.5 - 2 e^0.5.
    log_ratio = torch.tensor([[0.5, 0.0, 0.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([[2.0], [-1.0]])
    phi = vespo_weights(log_ratio, mask, adv)
    w = math.exp(0.5)
    expected = [math.exp(3 + 1.0 - 3 * w), math.exp(2 + 1.5 - 2 * w)]
    torch.testing.assert_close(phi.squeeze(1), torch.tensor(expected), rtol=1e-6, atol=0)
    # phi(1) = 1: on-policy the weight is 1 whatever the sign.
    assert vespo_weights(torch.zeros(2, 3), mask, adv).tolist() == [[1.0], [1.0]]
    # The loss: -phi A logp per token, dapo's token mean; the gradient is -phi A / tokens.
    logp = torch.tensor([[-1.0, -2.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.0]])
    loss, _ = policy_loss(logp, old, None, torch.tensor([2.0]), mask[:1], loss_type="vespo",
                          variant_options={"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0,
                                           "lambda_neg": 2.0})  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(-expected[0] * 2 * (-1 - 2) / 2, rel=1e-6)
    torch.testing.assert_close(
        logp.grad, torch.tensor([[-expected[0], -expected[0], 0.0]]), rtol=1e-6, atol=0
    )


def test_vespo_needs_the_token_level_ratio():
    with pytest.raises(ConfigError, match="importance_sampling_level must be token"):
        GRPOConfig(loss_type="vespo", importance_sampling_level="sequence")


def test_cispo_caps_the_weight_at_five_unless_told():
    assert GRPOConfig(loss_type="cispo").effective_epsilon_high == 5.0
    assert GRPOConfig(loss_type="cispo", epsilon_high=2.0).effective_epsilon_high == 2.0
    assert GRPOConfig(loss_type="grpo").effective_epsilon_high == 0.2
    with pytest.raises(ConfigError, match="epsilon_high"):
        GRPOConfig(loss_type="cispo", epsilon_high=0.28)


def test_delta_caps_the_unclipped_ratio():
    # rho = e^1, A = -1, eps = 0.2: -min(rho A, clip(rho) A) = rho = e (gradient -A rho = e).
    # With delta = 2: -min(min(rho, 2) A, 1.2 A) = 2, and the capped ratio has no gradient.
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-1.0]])
    adv, mask = torch.tensor([-1.0]), torch.ones(1, 1)
    plain, _ = policy_loss(logp, old, None, adv, mask)
    plain.backward()
    assert plain.item() == pytest.approx(math.e)
    assert logp.grad.item() == pytest.approx(math.e)
    logp.grad = None
    capped, _ = policy_loss(logp, old, None, adv, mask, variant_options={"delta": 2.0})
    capped.backward()
    assert capped.item() == pytest.approx(2.0)
    assert logp.grad.item() == 0.0
    # Positive advantages: the clip binds first (1.2 < delta), delta changes nothing.
    pos, _ = policy_loss(logp.detach(), old, None, -adv, mask, variant_options={"delta": 2.0})
    assert pos.item() == pytest.approx(-1.2)


def test_delta_is_refused_where_there_is_no_clipped_ratio():
    with pytest.raises(ConfigError, match="delta"):
        GRPOConfig(loss_type="cispo", delta=2.0)
    with pytest.raises(ConfigError, match="delta must be > 1"):
        GRPOConfig(delta=0.5)


# ----------------------------------------------------------------------------------------------
# top_entropy_quantile


def test_high_entropy_mask_by_hand():
    # The six completion tokens' entropies sorted: 0.1 0.2 0.3 0.5 0.7 0.9. The 0.5 quantile
    # (linear interpolation at position 2.5) is 0.4: tokens 0.5, 0.9 and 0.7 are kept.
    entropies = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    kept = high_entropy_mask(entropies, mask, 0.5)
    assert kept.tolist() == [[False, True, True, False], [True, False, False, False]]
    # rho = 0: only the highest; rho = 1: every completion token (never the padding).
    assert high_entropy_mask(entropies, mask, 0.0).sum().item() == 1
    assert high_entropy_mask(entropies, mask, 1.0).tolist() == mask.bool().tolist()


def test_top_entropy_quantile_trains_only_on_the_kept_tokens():
    # On-policy grpo: per token -A; with only token 1 of 2 kept, the sequence mean is -A / 2
    # (the normaliser stays L = 2) and only token 1 gets a gradient.
    args = GRPOConfig(top_entropy_quantile=0.5, beta=0.0)
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mb = MicroBatch(
        rows=torch.tensor([0]), mask=torch.ones(1, 2), advantages=torch.tensor([1.0]),
        old_logprobs=None, ref_logprobs=None, correction=None, row_weights=None,
        counts=BatchCounts(rows=1, tokens=torch.tensor(2.0), micro_batches=1),
        entropy=torch.tensor([[0.1, 0.9]]),
    )  # fmt: skip
    loss = GRPOLoss.from_config(args)(logp, mb).loss
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5]]))


def test_top_entropy_quantile_trains(tmp_path):
    args = _config(tmp_path / "kept", top_entropy_quantile=0.2, max_steps=1)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert changed
    # The same step on every token (quantile 1.0, the default: same seed, same rollouts) moves
    # the weights elsewhere: the quantile reached the trainer's update.
    args = _config(tmp_path / "every", top_entropy_quantile=1.0, max_steps=1)
    every = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    every.train()
    params = dict(every.model.named_parameters())
    assert any(not torch.equal(params[n], p) for n, p in trainer.model.named_parameters())


# ----------------------------------------------------------------------------------------------
# sync_ref_model (TR-DPO)


def test_mix_weights_by_hand():
    ref, policy = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([[1.0, -2.0]]))
        policy.weight.copy_(torch.tensor([[3.0, 2.0]]))
    mix_weights(ref, policy, 0.25)  # 0.25 * policy + 0.75 * ref
    assert ref.weight.tolist() == [[1.5, -1.0]]
    assert policy.weight.tolist() == [[3.0, 2.0]]


def test_sync_ref_model_mixes_the_policy_in_every_n_optimizer_steps(tmp_path, monkeypatch):
    args = _config(tmp_path, beta=0.1, sync_ref_model=True, ref_model_sync_steps=2,
                   ref_model_mixup_alpha=0.5, max_steps=3)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    name, initial = next(iter(trainer.model.named_parameters()))
    initial = initial.detach().clone()
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    policy_step = type(trainer.policy.network).step

    def step(self):  # record policy and reference right after each optimizer step
        policy_step(self)
        seen.append((trainer.model.get_parameter(name).detach().clone(),
                     trainer.ref_model.get_parameter(name).detach().clone()))  # fmt: skip

    monkeypatch.setattr(type(trainer.policy.network), "step", step)
    trainer.train()
    ref = trainer.ref_model.get_parameter(name).detach()
    # Steps 1 and 3 leave the reference alone; step 2 sets it to (policy_2 + initial) / 2.
    assert len(seen) == 3
    torch.testing.assert_close(ref, 0.5 * seen[1][0] + 0.5 * initial)
    assert not torch.equal(ref, initial)


def test_sync_ref_model_needs_a_reference():
    with pytest.raises(ConfigError, match="sync_ref_model"):
        GRPOConfig(beta=0.0, sync_ref_model=True)
    with pytest.raises(ConfigError, match="resume_from_checkpoint"):
        GRPOConfig(beta=0.1, sync_ref_model=True, resume_from_checkpoint="auto", output_dir="x")


# ----------------------------------------------------------------------------------------------
# sampling and template options; refusals


def test_sampling_options_reach_the_engine(tmp_path):
    args = _config(tmp_path, min_p=0.05, repetition_penalty=1.3, top_k=5)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    params = trainer.sampling
    assert (params.min_p, params.repetition_penalty, params.top_k) == (0.05, 1.3, 5)


def test_generation_kwargs_set_the_sampling_options_and_refuse_the_rest():
    args = GRPOConfig(top_k=10, generation_kwargs={"do_sample": True, "top_k": 50, "min_p": 0.1})
    assert (args.top_k, args.min_p) == (50, 0.1)  # generation_kwargs win, as in TRL
    with pytest.raises(ConfigError, match=r"generation_kwargs\['do_sample'\]"):
        GRPOConfig(generation_kwargs={"do_sample": False})


def test_generation_kwargs_keep_the_generate_options_and_refuse_the_rest():
    # TRL's test_train_with_generation_kwargs: the sampling keys set the options, the
    # GenerationConfig options beyond them stay for generate().
    kwargs = {"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}
    args = GRPOConfig(generation_kwargs=kwargs)
    assert args.top_k == 50
    assert args.generation_kwargs == {"num_beams": 2, "length_penalty": -0.1}
    assert GRPOConfig(generation_kwargs={"top_p": 0.9}).generation_kwargs is None
    # A copy (dataclasses.replace passes the stored generation_kwargs back) keeps them.
    assert dataclasses.replace(args).generation_kwargs == args.generation_kwargs
    with pytest.raises(ConfigError, match=r"generation_kwargs\['beams'\].*GenerationConfig"):
        GRPOConfig(generation_kwargs={"beams": 2})
    with pytest.raises(ConfigError, match=r"generation_kwargs\['num_return_sequences'\]"):
        GRPOConfig(generation_kwargs={"num_return_sequences": 4})
    with pytest.raises(ConfigError, match="generation_engine: hf.*'static'"):
        GRPOConfig(generation_kwargs={"num_beams": 2}, generation_engine="static")
    with pytest.raises(ConfigError, match="num_beams.*tools or an environment"):
        GRPOConfig(generation_kwargs={"num_beams": 2}, tools=["calculator"])
    with pytest.raises(ConfigError, match="num_beams.*generation_dtype: bfloat16"):
        GRPOConfig(generation_kwargs={"num_beams": 2}, generation_dtype="bfloat16")
    from_yaml = GRPOConfig.from_dict({"generation_kwargs": "{num_beams: 2, top_p: 0.5}"})
    assert (from_yaml.generation_kwargs, from_yaml.top_p) == ({"num_beams": 2}, 0.5)


def test_beam_search_trains(tmp_path):
    beams = {"num_beams": 2, "length_penalty": -0.1}
    args = _config(tmp_path, max_steps=1, generation_kwargs=beams)
    trainer = GRPOTrainer("tiny-random", TargetToken(), [{"prompt": "Say a word"}] * 8, args=args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert math.isfinite(trainer.log_history[-1]["loss"])
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_repetition_penalty_is_refused_with_tools(tmp_path):
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    args = _config(tmp_path, repetition_penalty=1.2)
    with pytest.raises(ConfigError, match="repetition_penalty"):
        GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args, tools=[add])


@pytest.mark.parametrize(
    "option, value",
    [
        ("neftune_noise_alpha", 5.0),
        ("disable_dropout", True),
        ("lr_scheduler_kwargs", {"min_lr": 1e-7}),
    ],
)
def test_trl_options_that_change_training_are_refused_by_name(option, value):
    with pytest.raises(ConfigError, match=rf"^{option}=.*changes training"):
        GRPOConfig(**{option: value})


def test_trl_options_at_their_off_value_are_accepted_and_reported():
    with pytest.warns(UserWarning, match="load_best_model_at_end=False"):
        args = GRPOConfig(load_best_model_at_end=False, neftune_noise_alpha=None)
    assert set(args.trl_ignored) == {"load_best_model_at_end", "neftune_noise_alpha"}


def test_vllm_importance_sampling_options_are_rollout_correction():
    args = GRPOConfig(
        vllm_importance_sampling_correction=False,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=2.0,
        vllm_importance_sampling_clip_min=0.5,
    )
    assert (args.rollout_correction, args.rollout_correction_mode) == (False, "token_truncate")
    assert (args.rollout_correction_clip_min, args.rollout_correction_clip_max) == (0.5, 2.0)


def test_chat_template_kwargs_from_yaml_text():
    args = GRPOConfig.from_dict({"chat_template_kwargs": "{enable_thinking: false}"})
    assert args.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ConfigError, match="chat_template_kwargs"):
        GRPOConfig.from_dict({"chat_template_kwargs": "[1, 2]"})


THINKING_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>"
    "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}{% endif %}"
)


def _thinking_tokenizer():
    import copy

    from groupwise.runtime.models import smollm2_tokenizer

    tok = copy.deepcopy(smollm2_tokenizer())
    tok.chat_template = THINKING_TEMPLATE
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@pytest.mark.parametrize("with_tools", [False, True])
def test_chat_template_kwargs_reach_the_prompts(tmp_path, with_tools):
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    rows = [{"prompt": [{"role": "user", "content": f"Hi {i}"}]} for i in range(8)]
    tools = [add] if with_tools else None
    args = _config(tmp_path, chat_template_kwargs={"enable_thinking": False})
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=args,
                          processing_class=_thinking_tokenizer(), tools=tools)  # fmt: skip
    assert trainer.engine.prompt_text(rows[0]["prompt"]).endswith("<assistant><nothink>")
    plain = GRPOTrainer("tiny-random", TargetToken(), rows, args=_config(tmp_path),
                        processing_class=_thinking_tokenizer(), tools=tools)  # fmt: skip
    render = getattr(plain.engine, "prompt_text", None)
    assert render is None or render(rows[0]["prompt"]).endswith("<assistant>")


def test_trl_bf16_on_cpu_trains_fp32_weights_under_bf16_autocast(tmp_path):
    """TRL's bf16=True is mixed precision: a bf16 checkpoint is trained as fp32 master weights,
    the forwards run under bf16 autocast (on a CPU too), never as pure bf16 weights."""
    from groupwise.runtime.models import smollm2_tokenizer, tiny_random_model

    model = tiny_random_model(seed=0).to(torch.bfloat16)
    tokenizer = smollm2_tokenizer()
    args = _config(tmp_path, bf16=True, use_cpu=True, max_steps=1)
    trainer = GRPOTrainer(model, TargetToken(), ROWS, args=args, processing_class=tokenizer)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert trainer.precision.autocast and trainer.precision.weights == torch.float32
    trainer.train()
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}


def test_shuffle_dataset_false_draws_the_prompts_in_dataset_order(tmp_path):
    from groupwise.curriculum.base import PromptSampler

    assert PromptSampler(5, seed=0, shuffle=False).take(7) == [0, 1, 2, 3, 4, 0, 1]
    assert PromptSampler(5, seed=0).take(5) != [0, 1, 2, 3, 4]  # shuffled by default
    rows = [{"prompt": f"Say {i}"} for i in range(8)]
    args = _config(tmp_path, shuffle_dataset=False)  # 2 prompts per step
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=args)
    assert [r["prompt"] for r in trainer.prompts.next().rows] == ["Say 0", "Say 1"]
    assert GRPOConfig(shuffle_dataset=None).shuffle_dataset is True  # TRL's None: the default


# ----------------------------------------------------------------------------------------------
# use_bias_correction_kl


def test_bias_corrected_kl_by_hand():
    # One token, A = 0 (only the KL term), beta = 1: logp = -1, old = -1.5, ref = -1.2.
    # rho = e^0.5; k3 = e^-0.2 + 0.2 - 1 = 0.0187308. Plain: loss k3, d/dlogp = 1 - e^-0.2.
    # Corrected (TRL): loss rho * k3, d/dlogp = rho * (1 - e^-0.2) + rho * k3 = rho * 0.2.
    rho, k3 = math.exp(0.5), math.exp(-0.2) + 0.2 - 1
    for corrected, value, grad in ((False, k3, 1 - math.exp(-0.2)), (True, rho * k3, rho * 0.2)):
        logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
        loss, metrics = policy_loss(
            logp, torch.tensor([[-1.5]], dtype=torch.float64),
            torch.tensor([[-1.2]], dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
            torch.ones(1, 1), beta=1.0, kl_ratio_correction=corrected,
        )  # fmt: skip
        loss.backward()
        assert loss.item() == pytest.approx(value, rel=1e-9)
        assert logp.grad.item() == pytest.approx(grad, rel=1e-9)
        assert metrics["kl"].item() == pytest.approx(k3, rel=1e-9)  # the logged KL is k3


def test_bias_corrected_kl_trains(tmp_path):
    args = _config(tmp_path, beta=0.1, use_bias_correction_kl=True, max_steps=1)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


# ----------------------------------------------------------------------------------------------
# multi_objective_aggregation


def _bessel(values):
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_normalize_then_sum_by_hand():
    # Two functions, weights [1, 0.5]; groups {0, 1, 2} and {3, 4}; function 2 returned None on
    # row 4. Group 0: f1 = [1, 0, 0] (mean 1/3, std sqrt(1/3)), f2 = [0, 2, 4] (mean 2, std 2).
    # Group 1: f1 constant, f2 one valid value: both normalise to 0.
    nan = float("nan")
    per_func = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 4.0], [1.0, 0.0], [1.0, nan]])
    group_ids = torch.tensor([0, 0, 0, 1, 1])
    weights = torch.tensor([1.0, 0.5])
    eps = 1e-4
    m1, s1 = _bessel([1.0, 0.0, 0.0])
    m2, s2 = _bessel([0.0, 2.0, 4.0])
    expected = [
        (f1 - m1) / (s1 + eps) + 0.5 * (f2 - m2) / (s2 + eps)
        for f1, f2 in ((1.0, 0.0), (0.0, 2.0), (0.0, 4.0))
    ] + [0.0, 0.0]
    summed = normalize_then_sum(per_func, group_ids, weights)
    torch.testing.assert_close(summed, torch.tensor(expected))
    mean, std = _bessel(expected)
    advantages = batch_normalize(summed)
    by_hand = [(v - mean) / (std + eps) for v in expected]
    torch.testing.assert_close(advantages, torch.tensor(by_hand))
    # A row where every function returned None: NaN sum, advantage 0.
    per_func[4] = nan
    assert math.isnan(normalize_then_sum(per_func, group_ids, weights)[4].item())
    assert batch_normalize(normalize_then_sum(per_func, group_ids, weights))[4].item() == 0.0


def test_normalize_then_sum_trains_and_logs_the_weighted_reward(tmp_path):
    # TRL's check: with weights [0.7, 0.3] and constant rewards 1 and 0, the logged reward is
    # the weighted sum 0.7 (the aggregation changes the advantages, not the logged reward).
    def one(completions, **kwargs):
        return [1.0] * len(completions)

    def zero(completions, **kwargs):
        return [0.0] * len(completions)

    args = _config(tmp_path, multi_objective_aggregation="normalize_then_sum",
                   reward_weights=[0.7, 0.3], max_steps=1)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", [one, zero], ROWS, args=args)
    trainer.train()
    assert trainer.log_history[-1]["reward"] == pytest.approx(0.7)
    with pytest.raises(ConfigError, match="multi_objective_aggregation"):
        GRPOConfig(multi_objective_aggregation="sum")


# ----------------------------------------------------------------------------------------------
# off_policy_mask_threshold (DeepSeek-V3.2's off-policy sequence mask)


def test_off_policy_sequence_mask_by_hand():
    # Mean log(pi_sampler / pi_theta) over each row's unmasked tokens, delta = 1:
    # row 0: A > 0, KL 2 -> keep; row 1: A < 0, KL 0.5 -> keep; row 2: A < 0, KL 2 -> drop;
    # row 3: A < 0, tokens 2 (KL 2, 2) and padding (huge values ignored) -> drop;
    # row 4: A < 0, one NaN token (counts 0) and one 1.5: mean 0.75 -> keep.
    nan = float("nan")
    sampling = torch.zeros(5, 3)
    logps = torch.tensor([[-2.0] * 3, [-0.5] * 3, [-2.0] * 3, [-2.0, -2.0, 1e4], [nan, -1.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0]])
    advantages = torch.tensor([1.0, -1.0, -1.0, -1.0, -1.0])
    keep = off_policy_sequence_mask(advantages, logps, sampling, mask, 1.0)
    assert keep.tolist() == [True, True, False, False, True]


def test_trl_helper_methods_on_the_trainer():
    mask = torch.ones(3, 4)
    logps = torch.zeros(3, 4)
    logps[0], logps[1], logps[2] = -2.0, -0.5, -2.0
    out = GRPOTrainer.get_off_policy_mask(
        torch.tensor([[1.0], [-1.0], [-1.0]]), logps, torch.zeros(3, 4), mask, 1.0
    )
    torch.testing.assert_close(out, torch.tensor([[1.0], [1.0], [0.0]]))
    # threshold is the quantile (1 - top_entropy_quantile): 0.8 keeps the top 20% of the 10
    # unmasked tokens, the entropies 0.9 and 1.0 (1.1 and 1.2 are padding).
    entropies = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
    emask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    kept = GRPOTrainer.get_high_entropy_mask(None, entropies, emask, 0.8)
    assert kept.nonzero().tolist() == [[1, 2], [1, 3]]


def test_the_off_policy_mask_drops_a_stale_negative_sequence_from_the_policy_term():
    # pi_old = 0 per token; row 0 (A = -1) has moved to logp -2 (mean KL 2 > 0.5): dropped, no
    # gradient; row 1 (A = +1) at the same distance: kept.
    args = GRPOConfig(beta=0.0, off_policy_mask_threshold=0.5)
    logp = torch.full((2, 2), -2.0, requires_grad=True)
    mb = MicroBatch(
        rows=torch.tensor([0, 1]), mask=torch.ones(2, 2), advantages=torch.tensor([-1.0, 1.0]),
        old_logprobs=torch.zeros(2, 2), ref_logprobs=None, correction=None, row_weights=None,
        counts=BatchCounts(rows=2, tokens=torch.tensor(4.0), micro_batches=1),
    )  # fmt: skip
    GRPOLoss.from_config(args)(logp, mb).loss.backward()
    assert logp.grad[0].abs().sum().item() == 0.0
    assert logp.grad[1].abs().sum().item() > 0.0


def test_off_policy_mask_trains_and_is_checked(tmp_path):
    args = _config(tmp_path, off_policy_mask_threshold=0.5, num_iterations=2, max_steps=1)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    with pytest.raises(ConfigError, match="off_policy_mask_threshold"):
        GRPOConfig(off_policy_mask_threshold=-1.0)
