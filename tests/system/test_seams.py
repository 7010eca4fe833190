"""The trainer's four seams (loss, curriculum, engine, policy) and the layering they keep.

Each extension point is exercised the way a user would extend it: a loss variant registered in
algo.LOSSES, a curriculum added to CURRICULA, an engine that wraps the trainer's engine and
inserts tokens the policy did not write. Then the architecture rules: the step's length, no
data-parallel plumbing in the trainers, PPO built from the same pieces, the report's and the
sandbox's own layering (the package's layers: tests/system/test_layout.py).
"""

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

from conftest import TargetToken
from conftest import tiny_config as _config
from groupwise import GRPOConfig, GRPOTrainer, PPOTrainer
from groupwise.algo.grpo import policy_loss
from groupwise.algo.losses import LOSSES, LossVariant, register_loss
from groupwise.curriculum import CURRICULA, Curriculum, Plan
from groupwise.errors import ConfigError
from groupwise.rollout import Rollout

SRC = Path(__file__).resolve().parents[2] / "src" / "groupwise"
ROWS = [{"prompt": f"Say something number {i}"} for i in range(8)]


# ----------------------------------------------------------------------------------------------
# (a) a loss variant is one registered entry


def test_cispo_by_hand():
    # rho = [e^0.5, 1]; the weight is capped at epsilon_high = 1.2 and detached: [1.2, 1.0].
    # Per token -w A logp = [-1.2 * 2 * -1, -1 * 2 * -2] = [2.4, 4.0]; token mean 3.2. The
    # gradient is -w A / 2 tokens = [-1.2, -1.0]; the masked third token gets none (its NaN
    # log-prob included).
    logp = torch.tensor([[-1.0, -2.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = policy_loss(logp, old, None, torch.tensor([2.0]), mask, loss_type="cispo",
                                epsilon_high=1.2)  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(3.2)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.2, -1.0, 0.0]]))
    assert metrics["clip_ratio/high_mean"] == pytest.approx(0.5)  # the first token is capped
    assert metrics["clip_ratio/low_mean"] == 0.0


def test_cispo_needs_a_cap_of_at_least_one():
    with pytest.raises(ConfigError, match="epsilon_high"):
        GRPOConfig(loss_type="cispo", epsilon_high=0.2)
    assert GRPOConfig(loss_type="cispo", epsilon_high=5.0).loss_type == "cispo"


def test_cispo_learns(tmp_path):
    args = _config(tmp_path, loss_type="cispo", epsilon_high=5.0, max_steps=12,
                   num_generations=8, per_device_train_batch_size=16, max_completion_length=8,
                   temperature=0.1)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", TargetToken(), [{"prompt": "Say something"}] * 4,
                          args=args)  # fmt: skip
    trainer.train()
    rewards = [log["reward"] for log in trainer.log_history if "reward" in log]
    assert rewards[0] < 0.2 and sum(rewards[-4:]) / 4 > 0.8, rewards


def test_a_registered_loss_variant_is_used_by_config_loss_and_trainer(tmp_path):
    @register_loss("half_grpo")
    class HalfGRPO(type(LOSSES["grpo"])):
        def token_loss(self, logprobs, ratio, advantages, epsilon_low, epsilon_high):
            return 0.5 * super().token_loss(logprobs, ratio, advantages, epsilon_low, epsilon_high)

    try:
        logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
        old = torch.tensor([[-1.2, -1.9], [-0.4, -0.3]])
        mask, adv = torch.ones(2, 2), torch.tensor([1.0, -1.0])
        full, _ = policy_loss(logp, old, None, adv, mask, loss_type="grpo")
        half, _ = policy_loss(logp, old, None, adv, mask, loss_type="half_grpo")
        assert half.item() == pytest.approx(0.5 * full.item())
        args = _config(tmp_path, loss_type="half_grpo", max_steps=1)
        trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
        trainer.train()
        logs = trainer.log_history
        assert logs[-1]["step"] == 1 and logs[-1]["grad_norm"] > 0
    finally:
        LOSSES.pop("half_grpo")
    with pytest.raises(ConfigError, match="half_grpo"):
        GRPOConfig(loss_type="half_grpo")


