"""torchrun data parallel on CPU (gloo, 2 processes): one step on 2 ranks gives the gradients and
parameters of one process running the same global batch; the CLI trains, logs once, resumes."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# Runs in each process. Generation is replaced by a deterministic function of the prompt (random
# tokens and lengths from a generator seeded by the prompt), so that the single process and the
# two ranks train on identical completions; everything after generation is the real trainer.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import groupwise.trainer as T
    from groupwise import GRPOConfig, GRPOTrainer
    from groupwise.rollout import Rollout

    def fake_generate(model, tokenizer, prompt_token_ids, num_generations, params, generator=None):
        G, width, pad = num_generations, 6, tokenizer.pad_token_id
        lp = max(len(p) for p in prompt_token_ids)
        prompt_ids = torch.full((len(prompt_token_ids), lp), pad)
        prompt_mask = torch.zeros_like(prompt_ids)
        comps, masks = [], []
        for i, p in enumerate(prompt_token_ids):
            prompt_ids[i, lp - len(p):] = torch.tensor(p)
            prompt_mask[i, lp - len(p):] = 1
            g = torch.Generator().manual_seed(sum(p) * 1009 + len(p))
            ids = torch.randint(5, 200, (G, width), generator=g)
            lengths = torch.randint(1, width + 1, (G,), generator=g)
            m = (torch.arange(width)[None] < lengths[:, None]).long()
            comps.append(ids * m + pad * (1 - m))
            masks.append(m)
        comp, mask = torch.cat(comps), torch.cat(masks)
        return Rollout(prompt_ids, prompt_mask, comp, mask, mask.sum(1) == width,
                       torch.arange(len(prompt_token_ids)).repeat_interleave(G),
                       tokenizer.batch_decode(comp, skip_special_tokens=True))

    T.generate = fake_generate

    def low_tokens(completions, completion_ids, **kw):
        return [sum(t < 100 for t in ids) / max(len(ids), 1) for ids in completion_ids]

    out, overrides = sys.argv[1], json.loads(sys.argv[2])
    rows = [{"prompt": f"Problem number {i}: add {i} and {2 * i}."} for i in range(8)]
    args = GRPOConfig(model="tiny-random", max_steps=1, learning_rate=1e-4, beta=0.04,
                      num_generations=4, max_completion_length=6, seed=0, disable_tqdm=True,
                      output_dir=out, **overrides)
    trainer = GRPOTrainer("tiny-random", low_tokens, rows, args=args)
    main = int(os.environ.get("RANK", "0")) == 0
    sharded = [hasattr(p, "full_tensor") for p in trainer.model.parameters()]
    fsdp = args.data_parallel == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) > 1
    assert all(sharded) if fsdp else not any(sharded)  # one process ignores data_parallel

    def full(t):  # FSDP: gather a DTensor shard into the full tensor (a collective)
        return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()

    real_step = trainer.optimizer.step
    def step(*a, **k):
        grads = {n: full(p.grad) for n, p in trainer.model.named_parameters()}
        if main:
            torch.save(grads, os.path.join(out, "grads.pt"))
        return real_step(*a, **k)
    trainer.optimizer.step = step
    trainer.train_step()
    params = {n: full(p.data) for n, p in trainer.model.named_parameters()}
    if main:
        torch.save(params, os.path.join(out, "params.pt"))
    """
)


def _env():
    src = str(Path(__file__).resolve().parents[1] / "src")
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


@pytest.mark.parametrize("data_parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize(
    "loss_type,scale_rewards", [("grpo", "group"), ("dapo", "batch"), ("dr_grpo", "group")]
)
def test_two_ranks_match_one_process_on_the_global_batch(
    tmp_path, loss_type, scale_rewards, data_parallel
):
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    # The single process is given the same data_parallel value, which it ignores.
    common = {"loss_type": loss_type, "scale_rewards": scale_rewards,
              "data_parallel": data_parallel}  # fmt: skip
    single, ranks = tmp_path / "single", tmp_path / "ranks"
    single.mkdir()
    ranks.mkdir()
    # Global batch: 4 prompts x 4 completions, 2 micro-batches per step on each side.
    one = {**common, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}
    two = {**common, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
    _run([sys.executable, str(script), str(single), json.dumps(one)], tmp_path)
    _run(_torchrun(str(script), str(ranks), json.dumps(two)), tmp_path)
    for name in ("grads.pt", "params.pt"):
        a, b = torch.load(single / name), torch.load(ranks / name)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-6, msg=f"{name} {key}")
    grads = torch.load(single / "grads.pt")
    assert any(g.abs().max() > 1e-4 for g in grads.values())  # a real, non-zero update


