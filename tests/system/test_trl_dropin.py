"""TRL drop-in: a TRL GRPO script runs on groupwise with only its import changed.

TRL's GRPOConfig / TrainingArguments names are translated or accepted-and-reported
(groupwise.config.trl); GRPOTrainer takes processing_class, peft_config, callbacks,
reward_processing_classes; ``trainer.state`` is a transformers ``TrainerState``; real
``datasets.Dataset`` objects are training and evaluation sets.
"""

from __future__ import annotations

import ast
import dataclasses
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from groupwise import ConfigError, GRPOConfig, GRPOTrainer
from groupwise.config.trl import TRL_IGNORED, TRL_REFUSED, TRL_TRANSLATED, IgnoredOptionsWarning
from groupwise.policy.optimizer import lr_factor
from groupwise.trainer.checkpoints import trajectory_changes

datasets = pytest.importorskip("datasets")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# A TRL quickstart (https://huggingface.co/docs/trl/quickstart, GRPO) as a TRL user writes it,
# with `from trl import` changed to `from groupwise import`. Not TRL's: the model is the built-in
# "tiny-random" (no hub here) and the dataset is in memory instead of load_dataset(...).
QUICKSTART = textwrap.dedent(
    """
    from datasets import Dataset
    from groupwise import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_dict(
        {
            "prompt": ["Say hi.", "Name a colour.", "Count to 3.", "Spell cat.", "Add 1 and 1."],
            "ground_truth": ["hi", "red", "1 2 3", "c a t", "2"],
        }
    )


    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]


    training_args = GRPOConfig(
        output_dir="tiny-GRPO",
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        num_train_epochs=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        learning_rate=1e-5,
        lr_scheduler_type="cosine",
        warmup_steps=0.5,
        save_strategy="no",
        gradient_checkpointing=True,
        remove_unused_columns=False,
        dataloader_num_workers=2,
        push_to_hub=False,
        seed=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model="tiny-random",
        reward_funcs=reward_len,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    """
)


def _grpo_config_keywords(source: str) -> list[str]:
    call = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "GRPOConfig"
    )
    return [keyword.arg for keyword in call.keywords]


def _trl_fields() -> set[str]:
    """TRL's GRPOConfig fields: from the installed trl, else the snapshot of trl 1.16.0 (so the
    check runs where trl is not installed, as in CI)."""
    try:
        import trl
    except ImportError:
        text = (FIXTURES / "trl-1.16.0-grpo-config-fields.txt").read_text()
        return {line for line in text.splitlines() if line and not line.startswith("#")}
    return {f.name for f in dataclasses.fields(trl.GRPOConfig)}


def test_quickstart_keywords_are_trls():
    """The script is a TRL script: every GRPOConfig keyword is a field of TRL's GRPOConfig."""
    trl_fields = _trl_fields()
    assert set(_grpo_config_keywords(QUICKSTART)) - trl_fields == set()