def test_loss_variant_base_is_abstract():
    with pytest.raises(NotImplementedError):
        LossVariant().reduce(torch.zeros(1, 1), torch.ones(1, 1), None)


# ----------------------------------------------------------------------------------------------
# (b) a curriculum is one class plus one registry line


class AlternatingCounts(Curriculum):
    """Test curriculum: prompt i of the global batch gets 2 rollouts if i is even, else 6 (mean
    4), weight 2 on the first prompt; it records what it observed."""

    def __init__(self) -> None:
        self.observed = []

    @classmethod
    def from_options(cls, options, dist=None):
        return cls()

    def plan(self, batch) -> Plan:
        counts = [2 if i % 2 == 0 else 6 for i in range(len(batch.indices))]
        return Plan(batch, counts, [2.0] + [1.0] * (len(counts) - 1))

    def observe(self, plan, outcome):
        self.observed.append((plan.counts, outcome.sequence_loss.shape[0], outcome.skipped))
        return {"curriculum/test_rows": float(outcome.sequence_loss.shape[0])}

    def state_dict(self):
        return {"observed": len(self.observed)}

    def load_state_dict(self, state):
        return None


def test_a_registered_curriculum_plans_counts_and_weights(tmp_path, monkeypatch):
    monkeypatch.setitem(CURRICULA, "alternating", AlternatingCounts)
    args = _config(tmp_path, curriculum="alternating", max_steps=2)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    seen = []
    inner = trainer.engine.generate

    def recording(prompt_ids, counts, *a, **kw):
        seen.append(list(counts))
        return inner(prompt_ids, counts, *a, **kw)

    monkeypatch.setattr(trainer.engine, "generate", recording)
    trainer.train()
    logs = trainer.log_history
    assert seen == [[2, 6], [2, 6]]
    assert trainer.curriculum.observed == [([2, 6], 8, False), ([2, 6], 8, False)]
    assert [log["curriculum/test_rows"] for log in logs] == [8.0, 8.0]


def test_plan_row_weights_follow_group_ids():
    from groupwise.curriculum import PromptBatch

    batch = PromptBatch([5, 6, 7, 8], slice(2, 4), [{}, {}], [[1], [1]])  # rank 1 of 2
    plan = Plan(batch, [4, 4, 2, 6], [1.0, 1.0, 3.0, 0.5])
    rollout = Rollout(torch.zeros(2, 1), torch.ones(2, 1), torch.zeros(8, 1), torch.ones(8, 1),
                      torch.zeros(8, dtype=torch.bool), torch.tensor([0, 0, 1, 1, 1, 1, 1, 1]),
                      [""] * 8)  # fmt: skip
    assert plan.local_counts == [2, 6]
    assert plan.row_weights(rollout).tolist() == [3.0, 3.0] + [0.5] * 6
    assert Plan(batch, [4] * 4, [1.0] * 4).row_weights(rollout) is None


# ----------------------------------------------------------------------------------------------
# (c)-(d) an engine is one class; one that wraps another and masks what it inserted


class AppendingEngine:
    """Wraps an engine and appends ``extra`` tokens after every completion, as a tool result
    would be inserted: the model attends to them but did not write them (loss_mask 0)."""

    def __init__(self, inner, extra=(7, 8)):
        self.inner, self.extra = inner, list(extra)

    def generate(self, prompt_ids, counts, params=None, generator=None, rows=None):
        return append_tokens(self.inner.generate(prompt_ids, counts, params, generator),
                             self.extra)  # fmt: skip

    def sync(self, policy):
        self.inner.sync(policy)


