"""groupwise's GRPOTrainer against TRL's, side by side, on the same GRPO config.

Needs TRL, which this script does not install: ``pip install trl==1.16.0`` works here next to
torch 2.13 / transformers 5.23 (it only adds datasets, pandas, pyarrow, dill, multiprocess; pin
the installed torch/transformers/safetensors/accelerate/numpy with ``-c constraints.txt`` to be
sure nothing is moved).

Same for both trainers: model weights (one local HF folder, fp32, CPU), the arithmetic task
(2-operand one-digit problems with the worked-example chat prompt; a ``datasets.Dataset`` for
TRL), the reward callables ``format_reward`` + ``accuracy_reward`` (TRL's signature), 8
generations x 2 prompts = 16 completions per step, one generation and one optimizer step per
step, max completion length, temperature 1.0, beta, loss_type, lr 1e-5 (constant, no warm-up),
epsilon 0.2, grad-norm clip 1.0, no gradient checkpointing (TRL's default is on; groupwise's is
off), seed. TRL: ``use_cpu=True, bf16=False``, no vLLM, ``report_to="none"``, logging every step
like groupwise, no completion logging, no saving; its own optimizer default (fused AdamW);
``use_bias_correction_kl=False`` (TRL's default True multiplies the KL by the ratio, which
changes the gradient whenever beta > 0; groupwise's objective is the plain k3 penalty).

Timing. Each (trainer, model, beta) run is a fresh subprocess, so peak RSS (VmHWM:
imports, model, reference, optimizer state and activations) does not mix; subprocesses are
launched in ABAB order (groupwise, TRL, groupwise, TRL, ...), each running one warm-up step
(discarded) and then its share of ``--steps``. Per step:

- total: wall time between the ends of consecutive steps in the trainer's own ``train()`` loop
  (so loop overhead, data loading and logging count);
- gen: TRL's ``_generate`` (prompt templating + ``model.generate`` + decoding), groupwise's
  ``time/generation`` (templating + its sampler + decoding);
- update: total - gen (reward scoring, reference log-probs, forward/backward, optimizer);
- tokens/s: completion tokens actually generated / gen seconds.

Medians over all measured steps. MFU = model FLOPs / seconds / this machine's matmul peak,
measured at the start of the run (``torch.matmul`` of square fp32 / bf16 matrices, best of
several repeats; measured again at the end and printed, for the drift). Model FLOPs count
the matmul parameters N (every ``nn.Linear`` weight, the tied LM head included, the embedding
gather excluded) and only the work the batch requires: each prompt once (P = unique prompt
tokens) plus every completion token (C):
generation 2 N (P + C); update 6 N (P + C), plus 2 N (P + C) for the reference forward when
beta > 0. Attention score/value FLOPs are not counted (under 5% at these lengths). A trainer
that recomputes a prompt per completion does that work on top, which lowers its MFU.

Equivalence (``--check``): one batch of 2 prompts x 8 completions sampled by groupwise's
sampler; TRL gets the same completion token ids through its own ``_generate_and_score_completions``
(its prompt templating, reward calls, advantages, reference log-probs), then ``compute_loss``;
groupwise runs its train-step path (shared-prompt log-probs, ``group_advantages``,
``policy_loss``). A third reward (completion length / 100) is added for this check only, so
that advantages are non-zero even for the random model. Printed: max |diff| of advantages,
per-token log-probs, loss and every parameter gradient, for loss_type grpo, dapo, dr_grpo and
each beta.

    python benchmarks/vs_trl.py [--models tiny-random,smollm2-135m-instruct] [--steps 6]
        [--rounds 2] [--completion-length 48] [--betas 0.0,0.04] [--loss-type grpo]
        [--check] [--skip-timing] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEARNING_RATE = 1e-5
NUM_GENERATIONS = 8
PROMPTS_PER_STEP = 2
SEED = 0
PERTURBATION = 0.05  # --check: policy = reference + this x mean|w| x N(0, 1), per parameter


# ----------------------------------------------------------------------------------------------
# Shared helpers (imported lazily so the parent stays light)


def model_dir(name: str, root: Path) -> Path:
    """A local HF folder for ``name``, the one both trainers load (TRL builds its reference
    model from a path)."""
    from groupwise.runtime.models import smollm2_path

    if name == "smollm2-135m-instruct":
        return smollm2_path()
    if name == "tiny-random":
        target = root / "tiny-random"
        if not (target / "config.json").exists():
            from groupwise.runtime.models import load_model_and_tokenizer

            model, tok = load_model_and_tokenizer("tiny-random", seed=SEED)
            model.save_pretrained(target)
            tok.save_pretrained(target)
        return target
    return Path(name)


def dataset_rows(n: int = 200) -> list[dict]:
    from groupwise.tasks.arithmetic import arithmetic_dataset

    rows = arithmetic_dataset(n, "train", seed=SEED)
    return [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]


def matmul_params(model) -> int:
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MB, from /proc/self/status (VmRSS, VmHWM).
    Not ``ru_maxrss``: Linux carries that over ``execve`` from the parent, so a subprocess would
    report the parent's peak if it was higher."""
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line.split(":")[0]] = int(line.split()[1]) / 1024
    return values["VmRSS"], values["VmHWM"]


