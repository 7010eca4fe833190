"""torchrun data parallel on CPU (gloo, 2 processes): one step on 2 ranks gives the gradients and
parameters of one process running the same global batch; the CLI trains, logs once, resumes."""

import json
import math
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from groupwise.curriculum.base import PromptSampler

# Runs in each process. Generation is replaced by a deterministic function of the prompt (random
# tokens and lengths from a generator seeded by the prompt), so that the single process and the
# two ranks train on identical completions; everything after generation is the real trainer.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import groupwise.rollout.hf as engine
    from groupwise import GRPOConfig, GRPOTrainer, PPOTrainer
    from groupwise.rollout import Rollout

    rows_generated = []  # completions per step on this rank

    def fake_generate(model, tokenizer, prompt_token_ids, num_generations, params, generator=None,
                      **kwargs):
        # An int, or one count per prompt (Rollout-GDRO).
        counts = ([num_generations] * len(prompt_token_ids) if isinstance(num_generations, int)
                  else list(num_generations))
        width, pad = 6, tokenizer.pad_token_id
        lp = max(len(p) for p in prompt_token_ids)
        prompt_ids = torch.full((len(prompt_token_ids), lp), pad)
        prompt_mask = torch.zeros_like(prompt_ids)
        comps, masks = [], []
        for i, (p, G) in enumerate(zip(prompt_token_ids, counts)):
            prompt_ids[i, lp - len(p):] = torch.tensor(p)
            prompt_mask[i, lp - len(p):] = 1
            g = torch.Generator().manual_seed(sum(p) * 1009 + len(p))
            ids = torch.randint(5, 200, (G, width), generator=g)
            lengths = torch.randint(1, width + 1, (G,), generator=g)
            m = (torch.arange(width)[None] < lengths[:, None]).long()
            comps.append(ids * m + pad * (1 - m))
            masks.append(m)
        comp, mask = torch.cat(comps), torch.cat(masks)
        rows_generated.append(len(comp))
        return Rollout(prompt_ids, prompt_mask, comp, mask, mask.sum(1) == width,
                       torch.arange(len(prompt_token_ids)).repeat_interleave(torch.tensor(counts)),
                       tokenizer.batch_decode(comp, skip_special_tokens=True))

    engine.generate = fake_generate  # every trainer generates through the engine

    import groupwise.rollout.multiturn as multiturn

    def fake_converse(model, tokenizer, prompt_token_ids, counts, envs, render, params, limits,
                      generator=None, **kwargs):
        # Conversations: the same completions, every third token inserted context (masked
        # from the loss), tool counts a function of the tokens.
        r = fake_generate(model, tokenizer, prompt_token_ids, list(counts), params)
        columns = torch.arange(r.completion_ids.shape[1])
        r.loss_mask = r.completion_mask * (columns % 3 != 1).long()
        r.conversations = [[{"role": "assistant", "content": t}] for t in r.texts]
        r.env_states = [{"tool_calls": int(ids.sum()) % 2, "tool_errors": 0, "turns": 1}
                        for ids in r.completion_ids]
        return r, {"env_s": 0.0, "insert_s": 0.0}

    multiturn.converse = fake_converse  # used by the multi-turn engine (tools=...)

    def low_tokens(completions, completion_ids, **kw):
        return [sum(t < 100 for t in ids) / max(len(ids), 1) for ids in completion_ids]

    def run(out, overrides):
        rows_generated.clear()
        steps = overrides.pop("steps", 1)  # train_step calls
        max_steps = overrides.pop("max_steps", steps)  # optimizer steps (more per batch)
        easy = overrides.pop("easy_prompts", None)
        rows = [{"prompt": f"Problem number {i}: add {i} and {2 * i}."} for i in range(8)]
        args = GRPOConfig(model="tiny-random", max_steps=max_steps, learning_rate=1e-4, beta=0.04,
                          num_generations=4, max_completion_length=6, seed=0, disable_tqdm=True,
                          output_dir=out, **{"loss_type": "grpo", "logging_steps": 1,
                          "use_bias_correction_kl": False, "lr_scheduler_type": "constant",
                          "gradient_checkpointing": False, **overrides})
        cls = PPOTrainer if args.algorithm == "ppo" else GRPOTrainer
        trainer = cls("tiny-random", low_tokens, rows, args=args)
        rank = int(os.environ.get("RANK", "0"))
        main = rank == 0
        if easy is not None:
            # A curriculum that has seen every prompt once: the easy ones solved (top bin), the rest
            # not (bottom bin); Prompt-GDRO weighs the hard bin up, Rollout-GDRO gives it 6 rollouts
            # and the easy bin 2, so ranks holding different prompts hold different row counts.
            state = trainer.curriculum.state_dict()
            top = trainer.curriculum.classifier.num_bins - 1  # the easiest bin
            state["classifier"]["history"] = {i: [int(i in easy)] for i in range(len(rows))}
            state["prompt_gdro"]["scores"][0], state["prompt_gdro"]["scores"][top] = 1.0, -1.0
            arms = trainer.curriculum.rollout_gdro.arms
            state["rollout_gdro"]["scores"][0][arms.index(6)] = 5.0
            state["rollout_gdro"]["scores"][top][arms.index(2)] = 5.0
            trainer.curriculum.load_state_dict(state)
        sharded = [hasattr(p, "full_tensor") for p in trainer.model.parameters()]
        fsdp = args.data_parallel == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) > 1
        assert all(sharded) if fsdp else not any(sharded)  # one process ignores data_parallel

        def full(t):  # FSDP: gather a DTensor shard into the full tensor (a collective)
            return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()

        real_step = trainer.optimizer.step
        def step(*a, **k):
            grads = {n: full(p.grad) for n, p in trainer.model.named_parameters()
                     if p.grad is not None}
            if main:
                torch.save(grads, os.path.join(out, "grads.pt"))
            return real_step(*a, **k)
        trainer.optimizer.step = step
        for _ in range(steps):
            logs = trainer.train_step()
        params = {n: full(p.data) for n, p in trainer.model.named_parameters()}
        if args.algorithm == "ppo":
            params.update({f"critic.{n}": full(p.data)
                           for n, p in trainer.critic.named_parameters()})
        if main:
            torch.save(params, os.path.join(out, "params.pt"))
            with open(os.path.join(out, "logs.json"), "w") as f:
                json.dump(logs, f)
        if trainer.curriculum is not None:  # every rank's, to compare them
            with open(os.path.join(out, f"curriculum-{rank}.json"), "w") as f:
                json.dump(trainer.curriculum.state_dict(), f)
        with open(os.path.join(out, f"rows-{rank}.json"), "w") as f:
            json.dump(rows_generated, f)

    # argv[1]: the jobs, [output folder, overrides] pairs, run one after another (one
    # process start and import for all of them); each job writes only to its own folder.
    for out, overrides in json.loads(sys.argv[1]):
        run(out, overrides)
    """
)


def _env():
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", *args]  # fmt: skip


def _run(cmd, cwd):
    done = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


class Launch:
    """One process (or one torchrun job) that ran several jobs of a script one after another, each
    in its own folder: a test reads its job's folder, and reports the launch's output when the
    job did not finish (a failing job ends the launch, so the jobs after it are missing too)."""

    def __init__(self, cmd: list[str], jobs: list[tuple[Path, dict]], cwd: Path):
        for folder, _ in jobs:
            folder.mkdir(parents=True, exist_ok=True)
        argv = json.dumps([[str(folder), overrides] for folder, overrides in jobs])
        self.done = subprocess.run([*cmd, argv], cwd=cwd, env=_env(), capture_output=True,
                                   text=True, timeout=1800)  # fmt: skip
        self.output = self.done.stdout + self.done.stderr

    def check(self, folder: Path, last_file: str) -> Path:
        """``folder``, once the job's last written file is there."""
        assert (folder / last_file).exists(), (
            f"{folder.name}: the job did not finish (exit {self.done.returncode}):\n"
            + self.done.stdout[-3000:]
            + self.done.stderr[-3000:]
        )
        return folder