def append_tokens(rollout: Rollout, extra: list[int]) -> Rollout:
    n, width = rollout.completion_ids.shape
    lengths = rollout.lengths
    ids = torch.zeros(n, width + len(extra), dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss_mask = torch.zeros_like(ids)
    for i in range(n):
        length = int(lengths[i])
        ids[i, :length] = rollout.completion_ids[i, :length]
        ids[i, length : length + len(extra)] = torch.tensor(extra)
        mask[i, : length + len(extra)] = 1
        loss_mask[i, :length] = 1
    return Rollout(rollout.prompt_ids, rollout.prompt_mask, ids, mask, rollout.truncated,
                   rollout.group_ids, rollout.texts, loss_mask=loss_mask)  # fmt: skip


def _gradients(trainer, rollout, advantages):
    inputs = trainer.policy.prepare(rollout, advantages)
    grads = {}

    def step():  # record the accumulated gradient instead of stepping
        grads.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()
                      if p.grad is not None})  # fmt: skip

    trainer.policy.step = step
    stats = trainer.policy.update(inputs, trainer.loss)
    return grads, stats


def test_inserted_tokens_get_no_gradient_and_leave_the_loss_unchanged(tmp_path):
    args = _config(tmp_path, per_device_train_batch_size=4, max_grad_norm=1e9)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    batch = trainer.prompts.next()
    rollout = trainer.engine.generate(batch.prompt_ids, 4)
    advantages = torch.linspace(-1.0, 1.0, rollout.completion_ids.shape[0])
    plain, plain_stats = _gradients(trainer, rollout, advantages)
    appended, appended_stats = _gradients(trainer, append_tokens(rollout, [7, 8]), advantages)
    assert plain.keys() == appended.keys() and plain
    for name in plain:
        torch.testing.assert_close(appended[name], plain[name], atol=1e-6, rtol=1e-5)
    assert appended_stats.sums["loss"] == pytest.approx(plain_stats.sums["loss"], abs=1e-6)
    assert appended_stats.entropy_sum == pytest.approx(plain_stats.entropy_sum, rel=1e-5)


class RecordingEngine:
    """Wraps an engine and keeps every rollout it returns."""

    def __init__(self, inner):
        self.inner, self.rollouts = inner, []

    def generate(self, *args, **kwargs):
        self.rollouts.append(self.inner.generate(*args, **kwargs))
        return self.rollouts[-1]

    def sync(self, policy):
        self.inner.sync(policy)


def test_a_wrapping_engine_needs_no_trainer_change(tmp_path):
    target, scored = TargetToken(), []

    def reward(prompts, completions, completion_ids, **kwargs):
        scored.append(completion_ids)
        return target(prompts, completions, completion_ids, **kwargs)

    trainer = GRPOTrainer("tiny-random", reward, ROWS, args=_config(tmp_path))
    written = RecordingEngine(trainer.engine)  # what the policy wrote
    served = RecordingEngine(AppendingEngine(written))  # what the trainer received
    trainer.engine = served
    trainer.train()
    logs = trainer.log_history
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(log["loss"])) for log in logs)
    assert len(written.rollouts) == len(served.rollouts) == len(scored) == 2
    # The completion is 2 tokens longer than what the policy wrote, in every row, and the
    # run's services read the wrapped rollout: the reward sees the inserted tokens at the end
    # of every completion, the logged lengths count them, the loss mask leaves them out.
    steps = zip(written.rollouts, served.rollouts, scored, logs, strict=True)
    for policy, wrapped, ids, log in steps:
        lengths = policy.lengths.tolist()
        assert len(lengths) == len(ids) == 8
        assert wrapped.lengths.tolist() == [n + 2 for n in lengths]
        assert wrapped.loss_mask.sum(dim=1).tolist() == lengths
        for row, n in zip(ids, lengths, strict=True):
            assert len(row) == n + 2 and list(row[n:]) == [7, 8]
        assert log["completions/mean_length"] == pytest.approx(sum(lengths) / 8 + 2)
    records = trainer.completion_records()
    assert sum(len(r["completions"]) for r in records) == 8


# ----------------------------------------------------------------------------------------------
# Architecture


def _method_lines(cls, name: str) -> int:
    source = inspect.getsource(getattr(cls, name))
    return len(source.rstrip("\n").splitlines())


