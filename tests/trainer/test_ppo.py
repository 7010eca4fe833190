"""PPO baseline: hand-computed math (token rewards, GAE, whitening, value loss, surrogate), the
critic's alignment and gradients, equivalence to GRPO in the degenerate case, checkpoint hooks,
saving, and an end-to-end run on tiny-random that learns."""

import copy
import io
import math

import pytest
import torch

from conftest import TargetToken, tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.algo.ppo import (
    explained_variance,
    gae_advantages,
    masked_whiten,
    ppo_policy_loss,
    token_rewards,
    value_loss,
)
from groupwise.data.prompts import tokenize_prompts
from groupwise.policy.critic import ValueModel, completion_values
from groupwise.rollout import generate
from groupwise.runtime.models import tiny_random_model
from groupwise.trainer.ppo import PPOTrainer

PROMPT_ROWS = [{"prompt": "Say something"}] * 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny matrices: one thread is as fast and does not fight other jobs for the cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(tmp_path, **overrides) -> GRPOConfig:
    ppo = {"algorithm": "ppo", "max_steps": 1, "learning_rate": 1e-3}
    return tiny_config(tmp_path, **{**ppo, **overrides})


def even_tokens(prompts, completions, completion_ids, **kwargs):
    """A reward that varies from completion to completion: the fraction of even token ids."""
    return [sum(t % 2 == 0 for t in ids) / len(ids) for ids in completion_ids]


def even_tokens_or_none(prompts, completions, completion_ids, **kwargs):
    """even_tokens, but None ("not applicable") for a third of the completions or so: those
    rows leave the update, so micro-batches hold different numbers of tokens."""
    scores = even_tokens(prompts, completions, completion_ids)
    return [None if ids[0] % 3 == 0 else r for ids, r in zip(completion_ids, scores, strict=True)]


# ----------------------------------------------------------------------------------------------
# Pure functions, by hand.


def test_token_rewards_by_hand():
    seq_rewards = torch.tensor([1.0, 2.0, 5.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -9.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-0.5, -2.0, -1.0], [-9.0, -9.0, -9.0]])
    # r_t = -0.1 (old - ref) + R at the last unmasked token:
    # row 0: -0.1 * [0.5, 0, -1] + [0, 0, 1] = [-0.05, 0, 1.1]
    # row 1: -0.1 * [0, 1, (masked)] + [0, 2, 0] = [0, 1.9, 0]
    # row 2: no unmasked token, so no KL term and nowhere to put R: all 0.
    expected = torch.tensor([[-0.05, 0.0, 1.1], [0.0, 1.9, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(token_rewards(seq_rewards, old, ref, mask, beta=0.1), expected)
    # beta = 0: no log-probs needed, only the sequence reward at the last token.
    expected0 = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(token_rewards(seq_rewards, None, None, mask, beta=0.0), expected0)
    with pytest.raises(ValueError, match="beta > 0 needs"):
        token_rewards(seq_rewards, None, None, mask, beta=0.1)


def test_gae_by_hand_two_masked_rows():
    # gamma = 0.9, lam = 0.8, so gamma * lam = 0.72. Row 1's last position is padding: its
    # reward and value (99) must be ignored, and V after its last token is 0.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.1, 2.0, 99.0]])
    values = torch.tensor([[0.5, 0.4, 0.6], [0.2, 1.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # Row 0:
    #   t=2: delta = 1 + 0.9*0 - 0.6 = 0.4                  A2 = 0.4
    #   t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14               A1 = 0.14 + 0.72*0.4 = 0.428
    #   t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14              A0 = -0.14 + 0.72*0.428 = 0.16816
    # Row 1:
    #   t=1: delta = 2 + 0.9*0 - 1.0 = 1.0                  A1 = 1.0
    #   t=0: delta = 0.1 + 0.9*1.0 - 0.2 = 0.8              A0 = 0.8 + 0.72*1.0 = 1.52
    # returns = A + V: row 0 [0.66816, 0.828, 1.0], row 1 [1.72, 2.0, (masked) 0].
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(advantages, torch.tensor([[0.16816, 0.428, 0.4], [1.52, 1.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.66816, 0.828, 1.0], [1.72, 2.0, 0.0]]))


def test_gae_with_gamma_lam_one_is_returns_to_go_minus_value():
    torch.manual_seed(0)
    rewards, values = torch.randn(4, 7), torch.randn(4, 7)
    lengths = torch.tensor([7, 5, 1, 3])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
    masked_rewards = rewards * mask
    # Returns-to-go G_t = sum_{s >= t} r_s (within the completion): a reversed cumulative sum.
    to_go = masked_rewards.flip(1).cumsum(1).flip(1)
    advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(advantages, (to_go - values) * mask)
    torch.testing.assert_close(returns, to_go * mask)


def test_masked_whiten_uses_unmasked_entries_only():
    torch.manual_seed(0)
    x = torch.randn(3, 5) * 3 + 7
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    x_padded = torch.where(mask.bool(), x, 1e6)  # huge padding must not leak into the stats
    out = masked_whiten(x_padded, mask)
    kept = out[mask.bool()]
    assert kept.mean().abs() < 1e-6
    assert kept.var() == pytest.approx(1.0, abs=1e-5)  # unbiased variance, as TRL/verl
    assert torch.all(out[~mask.bool()] == 0)
    raw = x[mask.bool()]
    torch.testing.assert_close(kept, (raw - raw.mean()) / raw.std())


def test_value_loss_clipping_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.5, 50.0]], requires_grad=True)  # last entry is padding
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.4, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # eps_v = 0.2:
    # t0: V_clip = 0.5 + clip(0.5) = 0.7; (1-2)^2 = 1, (0.7-2)^2 = 1.69 -> 1.69 (clipped wins)
    # t1: V_clip = 0.5 + clip(-0.5) = 0.3; (0-0.4)^2 = 0.16, (0.3-0.4)^2 = 0.01 -> 0.16
    # t2: V_clip = V = 0.5; both 0.25 -> 0.25 (not clipped)
    # L = 0.5 * (1.69 + 0.16 + 0.25) / 3 = 0.35, clip_frac = 1/3
    loss, clip_frac = value_loss(values, old, returns, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.35)
    assert clip_frac.item() == pytest.approx(1 / 3)
    loss.backward()
    # dL/dV: t0 the clipped branch is flat in V -> 0; t1 (V - R) / 3; t2 (V - R) / 3; pad 0.
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.4 / 3, 0.5 / 3, 0.0]]))


