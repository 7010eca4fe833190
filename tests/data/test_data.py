"""Tests for groupwise.data: the arithmetic task, JSONL loading and prompt tokenization.

No model or real tokenizer is loaded: a tiny fake tokenizer records how it is called.
"""

import json
import re

import pytest

from groupwise.data.files import load_jsonl
from groupwise.data.prompts import (
    filter_long_prompts,
    is_conversational,
    prompt_text,
    tokenize_prompts,
)
from groupwise.tasks.arithmetic import arithmetic_dataset


def evaluate(expression: str) -> int:
    """Independent evaluator for 'a op b op c' with + - * (multiplication binds tighter)."""
    tokens = expression.split()
    numbers = [int(t) for t in tokens[0::2]]
    ops = tokens[1::2]
    terms = [numbers[0]]
    signs = [1]
    for op, number in zip(ops, numbers[1:], strict=True):
        if op == "*":
            terms[-1] *= number
        else:
            terms.append(number)
            signs.append(1 if op == "+" else -1)
    return sum(sign * term for sign, term in zip(signs, terms, strict=True))


@pytest.mark.parametrize(
    "expression, value",
    [
        ("2 + 3 * 4", 14),
        ("7 - 2 * 3 - 1", 0),
        ("9 * 9 * 9", 729),
        ("0 - 8", -8),
        ("5 * 0 + 3", 3),
        ("12 - 34 + 56", 34),
    ],
)
def test_reference_evaluator(expression, value):
    assert evaluate(expression) == value


# ---------------------------------------------------------------------------------------------
# arithmetic_dataset
# ---------------------------------------------------------------------------------------------

KW = {"digits": 1, "min_operands": 2, "max_operands": 3}


def test_deterministic_for_seed():
    first = arithmetic_dataset(40, seed=3, **KW)
    second = arithmetic_dataset(40, seed=3, **KW)
    assert first == second
    other = arithmetic_dataset(40, seed=4, **KW)
    assert [r["expression"] for r in first] != [r["expression"] for r in other]


def test_larger_request_extends_smaller_one():
    # Same seed: the first problems are the same whatever the size asked for.
    small = arithmetic_dataset(10, seed=1, **KW)
    large = arithmetic_dataset(30, seed=1, **KW)
    assert large[:10] == small


def test_train_and_eval_never_share_an_expression():
    train = arithmetic_dataset(150, split="train", seed=0, **KW)
    evals = arithmetic_dataset(60, split="eval", seed=0, **KW)
    assert len(train) == 150 and len(evals) == 60
    train_expr = {r["expression"] for r in train}
    eval_expr = {r["expression"] for r in evals}
    assert train_expr.isdisjoint(eval_expr)
    # Also across different seeds.
    eval_other_seed = arithmetic_dataset(60, split="eval", seed=7, **KW)
    assert train_expr.isdisjoint({r["expression"] for r in eval_other_seed})


def test_distinct_within_split():
    for split in ("train", "eval"):
        rows = arithmetic_dataset(120, split=split, seed=2, **KW)
        expressions = [r["expression"] for r in rows]
        assert len(set(expressions)) == 120


def test_answers_and_difficulty_are_correct():
    rows = arithmetic_dataset(150, seed=0, **KW)
    counts = set()
    for row in rows:
        assert row["answer"] == str(evaluate(row["expression"]))
        num_operands = len(row["expression"].split()) // 2 + 1
        counts.add(num_operands)
        assert row["difficulty"] == 10 * 1 + num_operands
        assert set(row) == {"prompt", "answer", "difficulty", "expression"}
    assert counts == {2, 3}


def test_operands_follow_digits_and_ops():
    rows = arithmetic_dataset(50, seed=0, digits=2, min_operands=3, max_operands=3, ops="-*")
    for row in rows:
        tokens = row["expression"].split()
        assert len(tokens) == 5
        assert all(10 <= int(t) <= 99 for t in tokens[0::2])
        assert all(op in ("-", "*") for op in tokens[1::2])
        assert row["difficulty"] == 23
        assert row["answer"] == str(evaluate(row["expression"]))
    one_digit = arithmetic_dataset(50, seed=0, digits=1, ops="+")
    for row in one_digit:
        assert re.fullmatch(r"\d \+ \d", row["expression"])


def test_prompt_with_few_shot():
    row = arithmetic_dataset(1, seed=0, few_shot=True, **KW)[0]
    prompt = row["prompt"]
    assert is_conversational(prompt)
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert "<think>" in prompt[0]["content"] and "<answer>" in prompt[0]["content"]
    assert prompt[1] == {"role": "user", "content": "What is 4 * 2 - 1?"}
    assert prompt[2] == {
        "role": "assistant",
        "content": "<think> 4 * 2 = 8, 8 - 1 = 7 </think> <answer> 7 </answer>",
    }
    assert prompt[3] == {"role": "user", "content": f"What is {row['expression']}?"}