def test_train_steps_are_short_and_ppo_is_a_sibling():
    assert _method_lines(GRPOTrainer, "train_step") <= 45
    assert _method_lines(PPOTrainer, "train_step") <= 60
    assert not issubclass(PPOTrainer, GRPOTrainer)


def test_the_run_services_stay_small():
    # The trainer's services are split so that each concern reads on its own: no module of
    # groupwise.trainer over 600 lines, no class over 300.
    sizes = {}
    for path in (SRC / "trainer").glob("*.py"):
        text = path.read_text()
        sizes[path.name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                sizes[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert "base.py:Trainer" in sizes and "loop.py:TrainingLoop" in sizes
    too_long = {name: n for name, n in sizes.items() if n > (300 if ":" in name else 600)}
    assert too_long == {}


def test_trainers_hold_no_data_parallel_plumbing():
    pattern = re.compile(r"fsdp|ddp|no_sync|any_rank|all_reduce|world_size")
    for name in ("trainer/grpo.py", "trainer/ppo.py"):
        hits = [line for line in (SRC / name).read_text().splitlines() if pattern.search(line)]
        assert hits == [], (name, hits)


def _imports(path: Path) -> set[str]:
    """groupwise modules a file imports (lazily too), as dotted names below groupwise."""
    package = path.relative_to(SRC).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[: len(package) - node.level + 1])
            target = ".".join(base + ([node.module] if node.module else []))
            names = [f"{target}.{a.name}" if target else a.name for a in node.names]
            found.update([target] if node.module else names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for name in [module] if module else [a.name for a in node.names]:
                if name and name.startswith("groupwise."):
                    found.add(name.removeprefix("groupwise."))
    return {f for f in found if f}


# Inside the report package, bottom to top: the trainer imports report.record (run.json), which
# needs none of the reading, the table of figures, the plotting or the pages.
REPORT_PARTS = ["report.record", "report.load", "report.panels", "report.plot", "report.html",
                "report.compare", "report.browser", "report"]  # fmt: skip


def _report_part(module: str) -> int:
    for depth in range(module.count(".") + 1, 0, -1):
        prefix = ".".join(module.split(".")[:depth])
        if prefix in REPORT_PARTS:
            return REPORT_PARTS.index(prefix)
    raise AssertionError(f"{module} is in no part of the report; add it to REPORT_PARTS")


def test_report_parts_import_only_earlier_parts():
    upward = []
    for path in (SRC / "report").glob("*.py"):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        module = module.removesuffix(".__init__").removesuffix(".__main__")
        for target in _imports(path):
            if target.split(".")[0] == "report" and _report_part(target) > _report_part(module):
                upward.append(f"{module} -> {target}")
    assert upward == []
    assert _imports(SRC / "report" / "record.py") == {"files"}


def _package_imports(package: str) -> dict[str, set[str]]:
    """module -> the groupwise modules it imports, for every module of ``package``."""
    found = {}
    for path in (SRC / package).rglob("*.py"):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[module] = _imports(path)
    return found


def _within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def test_the_sandbox_stands_alone_below_tools_and_rewards():
    # The python tool and the code reward share groupwise.sandbox: neither imports the other,
    # and the sandbox imports nothing else from groupwise (its launcher nothing at all).
    sandbox = _package_imports("sandbox")
    assert "sandbox.launcher" in sandbox and "sandbox.probe" in sandbox
    assert sandbox["sandbox.launcher"] == set()
    outside = {m: t for m, ts in sandbox.items() for t in ts if not _within(t, "sandbox")}
    assert outside == {}
    tools, rewards = _package_imports("tools"), _package_imports("rewards")
    assert [f"{m} -> {t}" for m, ts in tools.items() for t in ts if _within(t, "rewards")] == []
    assert [f"{m} -> {t}" for m, ts in rewards.items() for t in ts if _within(t, "tools")] == []
    assert "sandbox" in tools["tools.builtin"] and "sandbox" in rewards["rewards.code"]
