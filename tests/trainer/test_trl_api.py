"""TRL's GRPOTrainer behaviours a TRL script relies on: a reward model given as a path (or a
loaded model) in ``reward_funcs`` with ``reward_processing_classes``, ``train()`` returning a
``TrainOutput`` with the end-of-training ``train_loss`` row, the ``trainer_state`` /
``log_extra`` / ``log_metric`` reward kwargs, ``scale_rewards`` booleans, iterable and dict
datasets, an already-wrapped ``PeftModel`` and ``trust_remote_code``."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForSequenceClassification,
    TrainerCallback,
    TrainerState,
)
from transformers.trainer_utils import TrainOutput

from conftest import tiny_config
from groupwise import ConfigError, GRPOConfig, GRPOTrainer
from groupwise.errors import ModelLoadError
from groupwise.rewards import RewardModel

ROWS = [{"prompt": p} for p in ("a b", "c d", "e f", "g h")]
CHATS = [{"prompt": [{"role": "user", "content": p}]} for p in ("a b", "c d")]


def _lengths(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _classifier(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
    )
    return LlamaForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory, tokenizer):
    """A saved sequence-classification checkpoint, as TRL's tiny reward models are."""
    path = tmp_path_factory.mktemp("models") / "tiny-reward"
    _classifier(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _score_alone(model, tokenizer, text):
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, 0])


# -- reward models in reward_funcs -----------------------------------------------------------------


def test_a_path_string_is_a_reward_model(tmp_path, reward_dir, tokenizer):
    trainer = GRPOTrainer("tiny-random", str(reward_dir), ROWS, args=tiny_config(tmp_path))
    (reward,) = trainer.reward_funcs
    assert isinstance(reward, RewardModel) and reward.__name__ == "tiny-reward"  # TRL's name
    assert reward.model.config.num_labels == 1
    assert trainer.reward_processing_classes == [reward.tokenizer]
    # prompt + completion, scored by logits[:, 0] of the checkpoint
    saved = LlamaForSequenceClassification.from_pretrained(reward_dir).eval()
    expected = _score_alone(saved, tokenizer, "a b" + " yes")
    assert reward(["a b"], [" yes"])[0] == pytest.approx(expected, abs=1e-5)
    trainer.train()
    assert "rewards/tiny-reward/mean" in trainer.log_history[-1]


def test_built_in_names_stay_built_in(tmp_path):
    trainer = GRPOTrainer("tiny-random", ["format", "accuracy"], ROWS, args=tiny_config(tmp_path))
    assert trainer.reward_names == ["format_reward", "accuracy_reward"]
    assert trainer.reward_processing_classes == [None, None]