def test_prompt_without_few_shot():
    rows = arithmetic_dataset(5, seed=0, few_shot=False, **KW)
    for row in rows:
        prompt = row["prompt"]
        assert [m["role"] for m in prompt] == ["system", "user"]
        assert prompt[1] == {"role": "user", "content": f"What is {row['expression']}?"}
    # The problems themselves don't depend on few_shot.
    with_example = arithmetic_dataset(5, seed=0, few_shot=True, **KW)
    assert [r["expression"] for r in rows] == [r["expression"] for r in with_example]


def test_zero_problems():
    assert arithmetic_dataset(0) == []


def test_too_many_problems_raises():
    # digits=1, two operands, "+": only 10 * 10 = 100 expressions in all, about a quarter eval.
    with pytest.raises(ValueError) as info:
        arithmetic_dataset(500, split="eval", digits=1, min_operands=2, max_operands=2, ops="+")
    message = str(info.value)
    assert "distinct eval problems" in message
    assert "num_eval_prompts=500 asks for more" in message
    match = re.search(r"at most (\d+) distinct", message)
    assert match is not None
    num_eval = int(match.group(1))
    assert 0 < num_eval < 100
    # Exactly that many eval problems exist, and the rest (100 - num_eval) are train problems:
    # together they are all 100 expressions "a + b".
    small = {"digits": 1, "min_operands": 2, "max_operands": 2, "ops": "+"}
    evals = arithmetic_dataset(num_eval, split="eval", **small)
    train = arithmetic_dataset(100 - num_eval, split="train", **small)
    everything = {f"{a} + {b}" for a in range(10) for b in range(10)}
    assert {r["expression"] for r in evals} | {r["expression"] for r in train} == everything
    with pytest.raises(ValueError, match=f"at most {100 - num_eval} distinct train problems"):
        arithmetic_dataset(100 - num_eval + 1, split="train", **small)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"digits": 0}, "digits >= 1"),
        ({"min_operands": 1}, "min_operands"),
        ({"min_operands": 3, "max_operands": 2}, "max_operands"),
        ({"ops": ""}, "ops must be a non-empty subset"),
        ({"ops": "/"}, "ops must be a non-empty subset"),
        ({"ops": "+x"}, "ops must be a non-empty subset"),
        ({"split": "test"}, "split must be 'train' or 'eval'"),
    ],
)
def test_bad_arguments(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        arithmetic_dataset(3, **kwargs)


# ---------------------------------------------------------------------------------------------
# load_jsonl
# ---------------------------------------------------------------------------------------------


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_jsonl_good_file(tmp_path):
    conversation = [{"role": "user", "content": "hi"}]
    path = write_lines(
        tmp_path / "data.jsonl",
        [
            json.dumps({"prompt": "What is 1 + 1?", "answer": "2"}),
            "",  # blank lines are skipped
            json.dumps({"prompt": conversation, "answer": "3", "extra": 5}),
        ],
    )
    rows = load_jsonl(path)
    assert rows == [
        {"prompt": "What is 1 + 1?", "answer": "2"},
        {"prompt": [{"role": "user", "content": "hi"}], "answer": "3", "extra": 5},
    ]


def test_load_jsonl_prompt_column_is_renamed(tmp_path):
    path = write_lines(tmp_path / "q.jsonl", [json.dumps({"question": "Q?", "answer": "1"})])
    assert load_jsonl(path, prompt_column="question") == [{"prompt": "Q?", "answer": "1"}]
    # The default column is missing from this file.
    with pytest.raises(ValueError, match=r":1: expected an object with a 'prompt' key"):
        load_jsonl(path)


def test_load_jsonl_invalid_json_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"prompt": "a"}), "{not json"])
    with pytest.raises(ValueError) as info:
        load_jsonl(path)
    assert str(info.value).startswith(f"{path}:2: not valid JSON")


