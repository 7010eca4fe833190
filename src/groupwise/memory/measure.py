"""``groupwise memory --measure``: real training steps that check the plan.

``--measure`` runs real training steps of each algorithm in a fresh subprocess (one per
algorithm, so neither sees the other's peak) and prints the measured peak next to the plan for
the same settings: on the CPU the peak RSS (VmHWM) minus the RSS after imports and the tokenizer,
before the model is loaded; on a GPU ``torch.cuda.max_memory_reserved`` (the
caching allocator's pool, fragmentation included).

Each child is ``python -m groupwise.cli.memory_child --_child SPEC``
(:mod:`groupwise.cli.memory_child`, above the trainers it runs); it prints one
``GROUPWISE_MEMORY_RESULT`` line of JSON, which :func:`run_measurement` reads here.
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

RESULT_MARK = "GROUPWISE_MEMORY_RESULT "


def load_tokenizer(model: str) -> Any:
    """The tokenizer a measured run of ``model`` uses (the built-in models' own)."""
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


HF_KEYS = (
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
            [sys.executable, "-m", "groupwise.cli.memory_child", "--_child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            results.append({"algorithm": algorithm, "error": " | ".join(tail) or "no output"})
            continue
        result = json.loads(lines[-1][len(RESULT_MARK) :])
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
