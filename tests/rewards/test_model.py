"""RewardModel on tiny, seeded, randomly initialised classifiers built and saved locally."""

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
)

from groupwise.rewards.model import RewardModel

PROMPTS = ["What is 2 + 2?", "Hi", "Name a colour.", "What is 7 * 6?", "Say nothing.", "x"]
COMPLETIONS = [
    "4",
    "Hello there, how are you doing on this fine day?",
    "Blue.",
    "<think> 7 * 6 = 42 </think> <answer> 42 </answer>",
    "",
    "A long answer " * 6,
]
CHATS = [[{"role": "user", "content": p}] for p in PROMPTS]


def tiny_classifier(vocab_size, pad_token_id, num_labels=1, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=num_labels,
        pad_token_id=pad_token_id,
        initializer_range=0.2,  # scores of order 1, so padding bugs show well above atol
    )
    return LlamaForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("reward-model")
    tiny_classifier(len(tokenizer), tokenizer.pad_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reward(checkpoint):
    return RewardModel(str(checkpoint), batch_size=8)


def reference_score(model, ids, label=0):
    """One unpadded sequence, no attention mask: what the model says with nothing around it."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, label].item()


def test_plain_prompts_score_prompt_plus_completion(reward):
    scores = reward(PROMPTS, COMPLETIONS, answer=["4"] * len(PROMPTS))
    assert reward.__name__ == "reward_model"
    assert len(scores) == len(PROMPTS) and all(isinstance(s, float) for s in scores)
    tok = reward.tokenizer
    expected = [
        reference_score(reward.model, tok(p + c)["input_ids"])
        for p, c in zip(PROMPTS, COMPLETIONS, strict=True)
    ]
    assert scores == pytest.approx(expected, abs=1e-5)
    # Random scores of order 1: comparisons at 1e-5 below mean something.
    assert max(scores) - min(scores) > 0.1


def test_conversational_prompts_use_the_chat_template(reward):
    scores = reward(CHATS, COMPLETIONS)
    tok = reward.tokenizer
    expected = []
    for chat, completion in zip(CHATS, COMPLETIONS, strict=True):
        text = tok.apply_chat_template(
            chat + [{"role": "assistant", "content": completion}], tokenize=False
        )
        assert text.rstrip().endswith("<|im_end|>")  # the assistant turn is closed
        expected.append(
            reference_score(reward.model, tok(text, add_special_tokens=False)["input_ids"])
        )
    assert scores == pytest.approx(expected, abs=1e-5)
    # Completions as TRL passes them for conversations give the same scores.
    as_messages = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    assert reward(CHATS, as_messages) == pytest.approx(scores, abs=1e-5)
    # ... and differ from the plain-text scores (the template is really applied).
    plain = reward(PROMPTS, COMPLETIONS)
    assert max(abs(a - b) for a, b in zip(scores, plain, strict=True)) > 1e-3


def test_scores_are_deterministic_across_calls(reward):
    first = reward(PROMPTS, COMPLETIONS)
    assert reward(PROMPTS, COMPLETIONS) == first
    # Order within the batch does not matter either.
    reversed_scores = reward(PROMPTS[::-1], COMPLETIONS[::-1])
    assert reversed_scores[::-1] == pytest.approx(first, abs=1e-5)


@pytest.mark.parametrize("conversational", [False, True])
def test_batch_size_does_not_change_scores(checkpoint, reward, conversational):
    prompts = CHATS if conversational else PROMPTS
    batched = RewardModel(reward.model, reward.tokenizer, batch_size=8)(prompts, COMPLETIONS)
    single = RewardModel(reward.model, reward.tokenizer, batch_size=1)(prompts, COMPLETIONS)
    three = RewardModel(reward.model, reward.tokenizer, batch_size=3)(prompts, COMPLETIONS)
    assert batched == pytest.approx(single, abs=1e-5)
    assert three == pytest.approx(single, abs=1e-5)
    assert max(single) - min(single) > 0.1


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_batch_size_does_not_change_scores_with_absolute_positions(tokenizer, arch):
    """Llama's rotary positions hide left-padding bugs (a uniform shift changes no attention
    score); learned absolute positions and bidirectional attention (BERT) do not."""
    torch.manual_seed(0)
    size = dict(num_labels=1, pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)
    if arch == "bert":
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            **size,
        )
        model = BertForSequenceClassification(config)
    else:
        config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, **size)
        model = GPT2ForSequenceClassification(config)
    single = RewardModel(model, tokenizer, batch_size=1)(CHATS, COMPLETIONS)
    batched = RewardModel(model, tokenizer, batch_size=8)(CHATS, COMPLETIONS)
    assert batched == pytest.approx(single, abs=1e-5)
    assert max(single) - min(single) > 1e-3


def test_tokenizer_padding_side_does_not_change_scores(checkpoint, reward):
    scores = {}
    for side in ("left", "right"):
        tok = AutoTokenizer.from_pretrained(checkpoint, padding_side=side)
        scores[side] = RewardModel(reward.model, tok, batch_size=4)(CHATS, COMPLETIONS)
        assert tok.padding_side == side  # the caller's tokenizer is not modified
    assert scores["left"] == pytest.approx(scores["right"], abs=1e-5)


def test_model_is_frozen_and_unchanged(reward):
    before = {k: v.clone() for k, v in reward.model.state_dict().items()}
    reward(PROMPTS, COMPLETIONS)
    reward(CHATS, COMPLETIONS)
    assert not reward.model.training
    assert all(not p.requires_grad and p.grad is None for p in reward.model.parameters())
    after = reward.model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_loaded_model_is_frozen_too(tokenizer):
    model = tiny_classifier(len(tokenizer), tokenizer.pad_token_id).train()
    reward = RewardModel(model, tokenizer, name="judge")
    assert reward.__name__ == "judge"
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_pad_token_id_is_set_when_the_checkpoint_has_none(tokenizer):
    model = tiny_classifier(len(tokenizer), pad_token_id=None)
    assert model.config.pad_token_id is None
    reward = RewardModel(model, tokenizer, batch_size=8)
    assert model.config.pad_token_id == tokenizer.pad_token_id
    batched = reward(PROMPTS, COMPLETIONS)  # the model raises on a batch > 1 without a pad id
    single = RewardModel(model, tokenizer, batch_size=1)(PROMPTS, COMPLETIONS)
    assert batched == pytest.approx(single, abs=1e-5)


def test_max_length_keeps_the_end_of_the_input(reward):
    tok = reward.tokenizer
    short = RewardModel(reward.model, tok, max_length=12)
    completion = " the answer is 42"
    prompts = ["First some long preamble that goes on. " * 5, "Other words entirely here! " * 5]
    scores = short(prompts, [completion, completion])
    for prompt, score in zip(prompts, scores, strict=True):
        ids = tok(prompt + completion)["input_ids"]
        assert len(ids) > 12
        assert short.encode([prompt], [completion])[0] == ids[-12:]
        assert score == pytest.approx(reference_score(reward.model, ids[-12:]), abs=1e-5)
    # The completion is what is judged: it survives truncation, so the score still depends on it.
    other = short(prompts[:1], [" the answer is 41"])[0]
    assert abs(other - scores[0]) > 1e-4
    # Without truncation the scores differ from the truncated ones.
    assert reward(prompts[:1], [completion])[0] != pytest.approx(scores[0], abs=1e-4)


def word_tokenizer():
    """A word-level tokenizer that wraps inputs in [CLS] ... [SEP] and has no chat template."""
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    for word in "user assistant : the answer is one two three four five six seven".split():
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )


def test_truncation_keeps_special_tokens_around_the_content():
    tok = word_tokenizer()
    reward = RewardModel(tiny_classifier(len(tok), tok.pad_token_id), tok, max_length=5)
    ids = reward.encode(["one two three four"], [" five six"])[0]
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "four", "five", "six", "[SEP]"]
    assert len(reward(["one two three four"], [" five six"])) == 1


def test_conversation_without_chat_template_is_flattened():
    tok = word_tokenizer()
    assert not tok.chat_template
    reward = RewardModel(tiny_classifier(len(tok), tok.pad_token_id), tok)
    text, from_template = reward.text([{"role": "user", "content": "one two"}], "three")
    assert (text, from_template) == ("user: one two\nassistant: three", False)
    ids = reward.encode([[{"role": "user", "content": "one two"}]], ["three"])[0]
    assert tok.convert_ids_to_tokens(ids)[0] == "[CLS]"
    chat_scores = reward([[{"role": "user", "content": "one two"}]] * 2, ["three", "four"])
    assert all(isinstance(s, float) for s in chat_scores)


def test_label_index_picks_the_logit(tokenizer):
    model = tiny_classifier(len(tokenizer), tokenizer.pad_token_id, num_labels=2)
    ids = tokenizer(PROMPTS[0] + COMPLETIONS[0])["input_ids"]
    for label in (0, 1):
        score = RewardModel(model, tokenizer, label_index=label)(PROMPTS[:1], COMPLETIONS[:1])[0]
        assert score == pytest.approx(reference_score(model, ids, label), abs=1e-5)
    with pytest.raises(ValueError, match="label_index 2"):
        RewardModel(model, tokenizer, label_index=2)


def test_empty_batches_and_empty_texts(reward):
    assert reward([], []) == []
    # A plain prompt and completion that are both empty have no tokens: not applicable.
    smol = RewardModel(reward.model, reward.tokenizer)
    assert smol(["", "Hi"], ["", "there"])[0] is None
    assert isinstance(smol(["", "Hi"], ["", "there"])[1], float)
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        smol(["a", "b"], ["c"])


def test_wrong_path_gives_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        RewardModel(str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OSError, match=str(empty)):
        RewardModel(empty)


def test_a_causal_lm_checkpoint_is_refused(tmp_path, tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"score\.weight.*randomly initialised"):
        RewardModel(tmp_path)


def test_a_model_object_needs_its_tokenizer(reward):
    with pytest.raises(ValueError, match="tokenizer"):
        RewardModel(reward.model)
    with pytest.raises(TypeError, match="path or a PreTrainedModel"):
        RewardModel(42)