def _selected_cases(request: pytest.FixtureRequest, cases: dict, module: str) -> list[str]:
    """The names in ``cases`` that this session's selected tests of ``module`` ask for (their
    ``case`` parameter), in collection order: a launch runs only what is selected."""
    names = []
    for item in request.session.items:
        if item.module.__name__ != module:
            continue
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("case") if callspec else CASE_OF_TEST.get(item.name)
        if name in cases and name not in names:
            names.append(name)
    return names


# The comparisons of one process with 2 ranks on the same global batch (4 prompts x 4
# completions, 2 micro-batches per step on each side): the overrides of each, by test and case.
# The single process is given the same data_parallel value, which it ignores.
STEP_CASES = {
    **{
        f"global_batch/{loss}-{scale}-{dp}": {
            "loss_type": loss, "scale_rewards": scale, "data_parallel": dp
        }
        for loss, scale in [("grpo", "group"), ("dapo", "batch"), ("dr_grpo", "group")]
        for dp in ("ddp", "fsdp")
    },
    **{
        f"multi_turn/{loss}": {"tools": ["calculator"], "max_turns": 2, "loss_type": loss}
        for loss in ("grpo", "dapo")
    },
    **{
        # The bandit allocator with greedy arms, so the arm scores SCRIPT sets decide the
        # rollouts; easy_prompts: rank 0's prompts in the first step.
        f"curriculum/{curriculum}-{dp}-{unseen}": {
            "curriculum": curriculum, "data_parallel": dp, "steps": 2,
            "easy_prompts": PromptSampler(8, seed=0).take(2), "rollout_allocator": "bandit",
            "rollout_arm_choice": "greedy", "gdro_unseen": unseen,
        }
        for curriculum, dp, unseen in [
            ("prompt_gdro", "ddp", "unseen"),
            ("rollout_gdro", "ddp", "unseen"),
            ("rollout_gdro", "fsdp", "unseen"),
            # Levels gathered from every rank at each plan (a collective); these rows have none.
            ("rollout_gdro", "ddp", "difficulty"),
        ]
    },
    "ppo": {"algorithm": "ppo", "data_parallel": "ddp", "steps": 2},
    # No LoRA dropout: its masks are random and differ between processes.
    "lora_fsdp": {"use_peft": True, "lora_dropout": 0.0, "data_parallel": "fsdp", "steps": 2},
}  # fmt: skip


