"""``groupwise chat``: a trained model's answers to your prompts, or to held-out prompts of its
task, with the run's generation settings."""

from __future__ import annotations

from typing import Any

from ..config.grpo_config import GRPOConfig
from ..wiring.rows import build_datasets


def run_chat(args: GRPOConfig, prompts: list[str], count: int = 3) -> list[dict[str, Any]]:
    """Print ``args.model``'s answers to ``prompts`` (or to ``count`` held-out prompts of the
    task), sampled with the run's generation settings; returns them."""
    from ..data.prompts import tokenize_prompts
    from ..evaluation import prompt_render
    from ..rollout import HFEngine
    from ..runtime.distributed import resolve_device
    from ..runtime.precision import resolve_precision
    from ..wiring.model import load_for_generation
    from ..wiring.rollout import build_interaction, sampling_params, with_interaction

    if prompts:
        rows: list[dict] = [{"prompt": [{"role": "user", "content": text}]} for text in prompts]
    else:
        train, evals = build_datasets(args)
        rows = list((evals or train)[:count])
    device = resolve_device(args.device)
    precision = resolve_precision(
        args.dtype, args.bf16_autocast, args.generation_dtype, device, use_peft=args.use_peft
    )
    model, tokenizer = load_for_generation(args.model, args, device, precision)
    engine = HFEngine(model, tokenizer, sampling_params(args.sections().generation),
                      numerics=lambda: precision.generation_context(device))  # fmt: skip
    options = args.sections()
    engine = with_interaction(
        engine, options.tools, options.data.chat_template_kwargs, build_interaction(args)
    )
    ids = tokenize_prompts(
        [row["prompt"] for row in rows], tokenizer, args.max_prompt_length, prompt_render(engine)
    )
    params = sampling_params(options.generation, greedy=args.temperature <= 0)
    rollout = engine.generate(ids, 1, params, rows=rows)
    answers = []
    for row, text in zip(rows, rollout.texts, strict=True):
        prompt = row["prompt"]
        shown = prompt[-1]["content"] if isinstance(prompt, list) and prompt else prompt
        print(f"\n>>> {shown}\n{text.strip()}")
        if row.get("answer") is not None:
            print(f"(expected answer: {row['answer']})")
        answers.append({"prompt": shown, "completion": text, "answer": row.get("answer")})
    return answers


def _pop_prompts(rest: list[str]) -> tuple[list[str], list[str]]:
    """``--prompt TEXT`` may be given several times (each is one prompt)."""
    prompts, kept, i = [], [], 0
    while i < len(rest):
        if rest[i] == "--prompt" and i + 1 < len(rest):
            prompts.append(rest[i + 1])
            i += 2
        elif rest[i].startswith("--prompt="):
            prompts.append(rest[i].split("=", 1)[1])
            i += 1
        else:
            kept.append(rest[i])
            i += 1
    return prompts, kept