def test_trl_quickstart_runs_with_only_the_import_changed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(QUICKSTART, "quickstart.py", "exec"), namespace)
    trainer, args = namespace["trainer"], namespace["training_args"]
    # 5 prompts, 4 completions per step / 2 per prompt = 2 prompts per step: ceil(1 * 5 / 2) = 3.
    assert trainer.args.max_steps == 3 and args.max_steps == -1
    assert trainer.state.global_step == 3 and trainer.state.max_steps == 3
    assert trainer.state.epoch == pytest.approx(3 / 2.5)
    history = trainer.log_history
    # transformers' state.log_history: the logged rows, then train()'s summary row
    assert trainer.state.log_history[:-1] == history
    assert trainer.state.log_history[-1]["step"] == 3
    assert trainer.state.log_history[-1]["train_loss"] == pytest.approx(
        sum(row["loss"] for row in history) / 3
    )
    assert [row["step"] for row in history] == [1, 2, 3]  # logging_steps=1
    assert all({"loss", "reward", "learning_rate", "kl"} <= set(row) for row in history)
    # warmup_steps=0.5 < 1 is a ratio: ceil(0.5 * 3) = 2 warmup steps of 3, then cosine; as
    # transformers logs it, each step's row holds the rate that step ran at: 0/2, 1/2, cos(0).
    assert args.warmup_ratio == 0.5 and args.warmup_steps == 0
    assert [row["learning_rate"] for row in history] == pytest.approx([0.0, 5e-6, 1e-5])
    # bf16=False: no autocast; fp32 weights either way (TRL's bf16 never means bf16 weights).
    assert trainer.args.device == "cpu" and trainer.args.bf16_autocast is False
    assert trainer.precision.name == "fp32" and trainer.model.dtype == torch.float32
    assert trainer.args.report_to == [] and trainer.args.gradient_checkpointing
    reports = [w for w in caught if issubclass(w.category, IgnoredOptionsWarning)]
    assert len(reports) == 1
    message = str(reports[0].message)
    for name in ("dataloader_num_workers=2", "push_to_hub=False", "remove_unused_columns=False"):
        assert name in message
    out = tmp_path / "tiny-GRPO"
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert not list(out.glob("checkpoint-*"))  # save_strategy="no"
    assert "dataloader_num_workers" not in (out / "config.yaml").read_text()


# -- GRPOConfig: TRL names -----------------------------------------------------------------------


def _config(**kwargs) -> GRPOConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredOptionsWarning)
        return GRPOConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"use_cpu": True}, {"device": "cpu"}),
        ({"use_cpu": False}, {"device": "auto"}),
        # TRL's bf16 is mixed precision: fp32 weights (dtype stays auto), bf16 autocast.
        ({"bf16": True}, {"dtype": "auto", "bf16_autocast": True}),
        ({"bf16": False}, {"dtype": "auto", "bf16_autocast": False}),
        ({"bf16": None}, {"dtype": "auto", "bf16_autocast": None}),
        ({"tf32": None}, {"tf32": None}),  # torch's own setting, as in TrainingArguments
        ({"tf32": False}, {"tf32": False}),
        ({"fp16": False}, {"dtype": "auto"}),
        ({"optim": "adamw_torch_fused", "adam_epsilon": 1e-6}, {"adam_epsilon": 1e-6}),
        ({"report_to": "none"}, {"report_to": []}),  # a list, as TrainingArguments holds it
        ({"report_to": ["none"]}, {"report_to": []}),
        ({"report_to": "tensorboard"}, {"report_to": ["tensorboard"]}),
        ({"warmup_steps": 0.1}, {"warmup_ratio": 0.1, "warmup_steps": 0}),
        ({"warmup_steps": 3}, {"warmup_ratio": 0.0, "warmup_steps": 3}),
        ({"num_train_epochs": 2}, {"max_steps": -1, "num_train_epochs": 2}),
        ({"num_train_epochs": 2, "max_steps": 7}, {"max_steps": 7}),  # max_steps wins (TRL)
        ({"save_strategy": "steps"}, {"save_steps": 500}),  # TrainingArguments' default
        ({"save_strategy": "steps", "save_steps": 4}, {"save_steps": 4}),
        ({"eval_strategy": "steps", "logging_steps": 5}, {"eval_steps": 5}),
        # TrainingArguments: eval_steps defaults to logging_steps (TRL's 10)
        ({"eval_strategy": "steps", "eval_steps": None}, {"eval_steps": 10}),
        ({"eval_steps": None, "num_completions_to_print": None}, {"eval_steps": 0}),
        ({"per_device_eval_batch_size": 8}, {"per_device_eval_batch_size": 8}),
        ({"lr_scheduler_type": "constant_with_warmup"}, {"lr_scheduler_type": "constant"}),
    ],
)
def test_trl_option_mapping(kwargs, expected):
    config = _config(**kwargs)
    for name, value in expected.items():
        assert getattr(config, name) == value, name