# The STEP_CASES case of each test that has no ``case`` parameter.
CASE_OF_TEST = {
    "test_ppo_two_ranks_match_one_process": "ppo",
    "test_lora_fsdp_two_ranks_match_one_process": "lora_fsdp",
}


def _cases(prefix: str) -> list:
    """pytest params of the STEP_CASES under ``prefix``, with the rest of the name as id."""
    return [
        pytest.param(name, id=name.removeprefix(prefix))
        for name in STEP_CASES
        if name.startswith(prefix)
    ]


# Session-scoped: under pytest-xdist a module-scoped fixture is torn down whenever the worker
# runs another module between two tests of the group, and would launch again.
@pytest.fixture(scope="session")
def step_runs(request, tmp_path_factory):
    """Run SCRIPT for every selected STEP_CASES case, all in one single process and all in one
    torchrun job (two launches instead of two per case: starting the processes and importing
    torch and transformers cost more than these one- and two-step runs); returns a function of
    the case name that gives its two output folders (single process, ranks)."""
    names = _selected_cases(request, STEP_CASES, __name__)
    root = tmp_path_factory.mktemp("steps")
    return single_and_two_ranks(SCRIPT, STEP_CASES, names, root, "rows-0.json")


# The same global batch either way: 8 completions per micro-batch in one process, 4 per rank.
TWO_RANK_BATCH = {
    "single": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2},
    "ranks": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},
}


def single_and_two_ranks(
    script_text: str, cases: dict, names: list[str], root: Path, output: str
) -> Callable[[str], tuple[Path, Path]]:
    """``script_text`` run for every case in ``names``, all in one single process and all in one
    torchrun job with :data:`TWO_RANK_BATCH`; returns a function of the case name that gives
    its two output folders (single process, ranks), each checked to hold ``output``."""
    script = root / "step.py"
    script.write_text(script_text)
    launches = {}
    for side, cmd in (("single", [sys.executable, str(script)]), ("ranks", _torchrun(str(script)))):
        jobs = [(root / side / f"case{i}", {**cases[name], **TWO_RANK_BATCH[side]})
                for i, name in enumerate(names)]  # fmt: skip
        launches[side] = Launch(cmd, jobs, root)

    def folders(name: str) -> tuple[Path, Path]:
        i = names.index(name)
        return tuple(
            launches[side].check(root / side / f"case{i}", output) for side in ("single", "ranks")
        )

    return folders