def length_reward(prompts, completions, **kwargs):
    """Completion length / 100: only used by --check, so that advantages are non-zero."""
    from groupwise.rewards import completion_text

    return [len(completion_text(c)) / 100 for c in completions]


def groupwise_config(path: Path, opts, beta: float, loss_type: str, steps: int, out: str):
    from groupwise import GRPOConfig

    return GRPOConfig(
        model=str(path), output_dir=out, max_steps=steps, seed=SEED, device="cpu",
        dtype="float32", num_generations=NUM_GENERATIONS,
        per_device_train_batch_size=NUM_GENERATIONS * PROMPTS_PER_STEP,
        gradient_accumulation_steps=1, max_completion_length=opts.completion_length,
        temperature=1.0, beta=beta, loss_type=loss_type, learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, epsilon=0.2,
        gradient_checkpointing=False, logging_steps=1, save_steps=0, disable_tqdm=True,
        report_to=[], use_bias_correction_kl=False,  # as the TRL side sets it
    )  # fmt: skip


def trl_config(opts, beta: float, loss_type: str, steps: int, out: str):
    import torch
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out, max_steps=steps, seed=SEED, use_cpu=True, bf16=False,
        model_init_kwargs={"dtype": torch.float32}, num_generations=NUM_GENERATIONS,
        per_device_train_batch_size=NUM_GENERATIONS * PROMPTS_PER_STEP,
        gradient_accumulation_steps=1, steps_per_generation=1,
        max_completion_length=opts.completion_length, temperature=1.0, beta=beta,
        loss_type=loss_type, learning_rate=LEARNING_RATE, lr_scheduler_type="constant",
        warmup_steps=0, max_grad_norm=1.0, epsilon=0.2, gradient_checkpointing=False,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        log_completions=False, use_vllm=False, dataloader_num_workers=0,
        # TRL 1.16 defaults to multiplying the k3 KL by the (differentiable, value-1) ratio, which
        # adds beta * k3 * grad(logp) to the gradient (DeepSeek-V3.2). groupwise implements the
        # plain k3 penalty of DeepSeekMath, so the same objective needs this off.
        use_bias_correction_kl=False,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Timing workers (one subprocess each)


def worker_groupwise(opts) -> dict:
    import groupwise.rollout.hf as gt  # the engine's generation
    from groupwise import GRPOTrainer
    from groupwise.rewards import accuracy_reward, format_reward
    from groupwise.runtime.models import load_model_and_tokenizer

    counts: list[tuple[int, int]] = []
    original_generate = gt.generate

    def counting_generate(*args, **kwargs):
        rollout = original_generate(*args, **kwargs)
        counts.append((int(rollout.prompt_mask.sum()), int(rollout.completion_mask.sum())))
        return rollout

    gt.generate = counting_generate
    with tempfile.TemporaryDirectory() as out:
        args = groupwise_config(
            Path(opts.path), opts, opts.beta, opts.loss_type, opts.worker_steps, out
        )
        model, tok = load_model_and_tokenizer(opts.path)
        trainer = GRPOTrainer(
            model, [format_reward, accuracy_reward], dataset_rows(), args=args,
            processing_class=tok,
        )  # fmt: skip
        setup_rss = rss_mb()[0]
        ends: list[float] = []
        gens: list[float] = []
        original_step = trainer.train_step

        def timed_step():
            logs = original_step()
            ends.append(time.perf_counter())
            gens.append(logs["time/generation"])
            return logs

        trainer.train_step = timed_step
        start = time.perf_counter()
        trainer.train()
    steps = []
    for i, end in enumerate(ends):
        previous = ends[i - 1] if i else start
        steps.append(
            {"total": end - previous, "gen": gens[i], "prompt_tokens": counts[i][0],
             "completion_tokens": counts[i][1]}
        )  # fmt: skip
    return {"steps": steps, "setup_rss_mb": setup_rss, "n_params": matmul_params(model)}