def test_transformers_enums_are_read_as_values():
    from transformers.trainer_utils import IntervalStrategy, SchedulerType

    config = GRPOConfig(lr_scheduler_type=SchedulerType.COSINE, save_strategy=IntervalStrategy.NO)
    assert (config.lr_scheduler_type, config.save_strategy) == ("cosine", "no")


def test_report_to_all_is_the_installed_loggers(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
    )
    assert _config(report_to="all").report_to == ["tensorboard"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fp16": True, "use_cpu": True}, "fp16=True is not supported on CPU"),
        ({"fp16": True}, "fp16=True is not supported: groupwise trains in float32 or bfloat16"),
        ({"bf16": True, "bf16_autocast": False}, "bf16=True means bf16_autocast=True, but"),
        ({"use_cpu": True, "device": "cuda"}, "use_cpu=True means device='cpu', but device="),
        ({"optim": "adafactor"}, "optim='adafactor' is not supported"),
        ({"save_strategy": "best"}, "save_strategy='best' is not one of"),
        ({"eval_strategy": "always"}, "eval_strategy='always' is not one of"),
        ({"max_steps": 0}, "max_steps must be >= 1, or -1"),
        ({"max_steps": -1, "num_train_epochs": 0}, "num_train_epochs must be > 0"),
        ({"warmup_ratio": 1.0}, "warmup_ratio must be in [0, 1)"),
        ({"report_to": "mlflow"}, "report_to: unknown logger(s) ['mlflow']"),
    ],
)
def test_trl_option_errors_name_the_option(kwargs, message):
    with pytest.raises(ConfigError) as info:
        _config(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "name, suggestion",
    [
        ("num_generation", "num_generations"),
        ("dataloader_num_worker", "dataloader_num_workers"),
        ("use_cpus", "use_cpu"),
    ],
)
def test_unknown_names_error_with_did_you_mean(name, suggestion):
    with pytest.raises(ConfigError, match=rf"GRPOConfig: unknown option '{name}' \(did you mean "):
        GRPOConfig(**{name: 1})
    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_dict({name: 1}, source="run.yaml")
    assert str(info.value).startswith(
        f"run.yaml: unknown option {name!r} (did you mean {suggestion!r}?)"
    )
    with pytest.raises(ConfigError, match="unknown option 'zzzz_qqq'. Every option with its "):
        GRPOConfig(zzzz_qqq=1)