def _assert_same_update(single: Path, ranks: Path, atol: float = 1e-6) -> dict[str, float]:
    """The last step's gradients and the final parameters of both runs agree within atol;
    returns the largest difference of each file."""
    worst = {}
    for name in ("grads.pt", "params.pt"):
        a, b = torch.load(single / name), torch.load(ranks / name)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=atol, msg=f"{name} {key}")
        worst[name] = max(float((a[k] - b[k]).abs().max()) for k in a)
    grads = torch.load(single / "grads.pt")
    assert any(g.abs().max() > 1e-4 for g in grads.values())  # a real, non-zero update
    # Metrics of the global batch: reduced over ranks, they equal one process's.
    logs = [json.loads((run / "logs.json").read_text()) for run in (single, ranks)]
    for key in ("loss", "kl", "entropy", "reward"):
        assert logs[1][key] == pytest.approx(logs[0][key], abs=1e-5), key
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases("global_batch/"))
def test_two_ranks_match_one_process_on_the_global_batch(step_runs, case):
    _assert_same_update(*step_runs(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases("multi_turn/"))
def test_multi_turn_two_ranks_match_one_process(step_runs, case):
    """Conversations with masked context tokens (tools): the loss mask's token counts are
    global, so two ranks update exactly as one process."""
    single, ranks = step_runs(case)
    _assert_same_update(single, ranks)
    logs = [json.loads((run / "logs.json").read_text()) for run in (single, ranks)]
    assert 0 < logs[0]["tokens/masked_fraction"] < 1
    assert logs[1]["tools/call_rate"] == pytest.approx(logs[0]["tools/call_rate"], abs=1e-6)


def _assert_nested_close(a, b, atol: float, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_nested_close(a[key], b[key], atol, f"{where}/{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_nested_close(x, y, atol, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert b == pytest.approx(a, abs=atol), where
    else:
        assert a == b, where


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases("curriculum/"))
def test_curriculum_two_ranks_match_one_process(step_runs, case):
    """Both ranks observe the global batch: their curriculum states are identical, equal to
    one process's, and so are the updates, also when Rollout-GDRO gives the two ranks
    different numbers of rows (and under FSDP, different numbers of micro-batches)."""
    single, ranks = step_runs(case)
    _assert_same_update(single, ranks)
    states = [(ranks / f"curriculum-{r}.json").read_text() for r in (0, 1)]
    assert states[0] == states[1]  # bit for bit
    expected = json.loads((single / "curriculum-0.json").read_text())
    _assert_nested_close(expected, json.loads(states[0]), atol=1e-6)
    assert expected["classifier"]["history"] != {}
    rows = [json.loads((ranks / f"rows-{r}.json").read_text()) for r in (0, 1)]
    one = json.loads((single / "rows-0.json").read_text())
    assert [a + b for a, b in zip(*rows, strict=True)] == one == [16, 16]
    if STEP_CASES[case]["curriculum"] == "rollout_gdro":
        assert rows[0][0] != rows[1][0]  # 2 prompts x 2 rollouts vs 2 x 6
    else:
        assert rows[0] == rows[1]


@pytest.mark.slow
def test_ppo_two_ranks_match_one_process(step_runs):
    """PPO under DDP: policy and critic after 2 steps equal one process on the global batch
    (advantages whitened over the global batch, token means over its tokens)."""
    single, ranks = step_runs(CASE_OF_TEST["test_ppo_two_ranks_match_one_process"])
    _assert_same_update(single, ranks)
    params = torch.load(single / "params.pt")
    assert any(k.startswith("critic.backbone.") for k in params)


@pytest.mark.slow
def test_lora_fsdp_two_ranks_match_one_process(step_runs):
    """LoRA under FSDP2: the adapters after 2 steps equal one process's (the frozen base
    weights stay equal too; the reference is the adapter-disabled model)."""
    single, ranks = step_runs(CASE_OF_TEST["test_lora_fsdp_two_ranks_match_one_process"])
    _assert_same_update(single, ranks)
    grads = torch.load(single / "grads.pt")
    assert grads and all("lora_" in k for k in grads)


@pytest.mark.slow
def test_torchrun_cli_trains_logs_once_and_resumes(tmp_path):
    out = tmp_path / "run"
    cmd = _torchrun(
        "-m", "groupwise", "train", "--model", "tiny-random", "--num_train_prompts", "16",
        "--num_eval_prompts", "0", "--num_generations", "4", "--per_device_train_batch_size",
        "8", "--max_completion_length", "5", "--learning_rate", "1e-3", "--save_steps", "1",
        "--disable_tqdm", "true", "--logging_steps", "1", "--gradient_checkpointing", "false",
        "--output_dir", str(out), "--max_steps", "2",
    )  # fmt: skip
    _run(cmd, tmp_path)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # rank 0 alone writes
    state = torch.load(out / "checkpoint-2" / "training_state.pt", weights_only=True)
    assert len(state["rng"]) == 2  # each rank's sampling generator
    done = _run([*cmd[:-1], "3", "--resume"], tmp_path)
    assert "resumed from" in done.stdout + done.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]


@pytest.mark.slow
def test_torchrun_fsdp_cli_saves_full_weights_and_resumes(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from groupwise.runtime.models import load_model_and_tokenizer

    out = tmp_path / "run"
    cmd = _torchrun(
        "-m", "groupwise", "train", "--model", "tiny-random", "--num_train_prompts", "16",
        "--num_eval_prompts", "4", "--eval_steps", "2", "--num_generations", "4",
        "--per_device_train_batch_size", "8", "--max_completion_length", "5",
        "--learning_rate", "1e-3", "--beta", "0.04", "--save_steps", "1",
        "--data_parallel", "fsdp", "--disable_tqdm", "true", "--logging_steps", "1",
        "--gradient_checkpointing", "false", "--output_dir", str(out), "--max_steps", "2",
    )  # fmt: skip
    _run(cmd, tmp_path)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 2]  # two steps, then the final evaluation
    assert "eval/reward" in rows[-1]
    state = torch.load(out / "checkpoint-2" / "training_state.pt", weights_only=True)
    assert len(state["rng"]) == 2
    # The optimizer state is the full one, keyed by parameter name.
    exp_avg = {k: v["exp_avg"] for k, v in state["optimizer"]["state"].items()}
    assert "model.embed_tokens.weight" in exp_avg
    step2 = load_file(out / "checkpoint-2" / "model.safetensors")
    done = _run([*cmd[:-1], "3", "--resume"], tmp_path)
    assert "resumed from" in done.stdout + done.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    # The final model is the full one, in Hugging Face format, and it was trained.
    reference, _ = load_model_and_tokenizer("tiny-random", None, seed=42)
    trained = AutoModelForCausalLM.from_pretrained(out)
    final = load_file(out / "model.safetensors")
    for name, param in reference.state_dict().items():
        if name in final:
            assert final[name].shape == param.shape, name
    assert exp_avg["model.embed_tokens.weight"].shape == reference.model.embed_tokens.weight.shape
    trained_state = trained.state_dict()
    assert trained_state.keys() == reference.state_dict().keys()
    for name, param in reference.state_dict().items():
        assert trained_state[name].shape == param.shape, name
    assert step2.keys() == final.keys()
    assert "lm_head.weight" not in final  # tied to the embeddings: saved once, as HF does


# Real generation and a reward with variance (the share of even token ids), so that each step
# changes the weights; train() with checkpoints every step, optionally resuming.
RESUME_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from groupwise import GRPOConfig, GRPOTrainer, PPOTrainer

    def even_tokens(completions, completion_ids, **kw):
        return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]

    def run(out, overrides):
        num_prompts = overrides.pop("num_prompts", 16)
        rows = [{"prompt": f"Problem number {i}: add {i} and {2 * i}."}
                for i in range(num_prompts)]
        options = dict(model="tiny-random", learning_rate=1e-3, beta=0.04, num_generations=4,
                       per_device_train_batch_size=8, max_completion_length=6, seed=0,
                       save_steps=1, disable_tqdm=True, data_parallel="fsdp", output_dir=out,
                       loss_type="grpo", use_bias_correction_kl=False, logging_steps=1,
                       lr_scheduler_type="constant", gradient_checkpointing=False)
        args = GRPOConfig(**{**options, **overrides})
        cls = PPOTrainer if args.algorithm == "ppo" else GRPOTrainer
        cls("tiny-random", even_tokens, rows, args=args).train()
        open(os.path.join(out, f"trained-to-{args.max_steps}"), "w").close()

    # argv[1]: the jobs, [output folder, overrides] pairs, one after another (as in SCRIPT).
    for out, overrides in json.loads(sys.argv[1]):
        run(out, overrides)
    """
)


# The runs that must resume exactly: their options and the weights file compared.
RESUME_CASES = {
    "fsdp": ({}, "model.safetensors"),
    # Ranks hold different numbers of rows once prompts fall into different bins.
    "fsdp-rollout_gdro": (
        {
            "curriculum": "rollout_gdro",
            # Sampled bandit arms: the draws' generator goes through the checkpoint too.
            # The paper's classifier (pass@n, unseen prompts in bin 0) splits these prompts
            # into both bins, which the per-rollout fraction at threshold 0.7 does not.
            "rollout_allocator": "bandit",
            "gdro_classifier_signal": "any_correct",
            "gdro_unseen": "hardest",
            "gdro_num_bins": 2,
            "gdro_correct_threshold": 0.7,
            "num_prompts": 4,
        },
        "model.safetensors",
    ),
    # No LoRA dropout: its masks come from the global RNG, which checkpoints do not keep.
    "fsdp-lora": ({"use_peft": True, "lora_dropout": 0.0}, "adapter_model.safetensors"),
    # The critic (its weights and optimizer) goes through the checkpoint as well.
    "ddp-ppo": ({"algorithm": "ppo", "data_parallel": "ddp"}, "critic/model.safetensors"),
}


@pytest.fixture(scope="session")  # as step_runs
def resume_runs(request, tmp_path_factory):
    """For every selected RESUME_CASES case, 3 steps straight, and 2 steps then a resume to 3 in
    a new torchrun job; two launches in all (the straight runs and first halves, then the
    resumes) instead of three per case. Returns a function of the case name that gives the
    folders of the straight and the resumed run, and the resuming launch's output."""
    names = _selected_cases(request, RESUME_CASES, __name__)
    root = tmp_path_factory.mktemp("resume")
    script = root / "train.py"
    script.write_text(RESUME_SCRIPT)
    first, second = [], []
    for i, name in enumerate(names):
        options = RESUME_CASES[name][0]
        first.append((root / f"case{i}" / "straight", {**options, "max_steps": 3}))
        first.append((root / f"case{i}" / "resumed", {**options, "max_steps": 2}))
        resume = {**options, "max_steps": 3, "resume_from_checkpoint": "auto"}
        second.append((root / f"case{i}" / "resumed", resume))
    launches = [Launch(_torchrun(str(script)), first, root)]
    launches.append(Launch(_torchrun(str(script)), second, root))

    def runs(name: str) -> tuple[Path, Path, str]:
        case = root / f"case{names.index(name)}"
        straight = launches[0].check(case / "straight", "trained-to-3")
        launches[0].check(case / "resumed", "trained-to-2")
        resumed = launches[1].check(case / "resumed", "trained-to-3")
        return straight, resumed, launches[1].output

    return runs


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_torchrun_resume_matches_an_uninterrupted_run(resume_runs, case):
    from safetensors.torch import load_file

    options, weights_file = RESUME_CASES[case]
    straight, resumed, output = resume_runs(case)
    assert f"resumed from {resumed / 'checkpoint-2'} at step 2" in output
    if "curriculum" in options:  # the curriculum state went through the checkpoint too
        rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
        assert any(  # some step gave prompts other than 4 rollouts (so ranks held unequal rows)
            r[f"curriculum/rollouts_bin_{b}"] != 4 * r[f"curriculum/prompts_bin_{b}"]
            for r in rows
            for b in (0, 1)
        )
        states = [
            torch.load(run / "checkpoint-3" / "training_state.pt", weights_only=True)
            for run in (straight, resumed)
        ]
        assert states[0]["curriculum"] == states[1]["curriculum"]
    if weights_file.startswith("critic/"):  # the checkpoint holds the full critic state
        state = torch.load(straight / "checkpoint-3" / "training_state.pt", weights_only=True)
        critic = state["extra"]["critic"]
        assert critic.keys() == load_file(straight / weights_file).keys()
        weights = [
            torch.load(straight / f"checkpoint-{s}" / "training_state.pt", weights_only=True)[
                "extra"
            ]["critic"]
            for s in (1, 2, 3)
        ]
    else:
        weights = [load_file(straight / f"checkpoint-{s}" / weights_file) for s in (1, 2, 3)]
    assert all(
        any(not torch.equal(a[k], b[k]) for k in a)
        for a, b in zip(weights, weights[1:], strict=False)
    )
    a, b = load_file(straight / weights_file), load_file(resumed / weights_file)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)