def test_torchrun_cli_trains_logs_once_and_resumes(tmp_path):
    out = tmp_path / "run"
    cmd = _torchrun(
        "-m", "groupwise", "train", "--model", "tiny-random", "--num_train_prompts", "16",
        "--num_eval_prompts", "0", "--num_generations", "4", "--per_device_train_batch_size",
        "8", "--max_completion_length", "5", "--learning_rate", "1e-3", "--save_steps", "1",
        "--disable_tqdm", "true", "--output_dir", str(out), "--max_steps", "2",
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


def test_torchrun_fsdp_cli_saves_full_weights_and_resumes(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from groupwise.models import load_model_and_tokenizer

    out = tmp_path / "run"
    cmd = _torchrun(
        "-m", "groupwise", "train", "--model", "tiny-random", "--num_train_prompts", "16",
        "--num_eval_prompts", "4", "--eval_steps", "2", "--num_generations", "4",
        "--per_device_train_batch_size", "8", "--max_completion_length", "5",
        "--learning_rate", "1e-3", "--beta", "0.04", "--save_steps", "1",
        "--data_parallel", "fsdp", "--disable_tqdm", "true", "--output_dir", str(out),
        "--max_steps", "2",
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
    import json, sys
    from groupwise import GRPOConfig, GRPOTrainer

    def even_tokens(completions, completion_ids, **kw):
        return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]

    out, overrides = sys.argv[1], json.loads(sys.argv[2])
    rows = [{"prompt": f"Problem number {i}: add {i} and {2 * i}."} for i in range(16)]
    options = dict(model="tiny-random", learning_rate=1e-3, beta=0.04, num_generations=4,
                   per_device_train_batch_size=8, max_completion_length=6, seed=0,
                   save_steps=1, disable_tqdm=True, data_parallel="fsdp", output_dir=out)
    args = GRPOConfig(**{**options, **overrides})
    GRPOTrainer("tiny-random", even_tokens, rows, args=args).train()
    """
)


def test_torchrun_fsdp_resume_matches_an_uninterrupted_run(tmp_path):
    from safetensors.torch import load_file

    script = tmp_path / "train.py"
    script.write_text(RESUME_SCRIPT)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run(_torchrun(str(script), str(straight), json.dumps({"max_steps": 3})), tmp_path)
    _run(_torchrun(str(script), str(resumed), json.dumps({"max_steps": 2})), tmp_path)
    done = _run(
        _torchrun(
            str(script),
            str(resumed),
            json.dumps({"max_steps": 3, "resume_from_checkpoint": "auto"}),
        ),
        tmp_path,
    )
    assert "resumed from" in done.stdout + done.stderr
    weights = [load_file(straight / f"checkpoint-{s}" / "model.safetensors") for s in (1, 2, 3)]
    assert all(
        any(not torch.equal(a[k], b[k]) for k in a)
        for a, b in zip(weights, weights[1:], strict=False)
    )
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)


def test_torchrun_fsdp_matches_ddp_with_real_generation(tmp_path):
    """Generation, evaluation and the old log-probs (num_iterations=2) call the unwrapped model
    under FSDP (gathered weights): the update must equal DDP's."""
    from safetensors.torch import load_file

    script = tmp_path / "train.py"
    script.write_text(RESUME_SCRIPT)
    out = {}
    for mode in ("ddp", "fsdp"):
        out[mode] = tmp_path / mode
        options = {"data_parallel": mode, "max_steps": 1, "num_iterations": 2, "save_steps": 0,
                   "learning_rate": 1e-4}  # fmt: skip
        _run(_torchrun(str(script), str(out[mode]), json.dumps(options)), tmp_path)
    a, b = load_file(out["ddp"] / "model.safetensors"), load_file(out["fsdp"] / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-6, msg=key)
    rows = {m: json.loads((out[m] / "metrics.jsonl").read_text().splitlines()[0]) for m in out}
    assert rows["ddp"]["grad_norm"] > 0
    for key in ("reward", "completions/mean_length", "kl"):
        assert rows["fsdp"][key] == pytest.approx(rows["ddp"][key], abs=1e-6), key