def test_ignored_options_are_reported_once_in_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = GRPOConfig(
            torch_compile=True, ddp_timeout=60, vllm_model_impl="transformers", push_to_hub=False
        )
        dataclasses.replace(config, max_steps=3)  # a copy made later reports nothing
        config.for_dataset(10)
    reports = [w for w in caught if issubclass(w.category, IgnoredOptionsWarning)]
    assert [str(w.message).split(": ", 1)[1] for w in reports] == [
        "ddp_timeout=60, push_to_hub=False, torch_compile=True, vllm_model_impl='transformers'"
    ]
    assert config.trl_ignored == {
        "ddp_timeout": 60,
        "torch_compile": True,
        "push_to_hub": False,
        "vllm_model_impl": "transformers",
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOConfig(max_steps=3)
    assert caught == []


def test_ignored_options_stay_out_of_to_dict_and_resume_comparison():
    config = _config(max_steps=5, dataloader_num_workers=4, hub_model_id="me/x")
    values = config.to_dict()
    assert not set(values) & TRL_IGNORED
    assert trajectory_changes(values, GRPOConfig(max_steps=5).to_dict()) == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = GRPOConfig.from_dict(values)
    assert again == config and caught == []


def test_yaml_and_command_line_take_trl_names():
    values = {
        "use_cpu": "true",
        "bf16": "false",
        "warmup_steps": "0.1",
        "num_train_epochs": "2",
        "logging_dir": "logs",
        "save_strategy": "epoch",
    }
    with pytest.warns(IgnoredOptionsWarning, match="logging_dir='logs'"):
        config = GRPOConfig.from_dict(values, source="cli")
    assert (config.device, config.bf16_autocast, config.warmup_ratio) == ("cpu", False, 0.1)
    assert (config.max_steps, config.num_train_epochs, config.save_strategy) == (-1, 2.0, "epoch")
    assert config.trl_ignored == {"logging_dir": "logs"}
    assert GRPOConfig.from_dict({"warmup_steps": "3"}).warmup_steps == 3
    with pytest.raises(ConfigError, match="'warmup_steps' expects an integer, or a ratio"):
        GRPOConfig.from_dict({"warmup_steps": "2.5"})


def test_trl_names_table_covers_trls_config():
    """Every field of TRL's GRPOConfig is a groupwise option, translated, ignored, or refused
    unless off; none of the others is a groupwise option."""
    ours = set(GRPOConfig.field_names())
    trl_fields = _trl_fields()
    assert trl_fields - ours - set(TRL_TRANSLATED) - TRL_IGNORED - set(TRL_REFUSED) == set()
    assert TRL_IGNORED & ours == set() and set(TRL_TRANSLATED) & ours == set()
    assert set(TRL_REFUSED) & ours == set() and set(TRL_REFUSED) & TRL_IGNORED == set()


# -- run length, schedule, strategies: hand values ------------------------------------------------


def test_num_train_epochs_gives_max_steps():
    # 8 completions per step / 4 per prompt = 2 prompts per step.
    args = GRPOConfig(num_train_epochs=1.5, per_device_train_batch_size=8, num_generations=4)
    assert args.steps_per_epoch(10) == 5
    assert args.for_dataset(10).max_steps == 8  # ceil(1.5 * 10 / 2) = ceil(7.5)
    assert args.for_dataset(10, world_size=2).max_steps == 4  # ceil(1.5 * 10 / 4) = ceil(3.75)
    assert args.for_dataset(1).max_steps == 1  # ceil(0.75)
    fixed = GRPOConfig(max_steps=6, num_train_epochs=1.5, per_device_train_batch_size=8,
                       num_generations=4)  # fmt: skip
    assert fixed.for_dataset(10) is fixed


def test_epoch_strategies_give_steps():
    args = GRPOConfig(save_strategy="epoch", eval_strategy="epoch", max_steps=20,
                      per_device_train_batch_size=8, num_generations=4)  # fmt: skip
    resolved = args.for_dataset(7)  # 3.5 steps per epoch
    assert (resolved.save_steps, resolved.eval_steps, resolved.max_steps) == (4, 4, 20)
    off = GRPOConfig(save_strategy="no", save_steps=5, eval_strategy="no", eval_steps=2)
    assert (off.for_dataset(7).save_steps, off.for_dataset(7).eval_steps) == (0, 0)


def test_warmup_ratio_gives_warmup_steps():
    args = GRPOConfig(warmup_ratio=0.25, lr_scheduler_type="linear", max_steps=10)
    assert args.warmup_steps_for(10) == 3  # ceil(2.5)
    factor = lr_factor(args.sections().optimization, 10)
    assert [factor(s) for s in range(5)] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0, 1 - 1 / 7])
    # warmup_steps, when set, wins over the ratio (TrainingArguments.get_warmup_steps).
    assert GRPOConfig(warmup_ratio=0.25, warmup_steps=1).warmup_steps_for(10) == 1


# -- GRPOTrainer: TRL's arguments ----------------------------------------------------------------

ROWS = [{"prompt": p, "answer": a} for p, a in [("a b", "1"), ("c d", "2"), ("e f", "3")]]