@pytest.mark.slow
def test_torchrun_fsdp_matches_ddp_with_real_generation(tmp_path):
    """Generation, evaluation and the old log-probs (num_iterations=2) call the unwrapped model
    under FSDP (gathered weights): the update must equal DDP's."""
    from safetensors.torch import load_file

    script = tmp_path / "train.py"
    script.write_text(RESUME_SCRIPT)
    out = {mode: tmp_path / mode for mode in ("ddp", "fsdp")}
    # one generation batch of two passes: max_steps counts its 2 optimizer steps
    options = {"max_steps": 2, "num_iterations": 2, "save_steps": 0, "learning_rate": 1e-4}
    jobs = [[str(out[mode]), {**options, "data_parallel": mode}] for mode in out]
    _run(_torchrun(str(script), json.dumps(jobs)), tmp_path)  # both runs in one launch
    a, b = load_file(out["ddp"] / "model.safetensors"), load_file(out["fsdp"] / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-6, msg=key)
    rows = {m: json.loads((out[m] / "metrics.jsonl").read_text().splitlines()[0]) for m in out}
    assert rows["ddp"]["grad_norm"] > 0
    for key in ("reward", "completions/mean_length", "kl"):
        assert rows["fsdp"][key] == pytest.approx(rows["ddp"][key], abs=1e-6), key


