"""``groupwise eval``: greedy accuracy, pass@k / mean@k and a paired comparison of two models on
the task's held-out prompts, written to eval.json."""

from __future__ import annotations

from pathlib import Path

from ..config.grpo_config import GRPOConfig, default_output_dir
from ..errors import ConfigError, OutputDirError
from ..wiring.rows import build_datasets


def run_eval(args: GRPOConfig) -> dict:
    """Evaluate ``args.model`` (and ``args.compare_model``) on the task's held-out prompts."""
    from ..evaluation import (
        EvalConfig,
        compare,
        evaluate_model,
        format_comparison,
        format_table,
        save_json,
    )
    from ..rollout import HFEngine
    from ..runtime.distributed import resolve_device
    from ..runtime.precision import resolve_precision
    from ..wiring.model import load_for_generation
    from ..wiring.rewards import build_reward_func, default_reward_names
    from ..wiring.rollout import build_interaction, with_interaction

    if args.output_dir is None and not args.eval_output:
        args.output_dir = default_output_dir(args.model, args.task)
    output = Path(args.eval_output or Path(args.output_dir) / "eval.json")
    if output.is_dir():
        raise ConfigError(
            f"eval_output={str(output)!r} is a folder; give the JSON file to write, e.g. "
            f"{output / 'eval.json'}"
        )
    train, evals = build_datasets(args)
    rows = evals if evals else train
    config = EvalConfig(
        n=args.eval_num_generations,
        greedy=True,
        ks=args.eval_ks if args.eval_num_generations else None,
        temperature=args.temperature if args.eval_num_generations else 1.0,
        top_p=args.top_p,
        top_k=args.top_k,
        max_completion_length=args.max_completion_length,
        max_prompt_length=args.max_prompt_length,
        seed=args.seed,
    )
    device = resolve_device(args.device)
    # Evaluation samples in the training numerics: bf16 autocast on a bf16 GPU, fp32 on CPU.
    precision = resolve_precision(
        args.dtype, args.bf16_autocast, args.generation_dtype, device, use_peft=args.use_peft
    )
    funcs = [build_reward_func(name, args) for name in default_reward_names(args)]

    interaction = build_interaction(args)  # tools / environment: multi-turn, as in training
    options = args.sections()

    def run(model_name: str):
        model, tokenizer = load_for_generation(model_name, args, device, precision)

        def numerics():
            return precision.generation_context(device)

        engine = HFEngine(model, tokenizer, config.sampling_params(), numerics=numerics)
        engine = with_interaction(engine, options.tools, options.data.chat_template_kwargs,
                                  interaction)  # fmt: skip
        result = evaluate_model(engine, tokenizer, rows, funcs, config)
        print(f"[groupwise] {model_name} on {len(rows)} prompts")
        print(format_table(result.summary, task=args.task))
        return result

    result = run(args.model)
    report: dict = {"model": args.model, **result.to_dict()}
    if args.compare_model:
        other = run(args.compare_model)
        diff = compare(result.per_prompt, other.per_prompt, config.ks)
        print(f"[groupwise] {args.compare_model} minus {args.model} (paired bootstrap 95% CI)")
        print(format_comparison(diff))
        report = {
            "a": report,
            "b": {"model": args.compare_model, **other.to_dict()},
            "comparison": diff,
        }
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        save_json(report, output)
    except OSError as err:
        raise OutputDirError(
            f"eval_output={str(output)!r} cannot be written ({err.strerror}); choose another "
            "eval_output or output_dir"
        ) from err
    print(f"[groupwise] results: {output}")
    return report