def test_a_string_that_is_no_reward_is_named(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once, at import: without this the hub id below is
    # looked up online, with retries (about 45 s where no network is reachable).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    args = tiny_config(tmp_path)
    with pytest.raises(ConfigError, match="unknown reward function 'formatt'.*did you mean"):
        GRPOTrainer("tiny-random", "formatt", ROWS, args=args)
    # read as a hub id, which cannot be loaded: the error names it and says how it was read
    with pytest.raises(ConfigError, match=r"'someone/no-such-model' is not a built-in reward"):
        GRPOTrainer("tiny-random", "someone/no-such-model", ROWS, args=args)
    with pytest.raises(ConfigError, match="sequence-classification reward model"):
        GRPOTrainer("tiny-random", str(tmp_path), ROWS, args=args)  # a folder, but no model


def test_a_loaded_model_with_its_processing_class(tmp_path, tokenizer):
    model = _classifier(tokenizer, seed=1)
    trainer = GRPOTrainer(
        "tiny-random", model, CHATS, args=tiny_config(tmp_path, max_steps=1),
        reward_processing_classes=tokenizer,
    )  # fmt: skip
    (reward,) = trainer.reward_funcs
    assert reward.model is model and reward.tokenizer is tokenizer
    assert trainer.reward_processing_classes == [tokenizer]
    # conversational: the reward model's chat template over prompt + the assistant's reply
    chat = [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "yes"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = float(model(input_ids=ids).logits[0, 0])
    got = reward([CHATS[0]["prompt"]], [[{"role": "assistant", "content": "yes"}]])[0]
    assert got == pytest.approx(expected, abs=1e-5)
    trainer.train()


def test_reward_processing_classes_must_match_reward_funcs(tmp_path, reward_dir, tokenizer):
    args = tiny_config(tmp_path)
    with pytest.raises(ConfigError, match="must match"):
        GRPOTrainer(
            "tiny-random", [str(reward_dir), _lengths], ROWS, args=args,
            reward_processing_classes=tokenizer,
        )  # fmt: skip
    trainer = GRPOTrainer(
        "tiny-random", [str(reward_dir), _lengths], ROWS, args=args,
        reward_processing_classes=[tokenizer, None],
    )  # fmt: skip
    assert trainer.reward_processing_classes == [tokenizer, None]
    assert trainer.reward_funcs[0].tokenizer is tokenizer


# -- train() ---------------------------------------------------------------------------------------


class _Logged(TrainerCallback):
    def __init__(self):
        self.rows = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.rows.append(logs)


def test_train_returns_train_output_and_ends_state_log_history(tmp_path):
    logged = _Logged()
    trainer = GRPOTrainer(
        "tiny-random", _lengths, ROWS, args=tiny_config(tmp_path, max_steps=3), callbacks=[logged]
    )
    out = trainer.train()
    assert isinstance(out, TrainOutput) and out.global_step == 3
    losses = [row["loss"] for row in trainer.log_history]
    assert len(losses) == 3  # trainer.log_history: one row per step, no summary
    assert out.training_loss == pytest.approx(sum(losses) / 3)
    summary = trainer.state.log_history[-1]
    assert summary["train_loss"] == out.metrics["train_loss"] == out.training_loss
    assert summary["step"] == 3 and summary["train_runtime"] > 0
    # no MoE router loss is added to the policy loss (TRL's aux_loss), and the flag says so
    assert trainer.aux_loss_enabled is False and "aux_loss" not in summary
    assert summary["epoch"] == pytest.approx(3 / 2)  # 2 prompts per step of 4 rows
    assert trainer.state.log_history[:-1] == trainer.log_history
    # it repeats the final step's metrics (TRL's summary row carries the unlogged ones)
    assert {k: summary[k] for k in trainer.log_history[-1]} == trainer.log_history[-1]
    assert logged.rows[-1] == summary
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]  # no summary row there
    # a second call: its own summary of its own steps, after the rows it logged
    trainer.args.max_steps = 4
    again = trainer.train()
    assert again.training_loss == pytest.approx(trainer.log_history[-1]["loss"])
    steps = [row["step"] for row in trainer.state.log_history]
    assert steps == [1, 2, 3, 3, 4, 4] and "train_loss" in trainer.state.log_history[3]
    assert trainer.state.log_history[-1]["reward"] == trainer.log_history[-1]["reward"]


def test_train_loss_is_nan_when_no_step_ran(tmp_path):
    trainer = GRPOTrainer("tiny-random", _lengths, ROWS, args=tiny_config(tmp_path, max_steps=1))
    trainer.train()
    out = trainer.train()  # already at max_steps
    assert out.global_step == 1 and math.isnan(out.training_loss)
    assert "reward" not in trainer.state.log_history[-1]  # no step ran in this call


# -- TRL's reward kwargs ---------------------------------------------------------------------------


def test_reward_kwargs_trainer_state_log_metric_log_extra(tmp_path):
    seen = []

    def reward(completions, trainer_state, log_metric, log_extra, **kwargs):
        assert isinstance(trainer_state, TrainerState)
        seen.append(trainer_state.global_step)
        log_metric("custom", 1.0)
        log_metric("custom", 2.0)
        log_extra("first_char", [c[:1] for c in completions])
        return [0.0] * len(completions)

    args = tiny_config(tmp_path, log_completions_steps=1, completions_sample_size=1)
    trainer = GRPOTrainer("tiny-random", reward, ROWS, args=args)
    trainer.train()
    assert seen == [0, 1]  # the state as of the step being scored
    assert [row["custom"] for row in trainer.log_history] == [1.5, 1.5]  # the step's mean
    records = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").open()]
    for item in records[-1]["completions"]:
        assert item["extra"] == {"first_char": item["text"][:1]}
    metrics = trainer.evaluate(ROWS[:2])
    assert metrics["eval/custom"] == 1.5
    assert trainer.scorer.combine.pending_metrics == {}


def test_reward_kwargs_reach_a_function_called_one_completion_at_a_time(tmp_path):
    """A function that fails on its batch is called again per completion: the shared kwargs are
    passed whole each time, not split like the dataset columns."""

    def flaky(completions, log_metric, trainer_state, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("batch too large")
        log_metric("single", 3.0)
        return [1.0]

    trainer = GRPOTrainer("tiny-random", flaky, ROWS, args=tiny_config(tmp_path, max_steps=1))
    trainer.train()
    assert trainer.log_history[-1]["single"] == 3.0
    assert trainer.log_history[-1]["rewards/flaky/mean"] == 1.0


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "mode"), [(True, "group"), (False, "none"), ("false", "none")])
def test_scale_rewards_booleans(given, mode):
    assert GRPOConfig(scale_rewards=given).scale_rewards == mode


