"""``groupwise memory --measure``: real training steps that check the plan.

``--measure`` runs real training steps of each algorithm in a fresh subprocess (one per
algorithm, so neither sees the other's peak) and prints the measured peak next to the plan for
the same settings: on the CPU the peak RSS (VmHWM) minus the RSS after imports and the tokenizer,
before the model is loaded; on a GPU ``torch.cuda.max_memory_reserved`` (the
caching allocator's pool, fragmentation included).

Each child is ``python -m groupwise.memory --_child SPEC`` (see :mod:`groupwise.memory.cli`);
it runs :func:`_child_main` and prints one ``GROUPWISE_MEMORY_RESULT`` line of JSON. This is
the only part of the planner that imports torch and the trainers, lazily, in the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .plan import MemoryOptions, generation_dtype, plan_grpo, plan_ppo, total_bytes
from .shapes import shape_from_hf_config
from .units import human_bytes

_RESULT_MARK = "GROUPWISE_MEMORY_RESULT "


def _proc_status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _current_rss() -> int:
    rss = _proc_status_bytes("VmRSS")
    if rss is not None:
        return rss
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak_rss() -> int:
    peak = _proc_status_bytes("VmHWM")
    if peak is not None:
        return peak
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _load_tokenizer(model: str):
    from transformers import AutoTokenizer

    from ..runtime.models import smollm2_path, smollm2_tokenizer

    if model == "tiny-random":
        tok = smollm2_tokenizer()
    elif model == "smollm2-135m-instruct":
        tok = AutoTokenizer.from_pretrained(smollm2_path())
    else:
        tok = AutoTokenizer.from_pretrained(model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Inside the fresh process: baseline, build the trainer on the run's config (its task,
    rewards, dtype and device), run the steps, report the peak."""
    import gc
    import tempfile

    import torch

    from ..config.grpo_config import GRPOConfig
    from ..data.prompts import tokenize_prompts
    from ..wiring.rewards import default_reward_names
    from ..wiring.rows import build_datasets

    if spec["algorithm"] == "ppo":
        from ..trainer.ppo import PPOTrainer as Trainer
    else:
        from ..trainer.grpo import GRPOTrainer as Trainer

    steps = spec["steps"]
    with tempfile.TemporaryDirectory(prefix="groupwise-memory-") as out:
        values = {
            **spec["config"],
            "algorithm": spec["algorithm"],
            "max_steps": steps,
            "num_eval_prompts": 0,
            "eval_task": None,
            "eval_on_start": False,
            "output_dir": out,
            "resume_from_checkpoint": None,
            "report_to": None,
            "save_steps": 0,
            "save_strategy": "no",
            "log_completions_steps": 0,
            "disable_tqdm": True,
            "device": spec["device"],
        }
        config = GRPOConfig.from_dict(values, source="groupwise memory --measure")
        tokenizer = _load_tokenizer(config.model)
        dataset, _ = build_datasets(config)
        prompt_len = max(
            len(ids)
            for ids in tokenize_prompts(
                [r["prompt"] for r in dataset], tokenizer, config.max_prompt_length
            )
        )
        cuda = config.device.startswith("cuda") or (
            config.device == "auto" and torch.cuda.is_available()
        )
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            # Reserved, not allocated: the caching allocator's pool is what the GPU must hold
            # (and what an out-of-memory error is about), fragmentation included.
            baseline = torch.cuda.memory_reserved()
        else:
            baseline = _current_rss()
        trainer = Trainer(config.model, default_reward_names(config), dataset, args=config,
                          processing_class=tokenizer)  # fmt: skip
        completion_len = 0
        for _ in range(steps):
            logs = trainer.train_step()
            completion_len = max(completion_len, int(logs["completions/max_length"]))
        peak = torch.cuda.max_memory_reserved() if cuda else _peak_rss()
        model_config = trainer.model.config.to_dict()
        dtype = str(next(trainer.model.parameters()).dtype)
        # auto resolves in the trainer: the engine it built says which one ran.
        static = type(trainer.engine).__name__ == "StaticEngine"
        engine_dtype = str(trainer.engine.dtype) if static else None
    names = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
    return {
        "algorithm": spec["algorithm"],
        "device": "cuda" if cuda else "cpu",
        "dtype": names.get(dtype, "fp32"),
        # The static engine's own weight copy (None with the other engines).
        "generation_dtype": names.get(engine_dtype, "fp32") if engine_dtype else None,
        "baseline_bytes": baseline,
        "peak_bytes": peak,
        "measured_bytes": peak - baseline,
        "prompt_len": prompt_len,
        "completion_len": completion_len,
        "model_config": {k: model_config.get(k) for k in _HF_KEYS},
        "steps": steps,
    }


def config_for(model: str, opts: MemoryOptions) -> dict[str, Any]:
    """A run's options (GRPOConfig fields) for ``opts`` when no config is given: the arithmetic
    task with its rewards, the trainer's default precision (dtype auto)."""
    return {
        "model": model,
        "task": "arithmetic",
        "per_device_train_batch_size": opts.batch,
        "num_generations": opts.group_size,
        "gradient_accumulation_steps": opts.grad_accum,
        "max_prompt_length": opts.prompt_len,
        "max_completion_length": opts.completion_len,
        "beta": opts.beta,
        "gradient_checkpointing": opts.gradient_checkpointing,
        "logprob_impl": opts.logprob_impl,
        "logprob_chunk_size": opts.logprob_chunk_size,
        "use_peft": opts.lora_r > 0,
        "lora_r": max(opts.lora_r, 1),
        "generation_engine": opts.generation_engine,
    }