def test_ppo_policy_loss_token_level_advantages_by_hand():
    logps = torch.log(torch.tensor([[1.5, 0.5, 1.0], [1.0, 1.0, 1.0]])).requires_grad_(True)
    old = torch.zeros(2, 3)
    advantages = torch.tensor([[1.0, -1.0, 2.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    # t0: rho 1.5, A 1:  -min(1.5, 1.2) = -1.2  (clipped high)
    # t1: rho 0.5, A -1: -min(-0.5, -0.8) = 0.8 (clipped low)
    # t2: rho 1.0, A 2:  -2.0                   (unclipped; d/dlogp = -rho A / 3 = -2/3)
    # token mean over the 3 unmasked tokens: (-1.2 + 0.8 - 2) / 3 = -0.8
    loss, metrics = ppo_policy_loss(logps, old, None, advantages, mask, 0.2, 0.2)
    assert loss.item() == pytest.approx(-0.8)
    assert metrics["clip_ratio/high_mean"] == pytest.approx(1 / 3)
    assert metrics["clip_ratio/low_mean"] == pytest.approx(1 / 3)
    assert metrics["clip_ratio/region_mean"] == pytest.approx(2 / 3)
    assert metrics["kl"] == 0.0
    loss.backward()
    expected = torch.tensor([[0.0, 0.0, -2 / 3], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(logps.grad, expected)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4), returns, mask) == pytest.approx(0.0)
    # residuals [0.5, 0, -0.5]: var 0.25 vs var(returns) 1 -> 0.75
    values = torch.tensor([[0.5, 2.0, 3.5, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(0.75)
    assert explained_variance(values, torch.ones(1, 4), mask) == 0.0  # constant returns


# ----------------------------------------------------------------------------------------------
# The critic.


def test_values_align_with_policy_positions():
    # V(s_t) from the padded batch must equal the critic's last value on prompt + o_<t alone.
    model = tiny_random_model(seed=0)
    critic = ValueModel(copy.deepcopy(model.get_decoder()), model.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight)  # a non-zero head, so values depend on the input
    critic.eval()
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    completions = [[20, 21, 22], [30]]
    prompt_ids = torch.tensor([[5, 6, 7, 8, 9], [2, 2, 2, 11, 12]])
    prompt_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
    completion_ids = torch.tensor([[20, 21, 22], [30, 2, 2]])
    completion_mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    with torch.no_grad():
        values = completion_values(critic, prompt_ids, prompt_mask, completion_ids, completion_mask)
        assert values.shape == (2, 3)
        for i in range(2):
            for t in range(len(completions[i])):
                ids = torch.tensor([prompts[i] + completions[i][:t]])
                ones = torch.ones_like(ids)
                positions = torch.arange(ids.shape[1])[None, :]
                alone = critic(ids, ones, positions)[0, -1]
                torch.testing.assert_close(values[i, t], alone, atol=1e-5, rtol=1e-5)


def test_value_loss_reaches_critic_not_policy(tmp_path):
    trainer = PPOTrainer("tiny-random", TargetToken(), PROMPT_ROWS, args=_config(tmp_path))
    policy_params = {id(p) for p in trainer.model.parameters()}
    assert not policy_params & {id(p) for p in trainer.critic.parameters()}  # no shared weights
    # The zero-initialised head gives V = 0 everywhere; make it non-zero to reach the backbone.
    torch.nn.init.normal_(trainer.critic.head.weight, std=0.1)
    ids = tokenize_prompts(["Say something"], trainer.tokenizer, None)
    rollout = generate(trainer.model, trainer.tokenizer, ids, 4, trainer.sampling)
    mask = rollout.completion_mask
    values = trainer.critic_trainable.values(rollout, torch.arange(4))
    loss, _ = value_loss(values, values.detach(), torch.ones_like(values), mask, 0.2)
    loss.backward()
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.critic.head.weight.grad.abs().sum() > 0
    backbone_grads = [p.grad for p in trainer.critic.backbone.parameters()]
    assert all(g is not None for g in backbone_grads)
    assert sum(float(g.abs().sum()) for g in backbone_grads) > 0


def test_train_step_updates_policy_and_critic_separately(tmp_path):
    # Policy learning rate 0, critic learning rate > 0: only the critic (here a separate model,
    # critic_model) moves.
    args = _config(
        tmp_path,
        learning_rate=0.0,
        critic_learning_rate=1e-2,
        beta=0.1,
        num_iterations=2,
        max_steps=2,  # optimizer steps: one generation batch of two passes
        critic_model="tiny-random",
    )
    trainer = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=args)
    assert trainer.critic_optimizer.param_groups[0]["lr"] == 1e-2
    assert trainer.critic.head.weight.dtype == torch.float32
    policy_before = copy.deepcopy(trainer.model.state_dict())
    critic_before = copy.deepcopy(trainer.critic.state_dict())
    trainer.train_step()
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, policy_before[name]), name
    assert not torch.equal(trainer.critic.head.weight, critic_before["head.weight"])
    assert trainer.scheduler.last_epoch == 2 and trainer.critic_scheduler.last_epoch == 2


def test_completions_without_reward_leave_the_update(tmp_path, monkeypatch):
    seen = {}

    def spy(rewards, values, mask, gamma, lam):
        seen["mask"] = mask.clone()
        return gae_advantages(rewards, values, mask, gamma, lam)

    monkeypatch.setattr("groupwise.trainer.ppo.gae_advantages", spy)
    trainer = PPOTrainer("tiny-random", even_tokens_or_none, PROMPT_ROWS, args=_config(tmp_path))
    rewards = []
    scorer_class = type(trainer.scorer)
    original_score = scorer_class.__call__

    def score(self, rows, rollout):
        result = original_score(self, rows, rollout)
        rewards.append(result.rewards)
        return result

    monkeypatch.setattr(scorer_class, "__call__", score)
    trainer.train_step()
    none_rows = torch.isnan(rewards[0])
    assert 0 < int(none_rows.sum()) < len(none_rows)
    assert torch.all(seen["mask"][none_rows] == 0)
    assert torch.all(seen["mask"][~none_rows].sum(1) > 0)


def test_micro_batches_give_same_update_as_one_batch(tmp_path):
    # Micro-batches weighted by their token share accumulate the full-batch gradient, for the
    # policy and for the critic (given a non-zero value head, so that V varies). Rows whose
    # reward is None are masked out, so the micro-batches hold different numbers of tokens.
    policy_grads, critic_grads = [], []
    for micro, accum in ((8, 1), (4, 2), (2, 4)):
        args = _config(
            tmp_path,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accum,
            max_grad_norm=1e9,
            beta=0.05,
        )
        trainer = PPOTrainer("tiny-random", even_tokens_or_none, PROMPT_ROWS, args=args)
        head = torch.randn(
            trainer.critic.head.weight.shape, generator=torch.Generator().manual_seed(0)
        )
        trainer.critic.head.weight.data.copy_(head)
        logs = trainer.train_step()
        assert 0 < logs["rewards/even_tokens_or_none/frac_none"] < 0.5
        policy_grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
        critic_grads.append(torch.cat([p.grad.flatten() for p in trainer.critic.parameters()]))
    assert policy_grads[0].abs().max() > 0 and critic_grads[0].abs().max() > 0
    for k in (1, 2):
        torch.testing.assert_close(policy_grads[k], policy_grads[0], atol=1e-6, rtol=1e-3)
        torch.testing.assert_close(critic_grads[k], critic_grads[0], atol=1e-6, rtol=1e-3)


def test_zero_critic_reduces_to_grpo_with_batch_baseline(tmp_path):
    # With V = 0 frozen (zero head, critic lr 0), gamma = lam = 1 and beta = 0, every token's
    # advantage is its sequence reward, whitened over the batch: GRPO's (R - mean) / std with one
    # group and token-mean (dapo) aggregation, up to a positive scale (the std estimators
    # differ). So the first policy gradients point the same way.
    common = dict(num_generations=8, per_device_train_batch_size=8, max_grad_norm=1e9)
    ppo = PPOTrainer(
        "tiny-random",
        even_tokens,
        PROMPT_ROWS,
        args=_config(tmp_path, critic_learning_rate=0.0, **common),
    )
    grpo = GRPOTrainer(
        "tiny-random",
        even_tokens,
        PROMPT_ROWS,
        args=_config(tmp_path, algorithm="grpo", loss_type="dapo", scale_rewards="batch", **common),
    )
    ppo_logs, grpo_logs = ppo.train_step(), grpo.train_step()
    assert ppo_logs["reward"] == grpo_logs["reward"]  # the same rollout
    assert ppo_logs["completions/min_length"] == ppo_logs["completions/max_length"]  # equal L
    assert ppo_logs["rewards/even_tokens/std"] > 0
    g_ppo = torch.cat([p.grad.flatten() for p in ppo.model.parameters()])
    g_grpo = torch.cat([p.grad.flatten() for p in grpo.model.parameters()])
    torch.testing.assert_close(g_ppo / g_ppo.norm(), g_grpo / g_grpo.norm(), atol=1e-6, rtol=1e-3)


# ----------------------------------------------------------------------------------------------
# The trainer end to end.


def test_metrics_with_kl_penalty_and_single_generation(tmp_path):
    args = _config(tmp_path, num_generations=1, per_device_train_batch_size=4, beta=0.1)
    trainer = PPOTrainer("tiny-random", TargetToken(), PROMPT_ROWS, args=args)
    assert trainer.ref_model is not None
    first = trainer.train_step()
    second = trainer.train_step()
    for key in (
        "reward",
        "rewards/target_token/mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "loss",
        "kl",
        "entropy",
        "clip_ratio/region_mean",
        "grad_norm",
        "learning_rate",
        "time/generation",
        "time/scoring",
        "time/update",
        "time/step",
        "tokens_per_second",
        "value_loss",
        "value_clip_frac",
        "explained_variance",
        "values/mean",
        "returns/mean",
        "advantages/mean_raw",
        "non_score_reward",
    ):
        assert key in second and math.isfinite(second[key]), key
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference at step 1
    assert first["non_score_reward"] == pytest.approx(0.0, abs=1e-6)
    assert first["values/mean"] == 0.0  # zero-initialised value head
    assert second["kl"] > 0 and second["non_score_reward"] != 0.0


def _learning_curve(tmp_path, learning_rate, max_steps):
    args = _config(
        tmp_path,
        seed=0,
        max_steps=max_steps,
        learning_rate=learning_rate,
        num_generations=8,
        per_device_train_batch_size=32,
        max_completion_length=8,
        temperature=0.1,
    )
    trainer = PPOTrainer("tiny-random", TargetToken(), PROMPT_ROWS, args=args)
    trainer.train()
    return [log["reward"] for log in trainer.log_history]


def test_ppo_learns_target_token(tmp_path):
    # Seeds 0-4 all reach >= 0.97 by step 15 (seed 0: 0.02 at step 1, 0.93 at step 11).
    rewards = _learning_curve(tmp_path, learning_rate=1e-3, max_steps=15)
    start, end = rewards[0], sum(rewards[-4:]) / 4
    assert start < 0.2, rewards
    assert end > 0.8, rewards


def test_no_learning_without_updates(tmp_path):
    # Control for the test above: learning rate 0 (policy and critic) does not improve.
    rewards = _learning_curve(tmp_path, learning_rate=0.0, max_steps=3)
    assert max(rewards) < 0.3, rewards


# ----------------------------------------------------------------------------------------------
# Checkpoint hooks and saving.


def _assert_same_state(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_state(x, y)
    else:
        assert a == b


def test_critic_state_round_trip(tmp_path):
    args = _config(tmp_path, learning_rate=1e-2)
    trained = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=args)
    trained.train_step()
    buffer = io.BytesIO()  # through torch.save, as a checkpoint would
    torch.save(trained.run.algorithm.state_dict(), buffer)  # the checkpoint's extra entry
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    fresh = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=args)
    assert not torch.equal(fresh.critic.head.weight, trained.critic.head.weight)
    fresh.run.algorithm.load_state_dict(state)
    _assert_same_state(fresh.critic.state_dict(), trained.critic.state_dict())
    _assert_same_state(fresh.critic_optimizer.state_dict(), trained.critic_optimizer.state_dict())
    assert fresh.critic_optimizer.state_dict()["state"]  # Adam moments, not an empty state
    assert fresh.critic_scheduler.last_epoch == trained.critic_scheduler.last_epoch == 1


def test_save_model_writes_loadable_critic(tmp_path):
    args = _config(tmp_path, learning_rate=1e-2)
    trainer = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=args)
    trainer.train_step()
    target = trainer.save_model(tmp_path / "saved")
    assert (target / "config.json").exists()  # the policy, as GRPOTrainer saves it
    assert (target / "critic" / "model.safetensors").exists()
    assert (target / "critic" / "critic_config.json").exists()
    fresh = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=args)
    fresh.load_critic(target)
    _assert_same_state(fresh.critic.state_dict(), trainer.critic.state_dict())


def test_resume_from_checkpoint_continues_exactly(tmp_path):
    # Through GRPOTrainer's checkpoint code: 2 steps straight == 1 step, checkpoint, resume, 1 step.
    args = _config(tmp_path, max_steps=2, save_steps=1, learning_rate=1e-2, beta=0.05)
    straight = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=args)
    straight.train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    assert (checkpoint / "training_state.pt").exists()
    resumed_args = _config(
        tmp_path,
        max_steps=2,
        learning_rate=1e-2,
        beta=0.05,
        output_dir=str(tmp_path / "resumed"),
        resume_from_checkpoint=str(checkpoint),
    )
    resumed = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=resumed_args)
    resumed.train()
    assert resumed.global_step == 2
    _assert_same_state(resumed.critic.state_dict(), straight.critic.state_dict())
    _assert_same_state(resumed.model.state_dict(), straight.model.state_dict())
    _assert_same_state(
        resumed.critic_optimizer.state_dict(), straight.critic_optimizer.state_dict()
    )