def test_load_jsonl_line_numbers_count_blank_lines(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", ["", json.dumps({"prompt": "a"}), "", "[1, 2]"])
    with pytest.raises(ValueError) as info:
        load_jsonl(path)
    assert str(info.value) == f"{path}:4: expected an object with a 'prompt' key"


def test_load_jsonl_missing_prompt_key(tmp_path):
    path = write_lines(
        tmp_path / "missing.jsonl",
        [json.dumps({"prompt": "a"}), json.dumps({"prompt": "b"}), json.dumps({"text": "c"})],
    )
    with pytest.raises(ValueError) as info:
        load_jsonl(path)
    assert str(info.value) == f"{path}:3: expected an object with a 'prompt' key"


@pytest.mark.parametrize("bad_prompt", [5, None, {"role": "user"}, ["just", "strings"]])
def test_load_jsonl_bad_prompt_type(tmp_path, bad_prompt):
    path = write_lines(tmp_path / "type.jsonl", [json.dumps({"prompt": bad_prompt})])
    with pytest.raises(ValueError) as info:
        load_jsonl(path)
    assert str(info.value).startswith(f"{path}:1: 'prompt' must be a string or a list of")


def test_load_jsonl_empty_file(tmp_path):
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n\n")):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError) as info:
            load_jsonl(path)
        assert str(info.value) == f"{path}: no rows"


# ---------------------------------------------------------------------------------------------
# prompt_text / tokenize_prompts with a fake tokenizer
# ---------------------------------------------------------------------------------------------


class FakeTokenizer:
    """Character-level: token id = ord(char); BOS id 1 if add_special_tokens is true."""

    def __init__(self):
        self.template_calls = []
        self.encode_calls = []

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        self.template_calls.append(
            {"add_generation_prompt": add_generation_prompt, "tokenize": tokenize}
        )
        text = "".join(f"[{m['role']}]{m['content']}" for m in messages)
        if add_generation_prompt:
            text += "[assistant]"
        if tokenize:
            return [ord(c) for c in text]
        return text

    def __call__(self, text, add_special_tokens=True):
        self.encode_calls.append({"text": text, "add_special_tokens": add_special_tokens})
        ids = [ord(c) for c in text]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


def test_is_conversational():
    assert is_conversational([{"role": "user", "content": "x"}])
    assert not is_conversational("x")
    assert not is_conversational(["x"])
    assert not is_conversational([{"content": "x"}])


def test_prompt_text_conversation_uses_chat_template_with_generation_prompt():
    tok = FakeTokenizer()
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert prompt_text(messages, tok) == "[system]S[user]Q[assistant]"
    assert tok.template_calls == [{"add_generation_prompt": True, "tokenize": False}]


def test_prompt_text_string_passes_through():
    tok = FakeTokenizer()
    assert prompt_text("plain text", tok) == "plain text"
    assert tok.template_calls == []


def test_prompt_text_bad_type():
    with pytest.raises(TypeError, match="got int"):
        prompt_text(5, FakeTokenizer())


def test_tokenize_prompts_strings_and_conversations():
    tok = FakeTokenizer()
    ids = tokenize_prompts(["ab", [{"role": "u", "content": "c"}]], tok, max_prompt_length=None)
    # "ab" -> 97, 98 (no BOS); "[u]c[assistant]" -> 15 characters.
    assert ids[0] == [97, 98]
    assert ids[1] == [ord(c) for c in "[u]c[assistant]"]
    assert len(ids[1]) == 15
    assert [c["add_special_tokens"] for c in tok.encode_calls] == [False, False]
    assert [c["text"] for c in tok.encode_calls] == ["ab", "[u]c[assistant]"]


def test_tokenize_prompts_left_truncation_keeps_last_tokens():
    tok = FakeTokenizer()
    ids = tokenize_prompts(["abcdef", "xyz", "pq"], tok, max_prompt_length=3)
    # "abcdef" keeps "def" = 100, 101, 102; "xyz" fits exactly; "pq" is shorter.
    assert ids == [[100, 101, 102], [120, 121, 122], [112, 113]]


def test_tokenize_prompts_truncation_keeps_generation_prompt():
    tok = FakeTokenizer()
    conversation = [{"role": "user", "content": "a long question"}]
    (ids,) = tokenize_prompts([conversation], tok, max_prompt_length=11)
    assert "".join(chr(i) for i in ids) == "[assistant]"


# ---------------------------------------------------------------------------------------------
# filter_long_prompts
# ---------------------------------------------------------------------------------------------


def test_filter_long_prompts_skips_and_counts():
    tok = FakeTokenizer()
    rows = [
        {"prompt": "abc", "answer": "1"},  # 3 tokens
        {"prompt": "abcd", "answer": "2"},  # 4 tokens: too long
        {"prompt": [{"role": "u", "content": ""}], "answer": "3"},  # "[u][assistant]": 14
        {"prompt": "", "answer": "4"},  # 0 tokens
    ]
    kept, skipped = filter_long_prompts(rows, tok, max_prompt_length=3)
    assert kept == [rows[0], rows[3]] and skipped == 2
    # The chat template with its generation prompt is counted, without a BOS.
    kept, skipped = filter_long_prompts(rows, tok, max_prompt_length=14)
    assert kept == rows and skipped == 0
    kept, skipped = filter_long_prompts(rows, tok, max_prompt_length=13)
    assert kept == [rows[0], rows[1], rows[3]] and skipped == 1
    assert all(c["add_special_tokens"] is False for c in tok.encode_calls)


def test_filter_long_prompts_error_names_row_and_length():
    rows = [{"prompt": "ab"}, {"prompt": "abcdefg"}, {"prompt": "abcdefghi"}]
    with pytest.raises(ValueError) as info:
        filter_long_prompts(rows, FakeTokenizer(), max_prompt_length=5, on_long="error")
    assert str(info.value) == "row 1: prompt is 7 tokens, longer than max_prompt_length=5"
    kept, skipped = filter_long_prompts(rows, FakeTokenizer(), 9, on_long="error")
    assert kept == rows and skipped == 0


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"max_prompt_length": 0}, "max_prompt_length must be >= 1, got 0"),
        ({"max_prompt_length": 4, "on_long": "truncate"}, "on_long must be 'skip' or 'error'"),
    ],
)
def test_filter_long_prompts_bad_arguments(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        filter_long_prompts([{"prompt": "a"}], FakeTokenizer(), **kwargs)