_HF_KEYS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "head_dim", "tie_word_embeddings", "attention_bias",
    "model_type", "hidden_act", "mlp_bias", "use_sliding_window", "sliding_window",
)  # fmt: skip


def ppo_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("groupwise.trainer.ppo") is not None
    except (ImportError, ValueError):
        return False


def run_measurement(
    model: str,
    opts: MemoryOptions,
    algorithms: Sequence[str] = ("grpo", "ppo"),
    steps: int = 1,
    device: str = "auto",
    timeout: float = 1800.0,
    config: dict[str, Any] | None = None,
    plans: dict[str, dict[str, int]] | None = None,
) -> list[dict[str, Any]]:
    """Run each algorithm's steps on ``config`` (GRPOConfig fields; None: :func:`config_for`
    ``opts``) in a fresh subprocess. ``predicted_bytes``: with ``plans`` (the table's rows, as
    ``groupwise memory --measure`` passes them) the table's own total, so the measurement is
    compared with the very figure the table shows; without, the plan for what the run really
    did (its weights' dtype, AdamW in that dtype, its prompt and longest completion).
    ``differs`` lists where the real run did not match ``opts`` (dtype, prompt length,
    completions shorter than planned)."""
    results = []
    run_config = config if config is not None else config_for(model, opts)
    for algorithm in algorithms:
        if algorithm == "ppo" and not ppo_available():
            error = "groupwise.trainer.ppo is not available yet"
            results.append({"algorithm": "ppo", "error": error})
            continue
        spec = {
            "algorithm": algorithm,
            "steps": steps,
            "device": device,
            "config": {**run_config, "model": model},
        }
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run(
            [sys.executable, "-m", "groupwise.memory", "--_child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_RESULT_MARK)]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            results.append({"algorithm": algorithm, "error": " | ".join(tail) or "no output"})
            continue
        result = json.loads(lines[-1][len(_RESULT_MARK) :])
        if plans is not None and algorithm in plans:
            plan = plans[algorithm]
        else:  # no table: plan what the run really did (its dtype, prompt, completions)
            shape = shape_from_hf_config(result["model_config"], name=model)
            same = replace(
                opts,
                dtype=result["dtype"],
                precision="pure",  # the trainer keeps AdamW's states in the parameters' dtype
                prompt_len=result["prompt_len"],
                completion_len=max(result["completion_len"], 1),
                reward_model_params=0,
                generation_dtype=result.get("generation_dtype"),
                device=result["device"],  # what auto resolved to, dropout's mask width
            )
            plan = plan_ppo(shape, same) if algorithm == "ppo" else plan_grpo(shape, same)
        result["predicted_bytes"] = total_bytes(plan)
        result["predicted_components"] = plan
        result["ratio"] = result["measured_bytes"] / result["predicted_bytes"]
        result["differs"] = measurement_differences(result, opts)
        results.append(result)
    return results


def measurement_differences(result: dict[str, Any], opts: MemoryOptions) -> list[str]:
    """Where the measured run's real settings differ from the plan's (each a short phrase)."""
    notes = []
    if result["dtype"] != opts.dtype:
        notes.append(f"weights in {result['dtype']}, planned {opts.dtype}")
    planned = generation_dtype(opts)
    if result.get("generation_dtype") and result["generation_dtype"] != planned:
        notes.append(f"the static engine's copy in {result['generation_dtype']}, planned {planned}")
    if result["prompt_len"] != opts.prompt_len:
        notes.append(f"prompts of {result['prompt_len']} tokens, planned {opts.prompt_len}")
    if result["completion_len"] < opts.completion_len:
        notes.append(
            f"completions stopped at {result['completion_len']} of the planned "
            f"{opts.completion_len} tokens (the plan is the longest case)"
        )
    return notes


def format_measurement(results: Sequence[dict[str, Any]]) -> str:
    lines = ["", "measured (one fresh process per algorithm) vs the table's prediction:"]
    for r in results:
        name = r["algorithm"].upper()
        if "error" in r:
            lines.append(f"  {name}: not measured: {r['error']}")
            continue
        what = (
            "peak torch.cuda.max_memory_reserved"
            if r["device"] == "cuda"
            else "peak RSS (VmHWM) minus RSS before the model was loaded"
        )
        text = (
            f"  {name}: measured {human_bytes(r['measured_bytes'])}, predicted "
            f"{human_bytes(r['predicted_bytes'])}, measured / predicted {r['ratio']:.2f}  "
            f"[{r['device']} {r['dtype']}, {r['steps']} step(s), prompt {r['prompt_len']} + "
            f"completion {r['completion_len']} tokens; {what}; process baseline "
            f"{human_bytes(r['baseline_bytes'])} subtracted]"
        )
        if r.get("differs"):
            text += "; differs from the plan: " + "; ".join(r["differs"])
        lines.append(textwrap.fill(text, 100, subsequent_indent="    "))
    measured = {r["algorithm"]: r for r in results if "error" not in r}
    if "ppo" in measured and "grpo" in measured:
        lines.append(
            f"  GRPO / PPO: measured "
            f"{measured['grpo']['measured_bytes'] / measured['ppo']['measured_bytes']:.2f}, "
            f"predicted "
            f"{measured['grpo']['predicted_bytes'] / measured['ppo']['predicted_bytes']:.2f}"
        )
    return "\n".join(lines)