def test_ppo_with_fsdp_is_refused(tmp_path, monkeypatch):
    """The critic is replicated with DDP only: ppo + fsdp under torchrun is a ConfigError,
    raised before anything is loaded (a world of two is faked; no process group is joined)."""
    import groupwise.trainer.base as run_module
    from groupwise import GRPOConfig, PPOTrainer
    from groupwise.errors import ConfigError
    from groupwise.runtime.distributed import DistributedContext

    monkeypatch.setattr(
        run_module, "init_distributed", lambda device: DistributedContext(world_size=2)
    )
    args = GRPOConfig(model="tiny-random", algorithm="ppo", data_parallel="fsdp",
                      output_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ConfigError, match="algorithm=ppo with data_parallel=fsdp"):
        PPOTrainer("tiny-random", lambda completions, **kw: [0.0] * len(completions),
                   [{"prompt": "x"}], args=args)  # fmt: skip


@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_two_ranks_take_several_optimizer_steps_per_generation(tmp_path, data_parallel):
    """steps_per_generation under torchrun: each rank cuts its share of the generation batch
    into the same number of mini-batches (global mini-batch j = every rank's j-th block, as in
    TRL), every mini-batch is one optimizer step with collectives in step, and the logged
    compute counts are the global batch's."""
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    # Per rank: 4 prompts x 4 completions, micro-batches of 4, 2 per optimizer step: 2 steps.
    options = {"data_parallel": data_parallel, "per_device_train_batch_size": 4,
               "gradient_accumulation_steps": 2, "steps_per_generation": 4,
               "max_steps": 2}  # the generation batch's 2 optimizer steps  # fmt: skip
    _run(_torchrun(str(script), json.dumps([[str(tmp_path), options]])), tmp_path)
    logs = json.loads((tmp_path / "logs.json").read_text())
    assert logs["compute/optimizer_steps"] == 2
    assert logs["compute/rollouts"] == 2 * 16  # both ranks' completions
    assert [json.loads((tmp_path / f"rows-{r}.json").read_text()) for r in (0, 1)] == [[16]] * 2
    params = torch.load(tmp_path / "params.pt")
    assert all(torch.isfinite(p).all() for p in params.values())