def test_lora_policy_gets_a_plain_critic(tmp_path):
    args = _config(tmp_path, use_peft=True, beta=0.1)
    trainer = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=args)
    names = [name for name, _ in trainer.critic.named_parameters()]
    assert not [name for name in names if "lora" in name]
    assert all(p.requires_grad for p in trainer.critic.parameters())
    assert any("lora" in name for name, _ in trainer.model.named_parameters())


def test_policy_loss_gets_whitened_token_advantages(tmp_path, monkeypatch):
    # The wiring: the surrogate sees each token's own GAE advantage, whitened over the batch (not
    # one advantage per sequence), and the critic sees the GAE returns.
    import groupwise.policy.loss as loss_module
    import groupwise.trainer.ppo as ppo

    seen = {"policy": [], "value": []}

    def gae_spy(rewards, values, mask, gamma, lam):
        seen["gae"] = gae_advantages(rewards, values, mask, gamma, lam)
        seen["mask"] = mask
        return seen["gae"]

    def policy_spy(logprobs, old, ref, advantages, mask, epsilon_low, epsilon_high):
        seen["policy"].append(advantages.clone())
        return ppo_policy_loss(logprobs, old, ref, advantages, mask, epsilon_low, epsilon_high)

    def value_spy(values, old_values, returns, mask, cliprange_value):
        seen["value"].append(returns.clone())
        return value_loss(values, old_values, returns, mask, cliprange_value)

    monkeypatch.setattr(ppo, "gae_advantages", gae_spy)
    monkeypatch.setattr(loss_module, "ppo_policy_loss", policy_spy)  # PPOLoss's
    monkeypatch.setattr(loss_module, "value_loss", value_spy)
    args = _config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    trainer = PPOTrainer("tiny-random", even_tokens, PROMPT_ROWS, args=args)
    torch.nn.init.normal_(trainer.critic.head.weight, std=0.1)  # values vary from token to token
    trainer.train_step()
    advantages, returns = seen["gae"]
    mask = seen["mask"]
    torch.testing.assert_close(torch.cat(seen["policy"]), masked_whiten(advantages, mask))
    torch.testing.assert_close(torch.cat(seen["value"]), returns)
    row = advantages[0][mask[0].bool()]
    assert row.max() - row.min() > 1e-3  # token-level, not one value per sequence
