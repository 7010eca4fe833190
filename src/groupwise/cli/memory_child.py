"""The child process of ``groupwise memory --measure``: real training steps in a fresh process,
their peak memory printed as one ``GROUPWISE_MEMORY_RESULT`` line of JSON for
:func:`groupwise.memory.measure.run_measurement`, which starts it as ``python -m
groupwise.cli.memory_child --_child SPEC``. It runs the trainers, so it lives above them, here;
the planner (:mod:`groupwise.memory`) stays below the trainer, which plans a run with it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..memory.measure import HF_KEYS, RESULT_MARK, load_tokenizer


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


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
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
        tokenizer = load_tokenizer(config.model)
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
        "model_config": {k: model_config.get(k) for k in HF_KEYS},
        "steps": steps,
    }


if __name__ == "__main__":
    spec = json.loads(sys.argv[sys.argv.index("--_child") + 1])
    print(RESULT_MARK + json.dumps(child_main(spec)), flush=True)