# SCRIPT with the collectives checked (tests/collective_check.py): init_distributed believes it
# runs on CUDA while it creates the process group, which then joins over gloo; every collective
# groupwise issues afterwards must be one the backend asked for serves.
CHECKED_SCRIPT = (
    textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        import groupwise.trainer.base  # imports init_distributed by name: patched there too
        import collective_check
        collective_check.install()
        """
    )
    + SCRIPT
    + "\ncollective_check.write(json.loads(sys.argv[1])[0][0])\n"
)


@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
def test_collectives_fit_the_process_group_of_a_cuda_run(tmp_path, data_parallel):
    """A step with the reference (beta > 0), batch-scaled rewards and Rollout-GDRO (ranks hold
    different row counts, and under FSDP run different numbers of micro-batches) on two ranks
    that created their process group as a CUDA run does: every count, flag, metric and object
    groupwise exchanges is a host tensor, which that group must serve (NCCL alone does not),
    and objects are pickled into host memory, not moved to the GPU and back."""
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    from groupwise.curriculum.base import PromptSampler

    script = tmp_path / "step.py"
    script.write_text(CHECKED_SCRIPT)
    options = {"data_parallel": data_parallel, "scale_rewards": "batch",
               "curriculum": "rollout_gdro", "easy_prompts": PromptSampler(8, seed=0).take(2),
               "rollout_allocator": "bandit", "rollout_arm_choice": "greedy",
               "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}  # fmt: skip
    _run(_torchrun(str(script), json.dumps([[str(tmp_path), options]])), tmp_path)
    rows = [json.loads((tmp_path / f"rows-{r}.json").read_text()) for r in (0, 1)]
    assert rows[0] != rows[1]  # 2 prompts x 2 rollouts vs 2 x 6
    expected = {"all_reduce_sum", "any_rank", "reduce_metrics", "all_gather_objects"}
    if data_parallel == "fsdp":
        expected |= {"max_over_ranks", "shard_fsdp"}
    for rank in (0, 1):
        report = json.loads((tmp_path / f"collectives-{rank}.json").read_text())
        assert report["backend"] is not None, "init_distributed did not create the group"
        violations = "\n".join(
            f"{v['op']} x{v['count']} ({v['why']}): {v['site']}" for v in report["violations"]
        )
        assert not report["violations"], f"backend {report['backend']!r}:\n{violations}"
        # The GPU's collectives (DDP's and FSDP2's gradients and weights) stay on NCCL.
        assert BackendConfig(Backend(report["backend"])).get_device_backend_map()["cuda"] == "nccl"
        assert report["set_device"] == [rank]  # each rank on its own GPU
        assert report["device_id"] == f"cuda:{rank}"
        # the function that issued each collective (runtime/distributed.py's, or FSDP's
        # sharding in policy/parallel.py)
        helpers = {site.split(" <- ")[0].split(":", 1)[1] for site in report["calls"]}
        assert expected <= helpers, report["calls"]
        assert any("curriculum" in site for site in report["calls"]), report["calls"]
        if data_parallel == "fsdp":  # FSDP2's own collectives went through the wrapper too
            assert report["torch_calls"], report


@pytest.mark.parametrize(
    "device,cuda,backend,gpu",
    [
        ("auto", True, "cpu:gloo,cuda:nccl", 1),
        ("cuda", True, "cpu:gloo,cuda:nccl", 1),
        # Under torchrun every rank takes cuda:LOCAL_RANK: one index in the shared config would
        # put all ranks on one GPU.
        ("cuda:0", True, "cpu:gloo,cuda:nccl", 1),
        ("auto", False, "gloo", None),
        ("cpu", True, "gloo", None),
        # No CUDA: resolve_device reports device=cuda just after, with its own message.
        ("cuda", False, "gloo", None),
    ],
    ids=["auto-gpu", "cuda", "cuda:0", "auto-no-gpu", "cpu-on-gpu-machine", "cuda-no-gpu"],
)
def test_init_distributed_asks_for_the_backend_of_the_device(
    monkeypatch, device, cuda, backend, gpu
):
    """In process: the backend, set_device and device_id that init_distributed asks for on
    rank 1 of 2 (no process group is created)."""
    import torch.distributed as dist

    from groupwise.runtime.distributed import DistributedContext, init_distributed

    calls: dict = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.setdefault("set_device", i))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.update(kw))
    ctx = init_distributed(device)
    assert ctx == DistributedContext(rank=1, world_size=2, local_rank=1)
    assert calls["backend"] == backend
    assert calls.get("set_device") == gpu
    assert calls.get("device_id") == (None if gpu is None else torch.device("cuda", gpu))


def test_backend_for_serves_host_and_gpu_tensors():
    """As torch reads the backend strings: on CUDA, host tensors go to gloo and GPU tensors to
    NCCL; on the CPU everything goes to gloo."""
    from collective_check import object_device, served_devices
    from groupwise.runtime.distributed import backend_for

    assert served_devices(backend_for("cuda")) == {"cpu": "gloo", "cuda": "nccl"}
    assert object_device(backend_for("cuda")) == "cpu"
    assert served_devices(backend_for("cpu"))["cpu"] == "gloo"
    assert served_devices("nccl") == {"cuda": "nccl"}  # what the check holds NCCL alone to


def test_fsdp_mixed_precision_gathers_bf16_and_keeps_fp32_master_weights(tmp_path):
    """bf16 autocast under FSDP2: the shards (and the saved model) stay fp32 while layers are
    all-gathered in bf16 and gradients reduce-scattered in fp32 (MixedPrecisionPolicy). One
    AdamW step at learning_rate 1e-6 moves every element by at most the learning rate (Adam's
    first step is lr * m / sqrt(v), |m / sqrt(v)| <= 1): the update landed in fp32, not rounded
    to a bf16 grid (whose steps near these weights are ~1e-4), exactly as under DDP."""
    from safetensors.torch import load_file

    from groupwise.runtime.models import tiny_random_model

    script = tmp_path / "train.py"
    script.write_text(RESUME_SCRIPT)
    start = tiny_random_model(seed=0).state_dict()
    lr = 1e-6
    options = {"max_steps": 1, "save_steps": 0, "beta": 0.0, "learning_rate": lr,
               "bf16_autocast": True}  # fmt: skip
    jobs = [[str(tmp_path / mode), {**options, "data_parallel": mode}] for mode in ("ddp", "fsdp")]
    _run(_torchrun(str(script), json.dumps(jobs)), tmp_path)  # both runs in one launch
    for mode in ("ddp", "fsdp"):
        out = tmp_path / mode
        weights = load_file(out / "model.safetensors")
        assert weights.keys() <= start.keys() and len(weights) > 10
        for key, value in weights.items():
            assert value.dtype == torch.float32, (mode, key)
            step = (value - start[key]).abs()
            assert (step > 0).float().mean().item() >= 0.99, (mode, key)
            # fp32 rounding of the result adds at most half an ulp of the weight itself.
            ulp = torch.finfo(torch.float32).eps * start[key].abs()
            assert bool((step <= lr * 1.001 + ulp).all()), (mode, key, float(step.max()))
        row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        assert math.isfinite(row["loss"]) and row["grad_norm"] > 0, mode


MIXED_PRECISION_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    import torch.distributed as dist
    from groupwise.policy.parallel import fsdp_full_weights, shard_fsdp
    from groupwise.runtime.distributed import DistributedContext
    from groupwise.runtime.models import tiny_random_model

    dist.init_process_group("gloo", rank=0, world_size=1)
    out = {}
    for bf16 in (False, True):
        model = tiny_random_model(seed=0)
        root = shard_fsdp(model, DistributedContext(), torch.device("cpu"), bf16_compute=bf16)
        q = model.model.layers[0].self_attn.q_proj.weight
        with fsdp_full_weights(root):
            gathered = str(model.model.layers[0].self_attn.q_proj.weight.dtype)
        out[str(bf16)] = {"shard": str(q.dtype), "gathered": gathered}
    dist.destroy_process_group()
    print(json.dumps(out))
    """
)