def test_trust_remote_code(tmp_path):
    """A model folder with its own code (auto_map) loads only with trust_remote_code=True."""
    folder = tmp_path / "remote"
    GRPOTrainer("tiny-random", _lengths, ROWS, args=tiny_config(tmp_path)).save_model(folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "tiny_remote"  # unknown to transformers: only its own code loads it
    config["auto_map"] = {
        "AutoConfig": "modeling_remote.RemoteConfig",
        "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_remote.py").write_text(
        textwrap.dedent(
            """
            from transformers import LlamaConfig, LlamaForCausalLM

            class RemoteConfig(LlamaConfig):
                model_type = "tiny_remote"

            class RemoteForCausalLM(LlamaForCausalLM):
                config_class = RemoteConfig
            """
        )
    )
    with pytest.raises(ModelLoadError, match="trust_remote_code=True"):
        GRPOTrainer(str(folder), _lengths, ROWS, args=tiny_config(tmp_path))
    args = tiny_config(tmp_path, trust_remote_code=True)
    trainer = GRPOTrainer(str(folder), _lengths, ROWS, args=args)
    assert type(trainer.model).__name__ == "RemoteForCausalLM"


# -- datasets --------------------------------------------------------------------------------------


def test_iterable_train_dataset_reads_what_training_draws(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"prompt": f"p{i}"} for i in range(10)]
    streamed = datasets.Dataset.from_list(rows).to_iterable_dataset()
    trainer = GRPOTrainer("tiny-random", _lengths, streamed, args=tiny_config(tmp_path))
    # 2 steps x 2 prompts per step: the stream's first 4 rows, in order
    assert [r["prompt"] for r in trainer.train_dataset] == ["p0", "p1", "p2", "p3"]
    trainer.train()
    assert trainer.global_step == 2
    # a stream shorter than that: training cycles over what it holds
    short = datasets.Dataset.from_list(rows[:3]).to_iterable_dataset()
    args = tiny_config(tmp_path, overwrite_output_dir=True)
    assert len(GRPOTrainer("tiny-random", _lengths, short, args=args).train_dataset) == 3


def test_evaluate_takes_trl_eval_dataset_dicts_and_streams(tmp_path):
    datasets = pytest.importorskip("datasets")
    streamed = datasets.Dataset.from_list(ROWS[:2]).to_iterable_dataset()
    evals = {"first": ROWS[:2], "streamed": streamed}
    trainer = GRPOTrainer(
        "tiny-random", _lengths, ROWS, args=tiny_config(tmp_path), eval_dataset=evals
    )
    assert trainer.eval_dataset is evals
    metrics = trainer.evaluate()
    # the same two prompts, greedy: the same rewards under both names
    assert metrics["eval/first/reward"] == metrics["eval/streamed/reward"]
    assert metrics["eval/first/num_prompts"] == 2
    single = trainer.evaluate(eval_dataset=streamed)
    assert single["eval/reward"] == metrics["eval/first/reward"]
    with pytest.raises(ValueError, match="not both"):
        trainer.evaluate(ROWS, eval_dataset=ROWS)
    with pytest.raises(ValueError, match=r"eval_dataset\['empty'\] is empty"):
        GRPOTrainer("tiny-random", _lengths, ROWS, args=tiny_config(tmp_path),
                    eval_dataset={"empty": []})  # fmt: skip


# -- an already-wrapped PeftModel ------------------------------------------------------------------