def worker_trl(opts) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from groupwise.rewards import accuracy_reward, format_reward
    from groupwise.runtime.models import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(opts.path)
    ends: list[float] = []

    class StepEnd(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = trl_config(opts, opts.beta, opts.loss_type, opts.worker_steps, out)
        trainer = GRPOTrainer(
            model=str(opts.path), reward_funcs=[format_reward, accuracy_reward], args=args,
            train_dataset=Dataset.from_list(dataset_rows()), processing_class=tok,
            callbacks=[StepEnd()],
        )  # fmt: skip
        setup_rss = rss_mb()[0]
        gens: list[tuple[float, int, int]] = []
        original_generate = trainer._generate

        def timed_generate(prompts):
            t0 = time.perf_counter()
            result = original_generate(prompts)
            prompt_ids, completion_ids = result[0], result[1]
            unique_prompt_tokens = sum(len(p) for p in prompt_ids) // NUM_GENERATIONS
            gens.append(
                (
                    time.perf_counter() - t0,
                    unique_prompt_tokens,
                    sum(len(c) for c in completion_ids),
                )
            )
            return result

        trainer._generate = timed_generate

        class StepBegin(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                ends.append(time.perf_counter())  # the first interval starts here

        trainer.add_callback(StepBegin())
        trainer.train()
        n_params = matmul_params(trainer.model)
    steps = []
    for i in range(1, len(ends)):
        gen, p_tok, c_tok = gens[i - 1]
        steps.append(
            {"total": ends[i] - ends[i - 1], "gen": gen, "prompt_tokens": p_tok,
             "completion_tokens": c_tok}
        )  # fmt: skip
    return {"steps": steps, "setup_rss_mb": setup_rss, "n_params": n_params}


def run_worker(opts) -> None:
    import torch

    result = (worker_groupwise if opts.worker == "groupwise" else worker_trl)(opts)
    result["peak_rss_mb"] = rss_mb()[1]
    result["threads"] = torch.get_num_threads()
    print("RESULT " + json.dumps(result))


def launch(trainer: str, path: Path, opts, beta: float, steps: int) -> dict:
    command = [
        sys.executable, __file__, "--worker", trainer, "--path", str(path),
        "--beta", str(beta), "--loss-type", opts.loss_type, "--worker-steps", str(steps),
        "--completion-length", str(opts.completion_length),
    ]  # fmt: skip
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise RuntimeError(f"{trainer} worker failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


# ----------------------------------------------------------------------------------------------
# Matmul peak


def matmul_peak(n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """GFLOP/s of an n x n matmul, best of ``repeats`` timed batches, fp32 and bf16."""
    import torch

    peaks = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        torch.matmul(a, b)  # warm-up
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            iters = 3
            for _ in range(iters):
                torch.matmul(a, b)
            best = min(best, (time.perf_counter() - t0) / iters)
        peaks[name] = 2 * n**3 / best / 1e9
    return peaks


# ----------------------------------------------------------------------------------------------
# Reporting


def summarise(runs: list[dict], beta: float, peak_fp32: float) -> dict:
    steps = [s for run in runs for s in run["steps"][1:]]  # drop each process's warm-up step
    n = runs[0]["n_params"]
    ref = 2 if beta > 0 else 0

    def mfu_gen(s):
        return 2 * n * (s["prompt_tokens"] + s["completion_tokens"]) / s["gen"] / (peak_fp32 * 1e9)

    def mfu_upd(s):
        flops = (6 + ref) * n * (s["prompt_tokens"] + s["completion_tokens"])
        return flops / (s["total"] - s["gen"]) / (peak_fp32 * 1e9)

    med = statistics.median
    return {
        "measured_steps": len(steps),
        "total": med(s["total"] for s in steps),
        "gen": med(s["gen"] for s in steps),
        "update": med(s["total"] - s["gen"] for s in steps),
        "tok_s": med(s["completion_tokens"] / s["gen"] for s in steps),
        "completion_tokens": statistics.mean(s["completion_tokens"] for s in steps),
        "peak_rss": max(r["peak_rss_mb"] for r in runs),
        "setup_rss": max(r["setup_rss_mb"] for r in runs),
        "mfu_gen": med(mfu_gen(s) for s in steps),
        "mfu_update": med(mfu_upd(s) for s in steps),
        "spread_total": (min(s["total"] for s in steps), max(s["total"] for s in steps)),
        "n_params": n,
    }


def print_table(model: str, beta: float, opts, gw: dict, trl: dict, peaks: dict) -> None:
    print(
        f"\n{model}, beta={beta}, loss_type={opts.loss_type}: {PROMPTS_PER_STEP} prompts x "
        f"{NUM_GENERATIONS} completions of up to {opts.completion_length} tokens, fp32 CPU; "
        f"medians over {gw['measured_steps']} (groupwise) / {trl['measured_steps']} (TRL) "
        f"measured steps; N = {gw['n_params'] / 1e6:.2f}M matmul parameters"
    )
    rows = [
        ("s/step total", "total", "{:.2f}"),
        ("s/step generation", "gen", "{:.2f}"),
        ("s/step update", "update", "{:.2f}"),
        ("generated tokens/s", "tok_s", "{:.0f}"),
        ("completion tokens/step", "completion_tokens", "{:.0f}"),
        ("peak RSS (MB)", "peak_rss", "{:.0f}"),
        ("RSS after setup (MB)", "setup_rss", "{:.0f}"),
        ("MFU generation (fp32)", "mfu_gen", "{:.2%}"),
        ("MFU update (fp32)", "mfu_update", "{:.2%}"),
    ]
    print(f"  {'':24s} {'groupwise':>10s} {'TRL':>10s} {'groupwise/TRL':>14s}")
    for label, key, fmt in rows:
        ratio = gw[key] / trl[key] if trl[key] else float("nan")
        print(f"  {label:24s} {fmt.format(gw[key]):>10s} {fmt.format(trl[key]):>10s} {ratio:14.2f}")
    print(
        f"  step-time range: groupwise {gw['spread_total'][0]:.2f}-{gw['spread_total'][1]:.2f} s, "
        f"TRL {trl['spread_total'][0]:.2f}-{trl['spread_total'][1]:.2f} s; "
        f"speed-up TRL/groupwise {trl['total'] / gw['total']:.2f}x; "
        f"matmul peak fp32 {peaks['fp32']:.1f} GFLOP/s, bf16 {peaks['bf16']:.1f} GFLOP/s"
    )


def run_timing(opts, root: Path) -> list[dict]:
    peaks = matmul_peak()
    print(
        f"matmul peak (2048^2, start): fp32 {peaks['fp32']:.1f} GFLOP/s, "
        f"bf16 {peaks['bf16']:.1f} GFLOP/s",
        flush=True,
    )
    per_round = math.ceil(opts.steps / opts.rounds)
    raw = []
    for model in opts.models:
        path = model_dir(model, root)
        for beta in opts.betas:
            runs: dict[str, list[dict]] = {"groupwise": [], "trl": []}
            for r in range(opts.rounds):
                for trainer in ("groupwise", "trl"):  # ABAB
                    t0 = time.perf_counter()
                    result = launch(trainer, path, opts, beta, per_round + 1)
                    runs[trainer].append(result)
                    totals = ", ".join(f"{s['total']:.2f}" for s in result["steps"])
                    print(
                        f"  [{model} beta={beta} round {r + 1}/{opts.rounds}] {trainer:9s} "
                        f"steps (first = warm-up): {totals} s; "
                        f"process {time.perf_counter() - t0:.0f} s",
                        flush=True,
                    )
            # Table as soon as this configuration is done (MFU against the peak measured so far).
            gw = summarise(runs["groupwise"], beta, peaks["fp32"])
            trl = summarise(runs["trl"], beta, peaks["fp32"])
            print_table(model, beta, opts, gw, trl, peaks)
            raw.append({"model": model, "beta": beta, "runs": runs, "peaks": dict(peaks),
                        "summary": {"groupwise": gw, "trl": trl}})  # fmt: skip
            if opts.json:
                Path(opts.json).write_text(json.dumps({"timing": raw}, indent=1, default=str))
    end = matmul_peak()
    print(
        f"\nmatmul peak (2048^2, end): fp32 {end['fp32']:.1f} GFLOP/s, bf16 {end['bf16']:.1f} "
        "GFLOP/s (the tables above use the start measurement)"
    )
    return raw


# ----------------------------------------------------------------------------------------------
# Equivalence check


def check_equivalence(model_name: str, path: Path, opts) -> list[dict]:
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer as TRLTrainer

    from groupwise import GRPOTrainer
    from groupwise.algo.advantages import group_advantages
    from groupwise.algo.grpo import policy_loss
    from groupwise.data.prompts import tokenize_prompts
    from groupwise.rewards import accuracy_reward, format_reward
    from groupwise.rollout import generate
    from groupwise.runtime.models import load_model_and_tokenizer

    rewards = [format_reward, accuracy_reward, length_reward]
    rows = dataset_rows()
    batch_rows = rows[:PROMPTS_PER_STEP]
    results = []
    rollout = None
    for beta in opts.betas:
        for loss_type in ("grpo", "dapo", "dr_grpo"):
            with tempfile.TemporaryDirectory() as out:
                torch.manual_seed(SEED)
                model, tok = load_model_and_tokenizer(str(path))
                gw = GRPOTrainer(
                    model, rewards, rows,
                    args=groupwise_config(path, opts, beta, loss_type, 1, out),
                    processing_class=tok,
                )  # fmt: skip
                if rollout is None:  # one sampled batch for every configuration
                    ids = tokenize_prompts([r["prompt"] for r in batch_rows], tok, 512)
                    rollout = generate(
                        gw.model, tok, ids, NUM_GENERATIONS, gw.sampling, gw.generator
                    )
                trl = TRLTrainer(
                    model=str(path), reward_funcs=rewards,
                    args=trl_config(opts, beta, loss_type, 1, out),
                    train_dataset=Dataset.from_list(rows), processing_class=tok,
                )  # fmt: skip
                # Move both policies off the reference by the same seeded perturbation, so that
                # the KL term (and its gradient) is not zero as it is at the reference itself.
                noise = torch.Generator().manual_seed(SEED + 1)
                with torch.no_grad():
                    trl_params = dict(trl.model.named_parameters())
                    for name, p in gw.model.named_parameters():
                        scale = PERTURBATION * float(p.abs().mean())
                        delta = torch.randn(p.shape, generator=noise) * scale
                        p.add_(delta)
                        trl_params[name].add_(delta)
                completion_lists = [
                    row[: int(n)].tolist()
                    for row, n in zip(rollout.completion_ids, rollout.lengths, strict=True)
                ]
                # groupwise: the loss path of GRPOTrainer.train_step (one micro-batch of 16).
                reward, _ = gw.score(batch_rows, rollout)
                adv_gw = group_advantages(reward, rollout.group_ids, scale=gw.args.scale_rewards)
                rows_all = slice(0, rollout.completion_ids.shape[0])
                mask = rollout.completion_mask.float()
                with torch.no_grad():
                    ref = gw.policy.reference_logprobs(rollout, rows_all) if beta > 0 else None
                gw.model.zero_grad(set_to_none=True)
                logps_gw, _ = gw.policy.logprobs(rollout, rows_all)
                loss_gw, metrics_gw = policy_loss(
                    logps_gw, None, ref, adv_gw, mask, loss_type=loss_type, epsilon_low=0.2,
                    epsilon_high=0.2, beta=beta, max_completion_length=opts.completion_length,
                )  # fmt: skip
                loss_gw.backward()

                # TRL: the same completion token ids through its own scoring and loss.
                trl._generate_single_turn = lambda *a, _ids=completion_lists, **k: (_ids, None)
                trl.model.train()
                trl.current_gradient_accumulation_steps = 1
                repeated = [dict(batch_rows[g]) for g in rollout.group_ids.tolist()]
                inputs = trl._generate_and_score_completions(repeated)
                trl.model.zero_grad(set_to_none=True)
                loss_trl = trl.compute_loss(trl.model, inputs)
                loss_trl.backward()
                with torch.no_grad():
                    logps_trl, _, _ = trl._get_per_token_logps_and_entropies(
                        trl.model,
                        torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
                        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
                        inputs["completion_ids"].shape[1],
                    )

            same_ids = bool(
                torch.equal(inputs["completion_ids"] * inputs["completion_mask"],
                            rollout.completion_ids * rollout.completion_mask)
            )  # fmt: skip
            grad_diff, grad_scale, worst = 0.0, 0.0, ""
            trl_params = dict(trl.model.named_parameters())
            for name, p in gw.model.named_parameters():
                q = trl_params[name]
                g1 = p.grad if p.grad is not None else torch.zeros_like(p)
                g2 = q.grad if q.grad is not None else torch.zeros_like(q)
                diff = float((g1 - g2).abs().max())
                grad_scale = max(grad_scale, float(g1.abs().max()))
                if diff > grad_diff:
                    grad_diff, worst = diff, name
            keep = rollout.completion_mask.bool()
            result = {
                "model": model_name, "beta": beta, "loss_type": loss_type,
                "same_completion_ids": same_ids,
                "adv_diff": float((adv_gw - inputs["advantages"].cpu()).abs().max()),
                "adv_max": float(adv_gw.abs().max()),
                "logp_diff": float((logps_gw.detach() - logps_trl)[keep].abs().max()),
                "loss_gw": loss_gw.item(), "loss_trl": loss_trl.item(),
                "loss_diff": abs(loss_gw.item() - loss_trl.item()),
                "grad_diff": grad_diff, "grad_max": grad_scale, "worst_param": worst,
                "num_items": float(inputs["num_items_in_batch"]), "kl": metrics_gw["kl"],
            }  # fmt: skip
            result["ok"] = result["loss_diff"] < 1e-5 and grad_diff < 1e-5 and same_ids
            results.append(result)
            print(
                f"  {model_name:22s} beta={beta:<5} {loss_type:8s} loss {result['loss_gw']:+.6e} "
                f"vs {result['loss_trl']:+.6e} |d| {result['loss_diff']:.1e}; max|d grad| "
                f"{grad_diff:.1e} (max|grad| {grad_scale:.1e}); |d adv| {result['adv_diff']:.1e}; "
                f"|d logp| {result['logp_diff']:.1e}; kl {result['kl']:.1e}; "
                f"{'OK' if result['ok'] else 'DIFFERS'}",
                flush=True,
            )
    return results


# ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny-random,smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per trainer")
    parser.add_argument("--rounds", type=int, default=2, help="ABAB rounds (processes each)")
    parser.add_argument("--completion-length", type=int, default=48)
    parser.add_argument("--betas", default="0.0,0.04")
    parser.add_argument("--loss-type", default="grpo", choices=["grpo", "dapo", "dr_grpo"])
    parser.add_argument("--check", action="store_true", help="also run the equivalence check")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny-random, 2 steps, 16 tokens")
    parser.add_argument("--json", help="write raw results here")
    parser.add_argument("--worker", choices=["groupwise", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--beta", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--worker-steps", type=int, default=2, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        run_worker(opts)
        return
    if opts.quick:
        opts.models, opts.steps, opts.rounds, opts.completion_length, opts.betas = (
            "tiny-random", 2, 2, 16, "0.0",
        )  # fmt: skip
    opts.models = opts.models.split(",")
    opts.betas = [float(b) for b in opts.betas.split(",")]
    try:
        import trl
    except ImportError:
        sys.exit("this benchmark needs TRL: pip install trl==1.16.0")
    print(f"TRL {trl.__version__}; {os.cpu_count()} CPUs; load average {os.getloadavg()}")
    started = time.perf_counter()
    output: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if opts.check:
            print("\nequivalence (same weights, prompts, sampled completions; threshold 1e-5):")
            output["check"] = [
                r for m in opts.models for r in check_equivalence(m, model_dir(m, root), opts)
            ]
        if not opts.skip_timing:
            output["timing"] = run_timing(opts, root)
    print(f"\nwall time {time.perf_counter() - started:.0f} s; load average {os.getloadavg()}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(output, indent=1, default=str))
    if opts.check and not all(r["ok"] for r in output["check"]):
        sys.exit("equivalence check: some configurations differ (see above)")


if __name__ == "__main__":
    main()