def _lengths(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_trl_positional_order_processing_class_and_refusals(tmp_path, tokenizer):
    args = tiny_config(tmp_path, max_steps=-1, num_train_epochs=2, save_strategy="epoch")
    dataset = datasets.Dataset.from_list(ROWS)
    trainer = GRPOTrainer(  # TRL's order: model, reward_funcs, args, train_dataset
        "tiny-random", _lengths, args, dataset, processing_class=tokenizer,
        reward_processing_classes=[tokenizer],
    )  # fmt: skip
    assert trainer.tokenizer is tokenizer and trainer.train_dataset is dataset
    assert trainer.reward_processing_classes == [None]  # a function's entry is not used (TRL)
    # 3 prompts, 2 per step: 2 epochs = ceil(2 * 3 / 2) = 3 steps; an epoch = ceil(1.5) = 2.
    assert (trainer.args.max_steps, trainer.args.save_steps) == (3, 2)
    assert args.max_steps == -1  # the caller's config is not changed
    assert trainer.state.global_step == 0 and trainer.state.max_steps == 3
    with pytest.raises(ConfigError, match="optimizers: groupwise builds its own AdamW"):
        GRPOTrainer("tiny-random", _lengths, ROWS, args=args, optimizers=(object(), None))
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        GRPOTrainer("tiny-random", _lengths, args=args)
    streamed = datasets.Dataset.from_list(ROWS).to_iterable_dataset()
    with pytest.raises(ConfigError, match="set max_steps"):  # no length: epochs can't be counted
        GRPOTrainer("tiny-random", _lengths, streamed, args=args)


def test_callbacks_state_and_stopping(tmp_path):
    from transformers import TrainerCallback, TrainerControl, TrainerState

    class Recorder(TrainerCallback):
        def __init__(self):
            self.events, self.logs = [], []

        def on_init_end(self, args, state, control, **kwargs):
            self.events.append("init_end")

        def on_train_begin(self, args, state, control, **kwargs):
            assert isinstance(state, TrainerState) and isinstance(control, TrainerControl)
            assert kwargs["model"] is not None and kwargs["optimizer"] is not None
            self.events.append(f"train_begin@{state.global_step}/{state.max_steps}")

        def on_step_end(self, args, state, control, **kwargs):
            self.events.append(f"step_end@{state.global_step}")
            if state.global_step == 2:
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(logs)

        def on_save(self, args, state, control, **kwargs):
            self.events.append(f"save@{state.global_step}")

        def on_train_end(self, args, state, control, **kwargs):
            self.events.append(f"train_end@{state.global_step}")

    class Counter:  # duck-typed, passed as a class (transformers instantiates those)
        steps = 0

        def on_step_begin(self, args, state, control, **kwargs):
            type(self).steps += 1

    recorder = Recorder()
    args = tiny_config(tmp_path, max_steps=5, adam_epsilon=1e-6)
    trainer = GRPOTrainer("tiny-random", _lengths, ROWS, args=args, callbacks=[recorder, Counter])
    assert trainer.optimizer.param_groups[0]["eps"] == 1e-6
    trainer.train()
    assert recorder.events == [
        "init_end",
        "train_begin@0/5",
        "step_end@1",
        "step_end@2",
        "save@2",
        "train_end@2",
    ]
    assert Counter.steps == 2
    assert trainer.state.global_step == 2 and trainer.global_step == 2
    assert [log["step"] for log in recorder.logs] == [1, 2, 2]  # the steps, then the summary
    assert "train_loss" in recorder.logs[-1]
    assert recorder.logs == trainer.state.log_history
    assert trainer.state.is_world_process_zero
    assert (tmp_path / "run" / "checkpoint-2").is_dir()
    assert (tmp_path / "run" / "model.safetensors").exists()  # the final model is still saved


def test_peft_config_is_the_adapter(tmp_path):
    from peft import LoraConfig, PeftModel

    peft_config = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=["v_proj", "q_proj"],
        task_type="CAUSAL_LM",
    )
    args = tiny_config(tmp_path, max_steps=1)
    trainer = GRPOTrainer("tiny-random", _lengths, ROWS, args=args, peft_config=peft_config)
    assert isinstance(trainer.model, PeftModel)
    recorded = trainer.args
    assert recorded.use_peft and (recorded.lora_r, recorded.lora_alpha) == (4, 8)
    assert recorded.lora_target_modules == ["q_proj", "v_proj"] and recorded.lora_dropout == 0.0
    assert not args.use_peft  # the caller's config is not changed
    trainable = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and ("q_proj" in n or "v_proj" in n) for n in trainable)
    assert all(p.shape[0] == 4 for n, p in trainable.items() if "lora_A" in n)
    before = {n: p.detach().clone() for n, p in trainable.items()}
    trainer.train()
    assert any(not (p == before[n]).all() for n, p in trainable.items())
    trainer.save_model(output_dir=str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_config.json").exists()


# -- datasets.Dataset --------------------------------------------------------------------------


def test_real_dataset_map_filter_conversational_columns_reach_rewards(tmp_path, monkeypatch):
    raw = datasets.Dataset.from_list(
        [
            {"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3}
            for i in range(6)
        ]
    )
    dataset = raw.map(
        lambda row: {"prompt": [{"role": "user", "content": row["question"]}]}
    ).filter(lambda row: row["level"] != 0)
    assert len(dataset) == 4 and dataset["answer"] == ["2", "4", "8", "10"]
    assert dataset[0]["prompt"] == [{"role": "user", "content": "What is 1 + 1?"}]
    calls = []

    def reward(completions, answer, level, question, **kwargs):
        calls.append((completions, answer, level, question, kwargs["prompts"]))
        return [float(a == "4") for a in answer]

    args = tiny_config(tmp_path, max_steps=1, per_device_eval_batch_size=1)
    trainer = GRPOTrainer("tiny-random", reward, dataset, args=args)
    trainer.train()
    completions, answer, level, question, prompts = calls[0]
    assert len(completions) == 8 and all(c[0]["role"] == "assistant" for c in completions)
    for a, lvl, q, p in zip(answer, level, question, prompts, strict=True):
        assert p == [{"role": "user", "content": q}] and a == str(2 * int(q.split()[2]))
        assert lvl == int(q.split()[2]) % 3 != 0
    # Evaluation on a Dataset, per_device_eval_batch_size prompts at a time: one greedy
    # completion per prompt, answers "2" and "4" -> mean reward 1/2.
    from groupwise import evaluation

    sizes = []
    real = evaluation.reward_means
    monkeypatch.setattr(
        evaluation, "reward_means", lambda *a, **k: sizes.append(k["batch_size"]) or real(*a, **k)
    )
    result = trainer.evaluate(dataset.select([0, 1]))
    assert sizes == [1] and result["eval/reward"] == 0.5


def test_real_dataset_through_load_dataset_rows(tmp_path):
    from groupwise.data.rows import load_dataset_rows

    dataset = datasets.Dataset.from_dict({"text": ["A?", "B?", "C?"], "answer": [1, 2, 3]})
    rows, report = load_dataset_rows(dataset.filter(lambda r: r["answer"] > 1),
                                     prompt_column="text")  # fmt: skip
    assert rows == [{"prompt": "B?", "answer": "2"}, {"prompt": "C?", "answer": "3"}]
    assert report.source == "<Dataset>"
    splits = datasets.DatasetDict({"train": dataset, "test": dataset.select([0])})
    splits.save_to_disk(str(tmp_path / "saved"))
    rows, _ = load_dataset_rows(str(tmp_path / "saved"), prompt_column="text", split="test")
    assert rows == [{"prompt": "A?", "answer": "1"}]


def test_max_tool_calling_iterations_is_max_turns_plus_one():
    assert GRPOConfig(max_tool_calling_iterations=2).max_turns == 3
    assert GRPOConfig(max_tool_calling_iterations=None).max_turns == GRPOConfig().max_turns