def test_fsdp_mixed_precision_policy_gathers_in_bf16_over_fp32_shards(tmp_path):
    script = tmp_path / "shard.py"
    script.write_text(MIXED_PRECISION_SCRIPT)
    with socket.socket() as probe:  # a free port for the one-process group
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["False"] == {"shard": "torch.float32", "gathered": "torch.float32"}
    assert out["True"] == {"shard": "torch.float32", "gathered": "torch.bfloat16"}


EXIT_SCRIPT = textwrap.dedent(
    """
    import atexit
    import os

    import torch
    import torch.distributed as dist

    from groupwise.runtime.distributed import all_reduce_sum, init_distributed

    # Each rank writes its own file (the ranks share stdout, where lines can interleave).
    path = f"rank-{os.environ['RANK']}.txt"

    def write(line):
        with open(path, "a") as f:
            f.write(line + "\\n")

    # atexit runs handlers last-registered first: this one, registered before the group exists,
    # runs after anything init_distributed registers.
    atexit.register(lambda: write(f"group at exit: {dist.is_initialized()}"))
    ctx = init_distributed("cpu")
    total = all_reduce_sum(torch.tensor([ctx.rank + 1.0]), ctx)
    write(f"rank {ctx.rank} of {ctx.world_size}: sum {total.item():g}")
    """
)


@pytest.mark.slow
def test_torchrun_ranks_destroy_the_process_group_before_they_exit(tmp_path):
    script = tmp_path / "leave.py"
    script.write_text(EXIT_SCRIPT)
    _run(_torchrun(str(script)), tmp_path)
    for rank in (0, 1):
        # Both ranks left the group in an atexit handler, before the interpreter's teardown.
        assert (tmp_path / f"rank-{rank}.txt").read_text().splitlines() == [
            f"rank {rank} of 2: sum 3",
            "group at exit: False",
        ]