def test_a_peft_model_trains_its_own_adapter(tmp_path, tiny_model, tokenizer):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = tiny_config(tmp_path, beta=0.04, learning_rate=0.1)
    trainer = GRPOTrainer(model, _lengths, ROWS, args=args, processing_class=tokenizer)
    assert trainer.model is model and trainer.args.use_peft
    assert (trainer.args.lora_r, trainer.args.lora_target_modules) == (4, ["q_proj", "v_proj"])
    assert trainer.ref_model is None  # the reference is the adapter-disabled model
    trainer.train()
    for name, param in model.named_parameters():
        changed = not torch.equal(param, before[name])
        assert changed == ("lora_" in name), name
    with pytest.raises(ConfigError, match="already a PeftModel"):
        GRPOTrainer(model, _lengths, ROWS, args=args, processing_class=tokenizer,
                    peft_config=peft.LoraConfig())  # fmt: skip


# -- TRL's model loading keywords: quantization_config= and model_init_kwargs set after parsing --


def _quant(**kwargs):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, **kwargs)


def test_quantization_config_keyword_loads_a_4bit_base(tmp_path):
    """TRL's GRPOTrainer(quantization_config=...): the same 4-bit options as model_init_kwargs
    ['quantization_config'] (fp4, nested here), and the base is quantised."""
    from groupwise.runtime.quantization import is_4bit

    args = tiny_config(tmp_path, use_peft=True, lora_r=4, lora_alpha=8)
    trainer = GRPOTrainer("tiny-random", _lengths, ROWS, args=args,
                          quantization_config=_quant(bnb_4bit_quant_type="fp4",
                                                     bnb_4bit_use_double_quant=True))  # fmt: skip
    assert (trainer.args.load_in_4bit, trainer.args.bnb_4bit_quant_type,
            trainer.args.use_bnb_nested_quant) == (True, "fp4", True)  # fmt: skip
    assert is_4bit(trainer.model.get_base_model())
    assert not args.load_in_4bit  # the caller's config is not changed


def test_model_init_kwargs_assigned_after_construction_take_effect():
    """TRL's grpo.py: training_args.model_init_kwargs = {...} after parsing. Read as at
    construction: its quantization_config sets the 4-bit options, the rest is reported unless
    it says what the run does anyway (None, revision "main", an option's own value)."""
    from groupwise.trainer.trl_api import with_model_init_kwargs

    args = GRPOConfig(use_peft=True)
    assert with_model_init_kwargs(args) is args  # nothing assigned: unchanged
    args.model_init_kwargs = {"quantization_config": _quant(bnb_4bit_quant_type="fp4"),
                              "revision": "main", "trust_remote_code": False,
                              "attn_implementation": None, "device_map": "auto"}  # fmt: skip
    with pytest.warns(UserWarning, match=r"model_init_kwargs=\{'device_map': 'auto'\}"):
        applied = with_model_init_kwargs(args)
    assert applied.load_in_4bit and applied.bnb_4bit_quant_type == "fp4"
    assert applied.is_set("load_in_4bit") and not args.load_in_4bit


def test_model_init_kwargs_and_quantization_config_refusals():
    from groupwise.trainer.trl_api import with_model_init_kwargs

    args = GRPOConfig(use_peft=True)
    args.model_init_kwargs = {"quantization_config": _quant()}
    with pytest.raises(ConfigError, match="quantization_config was given both"):
        with_model_init_kwargs(args, _quant())
    args.model_init_kwargs = ["not", "a", "mapping"]
    with pytest.raises(ConfigError, match="args.model_init_kwargs must be a mapping"):
        with_model_init_kwargs(args)
    # An option given with another value than the quantization_config says.
    given = GRPOConfig(use_peft=True, bnb_4bit_quant_type="nf4")
    with pytest.raises(ConfigError, match="bnb_4bit_quant_type='fp4'"):
        with_model_init_kwargs(given, _quant(bnb_4bit_quant_type="fp4"))
    # QLoRA's own rule still holds: a 4-bit base needs the LoRA adapter.
    with pytest.raises(ConfigError, match="load_in_4bit=True needs use_peft=True"):
        with_model_init_kwargs(GRPOConfig(), _quant())
    from transformers import BitsAndBytesConfig

    with pytest.raises(ConfigError, match="load_in_8bit"):  # refused as at construction
        with_model_init_kwargs(GRPOConfig(use_peft=True), BitsAndBytesConfig(load_in_8bit=True))
