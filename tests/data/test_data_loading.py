"""Tests for groupwise.data.load_dataset_rows: file formats, column renaming, system prompts and
templates, validation messages and skip counts. Every file is written by hand in tmp_path."""

import builtins
import json
import sys
import types
from collections import Counter

import pytest

from groupwise.data.rows import LoadReport, load_dataset_rows

CONVERSATION = [{"role": "user", "content": "hi"}]


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_jsonl(path, records):
    return write_lines(path, [json.dumps(r) for r in records])


class FakeDataset:
    """What load_dataset_rows needs of a Hugging Face Dataset."""

    def __init__(self, records):
        self.records = records
        self.column_names = list(records[0]) if records else []

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        if not isinstance(index, int):
            raise TypeError("integer index only")
        return dict(self.records[index])


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------


def test_jsonl(tmp_path):
    path = write_lines(
        tmp_path / "d.jsonl",
        [
            json.dumps({"prompt": "What is 1 + 1?", "answer": "2", "level": 1}),
            "",
            json.dumps({"prompt": CONVERSATION, "answer": 3, "level": 2}),
        ],
    )
    rows, report = load_dataset_rows(path)
    assert rows == [
        {"prompt": "What is 1 + 1?", "answer": "2", "level": 1},
        {"prompt": CONVERSATION, "answer": "3", "level": 2},
    ]
    assert isinstance(report, LoadReport)
    assert (report.rows_read, report.rows_kept, report.skipped) == (2, 2, Counter())
    assert report.summary() == f"{path}: read 2 rows, kept 2, skipped 0"


def test_json_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(
        json.dumps([{"q": "A?", "a": 1.5}, {"q": CONVERSATION, "a": "x", "id": 7}]),
        encoding="utf-8",
    )
    rows, report = load_dataset_rows(path, prompt_column="q", answer_column="a")
    assert rows == [
        {"prompt": "A?", "answer": "1.5"},
        {"prompt": CONVERSATION, "answer": "x", "id": 7},
    ]
    assert report.rows_kept == 2


def test_json_must_be_a_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"prompt": "A?"}), encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert str(info.value).startswith(f"{path}: a .json dataset must be a list of objects")


def test_json_syntax_error_names_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[\n{"prompt": "a"},\n{"prompt": }\n]', encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert str(info.value).startswith(f"{path}:3: not valid JSON")


def test_csv(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(
        'question,solution,topic\n"What is 2, plus 2?",4,math\n"multi\nline",5,misc\n',
        encoding="utf-8",
    )
    rows, report = load_dataset_rows(path, prompt_column="question", answer_column="solution")
    assert rows == [
        {"prompt": "What is 2, plus 2?", "answer": "4", "topic": "math"},
        {"prompt": "multi\nline", "answer": "5", "topic": "misc"},
    ]
    assert (report.rows_read, report.rows_kept) == (2, 2)


def test_in_memory_list_and_fake_hf_dataset():
    records = [{"text": "A?", "answer": 1}, {"text": "B?", "answer": "2"}]
    expected = [{"prompt": "A?", "answer": "1"}, {"prompt": "B?", "answer": "2"}]
    rows, report = load_dataset_rows(records, prompt_column="text")
    assert rows == expected and report.source == "<list>"
    rows, report = load_dataset_rows(FakeDataset(records), prompt_column="text")
    assert rows == expected and report.source == "<FakeDataset>"
    assert records[0] == {"text": "A?", "answer": 1}  # the input is not modified


def test_fake_hf_dataset_missing_column_lists_column_names():
    dataset = FakeDataset([{"text": "A?", "label": "1"}])
    with pytest.raises(ValueError) as info:
        load_dataset_rows(dataset)
    assert (
        str(info.value) == "<FakeDataset>: no 'prompt' column; available columns: ['text', 'label']"
    )


def test_dataset_dict_like_split_selection():
    splits = {"train": FakeDataset([{"prompt": "T"}]), "test": FakeDataset([{"prompt": "E"}])}
    assert load_dataset_rows(splits, split="test")[0] == [{"prompt": "E"}]
    assert load_dataset_rows(splits, split="train")[0] == [{"prompt": "T"}]
    with pytest.raises(ValueError, match=r"holds splits \['train', 'test'\]; pass split="):
        load_dataset_rows(splits)
    with pytest.raises(ValueError, match=r"has no split 'dev'; splits: \['train', 'test'\]"):
        load_dataset_rows(splits, split="dev")
    # A single split needs no name.
    assert load_dataset_rows({"only": FakeDataset([{"prompt": "O"}])})[0] == [{"prompt": "O"}]


def test_split_on_a_file_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    with pytest.raises(ValueError, match="split= only applies to Hugging Face datasets"):
        load_dataset_rows(path, split="train")


def test_unknown_extension_and_missing_file(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("hello", encoding="utf-8")
    with pytest.raises(ValueError, match=r"unknown dataset format '\.txt'"):
        load_dataset_rows(path)
    with pytest.raises(FileNotFoundError, match="nope.jsonl: no such file"):
        load_dataset_rows(tmp_path / "nope.jsonl")


def block_import(monkeypatch, blocked):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == blocked or name.startswith(blocked + "."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    block_import(monkeypatch, "pyarrow")
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ImportError) as info:
        load_dataset_rows(path)
    message = str(info.value)
    assert message.startswith(f"{path}: reading a Parquet file needs the optional package")
    assert message.endswith("pip install pyarrow")


def test_hf_directory_without_datasets_says_how_to_install(tmp_path, monkeypatch):
    block_import(monkeypatch, "datasets")
    with pytest.raises(ImportError) as info:
        load_dataset_rows(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path}: reading a saved Hugging Face dataset needs")
    assert message.endswith("pip install datasets")


# ---------------------------------------------------------------------------------------------
# Columns
# ---------------------------------------------------------------------------------------------


def test_missing_prompt_column_names_file_and_lists_columns(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "answer": "1"}, {"extra": 2}])
    for on_invalid in ("error", "skip"):
        with pytest.raises(ValueError) as info:
            load_dataset_rows(path, on_invalid=on_invalid)
        assert str(info.value) == (
            f"{path}: no 'prompt' column; available columns: ['question', 'answer', 'extra']"
        )


def test_missing_prompt_column_in_csv(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("question,answer\nQ,1\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert (
        str(info.value) == f"{path}: no 'prompt' column; available columns: ['question', 'answer']"
    )


def test_answer_column_is_optional_unless_named(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "id": 1}])
    assert load_dataset_rows(path)[0] == [{"prompt": "a", "id": 1}]
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path, answer_column="solution")
    assert str(info.value) == f"{path}: no 'solution' column; available columns: ['prompt', 'id']"


def test_answer_column_none_keeps_answer_as_is(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": [1, 2]}])
    assert load_dataset_rows(path, answer_column=None)[0] == [{"prompt": "a", "answer": [1, 2]}]


def test_renaming_onto_an_existing_column_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "question": "q", "answer": "1"}])
    with pytest.raises(ValueError, match="'question' would be renamed to 'prompt', but a 'prompt'"):
        load_dataset_rows(path, prompt_column="question")
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "p", "sol": "2", "answer": "1"}])
    with pytest.raises(ValueError, match="'sol' would be renamed to 'answer', but an? 'answer'"):
        load_dataset_rows(path, answer_column="sol")


def test_renamed_columns_come_first_others_kept(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": 3, "sol": 9, "q": "Q", "meta": {"k": 1}}])
    rows, _ = load_dataset_rows(path, prompt_column="q", answer_column="sol")
    assert rows == [{"prompt": "Q", "answer": "9", "id": 3, "meta": {"k": 1}}]
    assert list(rows[0]) == ["prompt", "answer", "id", "meta"]


# ---------------------------------------------------------------------------------------------
# System prompt and template
# ---------------------------------------------------------------------------------------------


def test_system_prompt_makes_plain_prompt_a_conversation(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Q?"}, {"prompt": CONVERSATION}])
    rows, _ = load_dataset_rows(path, system_prompt="Be brief.")
    system = {"role": "system", "content": "Be brief."}
    assert rows[0]["prompt"] == [system, {"role": "user", "content": "Q?"}]
    assert rows[1]["prompt"] == [system, {"role": "user", "content": "hi"}]


def test_system_prompt_refuses_a_second_system_message(tmp_path):
    conversation = [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": conversation}])
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path, system_prompt="Other.")
    assert str(info.value).startswith(f"{path}:1: the conversation already starts with a system")


def test_prompt_template_formats_plain_prompts_with_any_column(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "2+2?", "answer": 4, "topic": "math"}])
    rows, _ = load_dataset_rows(
        path, prompt_column="question", prompt_template="[{topic}] Question: {prompt}\nAnswer:"
    )
    assert rows == [{"prompt": "[math] Question: 2+2?\nAnswer:", "answer": "4", "topic": "math"}]
    # The original column name works too.
    rows, _ = load_dataset_rows(path, prompt_column="question", prompt_template="Q: {question}")
    assert rows[0]["prompt"] == "Q: 2+2?"


def test_prompt_template_then_system_prompt(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2?"}])
    rows, _ = load_dataset_rows(path, prompt_template="Q: {prompt}", system_prompt="S")
    assert rows[0]["prompt"] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q: 2+2?"},
    ]


def test_prompt_template_missing_field_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}])
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path, prompt_template="{context}\n{prompt}")
    assert str(info.value) == (
        f"prompt_template '{{context}}\\n{{prompt}}' uses ['context'], which {path} does not "
        "have; available columns: ['answer', 'prompt']"
    )


def test_prompt_template_field_missing_in_one_row(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "ctx": "c"}, {"prompt": "b"}])
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path, prompt_template="{ctx}: {prompt}")
    assert str(info.value).startswith(f"{path}:2: prompt_template uses 'ctx', which this row")
    rows, report = load_dataset_rows(path, prompt_template="{ctx}: {prompt}", on_invalid="skip")
    assert rows == [{"prompt": "c: a", "ctx": "c"}]
    assert report.skipped == Counter({"missing template field": 1})


@pytest.mark.parametrize("template", ["{} {prompt}", "{0}", "{prompt", "x}"])
def test_prompt_template_bad_format(tmp_path, template):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    with pytest.raises(ValueError, match="prompt_template"):
        load_dataset_rows(path, prompt_template=template)


def test_prompt_template_with_conversation_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": CONVERSATION}])
    with pytest.raises(ValueError, match=r":1: prompt_template applies to plain-text prompts"):
        load_dataset_rows(path, prompt_template="Q: {prompt}")


# ---------------------------------------------------------------------------------------------
# Validation: errors and skip counts
# ---------------------------------------------------------------------------------------------


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = write_lines(
        tmp_path / "d.jsonl", ["", json.dumps({"prompt": "a"}), "{oops", json.dumps([1])]
    )
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert str(info.value).startswith(f"{path}:3: not valid JSON at column 2 (")
    rows, report = load_dataset_rows(path, on_invalid="skip")
    assert rows == [{"prompt": "a"}]
    assert report.rows_read == 3 and report.rows_kept == 1
    assert report.skipped == Counter({"malformed JSON": 1, "not an object": 1})
    summary = report.summary()
    assert summary.startswith(
        f"{path}: read 3 rows, kept 1, skipped 2 (malformed JSON: 1, not an object: 1)"
    )
    assert f"{path}:4: expected a JSON object, got list" in summary


@pytest.mark.parametrize(
    "record, reason, message",
    [
        ({"prompt": "", "answer": "1"}, "empty prompt", ":2: 'prompt' is empty"),
        ({"prompt": "  \n", "answer": "1"}, "empty prompt", ":2: 'prompt' is empty"),
        ({"prompt": [], "answer": "1"}, "empty prompt", ":2: 'prompt' is empty"),
        ({"prompt": None, "answer": "1"}, "empty prompt", ":2: 'prompt' is empty"),
        ({"prompt": 5, "answer": "1"}, "invalid prompt", ":2: 'prompt' must be a string or"),
        ({"prompt": ["x"], "answer": "1"}, "invalid prompt", "got list"),
        ({"answer": "1"}, "missing prompt", ":2: no 'prompt' key; keys: ['answer']"),
        ({"prompt": "a"}, "missing answer", ":2: no 'answer' key; keys: ['prompt']"),
        (
            {"prompt": "a", "answer": None},
            "invalid answer",
            "'answer' must be a string or a number, got None",
        ),
        ({"prompt": "a", "answer": [1]}, "invalid answer", "got list"),
        ({"prompt": "a", "answer": {"v": 1}}, "invalid answer", "got dict"),
        ({"prompt": "a", "answer": True}, "invalid answer", "got bool"),
        ({"prompt": "a", "answer": ""}, "empty answer", ":2: 'answer' is empty"),
    ],
)
def test_invalid_row_error_and_skip(tmp_path, record, reason, message):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok", "answer": "0"}, record])
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)
    rows, report = load_dataset_rows(path, on_invalid="skip")
    assert rows == [{"prompt": "ok", "answer": "0"}]
    assert (report.rows_read, report.rows_kept) == (2, 1)
    assert report.skipped == Counter({reason: 1})
    assert message in report.summary()


def test_numbers_become_strings(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "a", "answer": 7},
            {"prompt": "b", "answer": -2.5},
            {"prompt": "c", "answer": 0},
        ],
    )
    rows, _ = load_dataset_rows(path)
    assert [r["answer"] for r in rows] == ["7", "-2.5", "0"]


def test_skip_counts_several_reasons(tmp_path):
    path = write_lines(
        tmp_path / "d.jsonl",
        [
            json.dumps({"prompt": "a", "answer": 1}),
            json.dumps({"prompt": "", "answer": 1}),
            json.dumps({"prompt": "", "answer": 2}),
            json.dumps({"prompt": "b", "answer": None}),
            "not json",
            json.dumps({"prompt": "c", "answer": "3"}),
        ],
    )
    rows, report = load_dataset_rows(path, on_invalid="skip")
    assert [r["prompt"] for r in rows] == ["a", "c"]
    assert report.rows_read == 6 and report.rows_kept == 2
    assert report.skipped == Counter({"empty prompt": 2, "invalid answer": 1, "malformed JSON": 1})
    assert report.rows_kept + sum(report.skipped.values()) == report.rows_read
    assert "(empty prompt: 2, invalid answer: 1, malformed JSON: 1)" in report.summary()


def test_no_usable_rows_is_an_error_even_when_skipping(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": ""}, {"prompt": " "}])
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path, on_invalid="skip")
    assert str(info.value).startswith(f"{path}: no usable rows; {path}: read 2 rows, kept 0")
    bad = write_lines(tmp_path / "bad.jsonl", ["{", "nope"])
    with pytest.raises(ValueError, match=r"no usable rows; .*malformed JSON: 2"):
        load_dataset_rows(bad, on_invalid="skip")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not valid JSON"):
        load_dataset_rows(bad)


def test_empty_file(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert str(info.value) == f"{path}: no rows"


def test_on_invalid_must_be_known(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    with pytest.raises(ValueError, match="on_invalid must be 'error' or 'skip', got 'drop'"):
        load_dataset_rows(path, on_invalid="drop")


def test_csv_without_header(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(empty)
    assert str(info.value) == f"{empty}: CSV file has no header line naming the columns"
    # A data line where the header should be: the error shows what was taken as the header.
    headless = tmp_path / "headless.csv"
    headless.write_text("What is 1 + 1?,2\nWhat is 2 + 2?,4\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(headless)
    assert str(info.value) == (
        f"{headless}: no 'prompt' column; available columns: ['What is 1 + 1?', '2']"
    )
    blank_name = tmp_path / "blank.csv"
    blank_name.write_text("prompt,,answer\na,b,c\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"blank.csv: CSV header has an empty column name"):
        load_dataset_rows(blank_name)
    repeated = tmp_path / "repeated.csv"
    repeated.write_text("prompt,answer,answer\na,b,c\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"repeated.csv: CSV header repeats column names \['answer'\]"
    ):
        load_dataset_rows(repeated)


def test_csv_ragged_row_names_line(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\na,1\nb,2,extra\n\nc\nd,4\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert str(info.value) == f"{path}:3: CSV row has 3 fields, the header has 2"
    rows, report = load_dataset_rows(path, on_invalid="skip")
    assert rows == [{"prompt": "a", "answer": "1"}, {"prompt": "d", "answer": "4"}]
    assert report.skipped == Counter({"malformed CSV row": 2})
    assert f"{path}:3:" in report.summary()


def test_csv_empty_cells(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\n,1\nb,\nc,3\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert str(info.value) == f"{path}:2: 'prompt' is empty"
    rows, report = load_dataset_rows(path, on_invalid="skip")
    assert rows == [{"prompt": "c", "answer": "3"}]
    assert report.skipped == Counter({"empty prompt": 1, "empty answer": 1})


def test_json_item_index_in_messages(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"prompt": "a"}, 3, {"prompt": ""}]), encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(path)
    assert str(info.value) == f"{path}[item 1]: expected an object, got int"
    rows, report = load_dataset_rows(path, on_invalid="skip")
    assert rows == [{"prompt": "a"}]
    assert report.skipped == Counter({"not an object": 1, "empty prompt": 1})


def test_fake_hf_dataset_invalid_row_names_row_index():
    dataset = FakeDataset([{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}])
    with pytest.raises(ValueError) as info:
        load_dataset_rows(dataset)
    assert str(info.value).startswith("<FakeDataset>[row 1]: 'answer' must be a string")


class FakeDatasetDict(dict):
    """Like datasets.DatasetDict: a dict of splits that also has column_names (a dict)."""

    @property
    def column_names(self):
        return {name: split.column_names for name, split in self.items()}


def test_hf_directory_with_fake_datasets_module(tmp_path, monkeypatch):
    calls = []

    def load_from_disk(path):
        calls.append(path)
        return FakeDatasetDict(
            train=FakeDataset([{"question": "T?", "answer": 1}]),
            test=FakeDataset([{"question": "E?", "answer": 2}]),
        )

    monkeypatch.setitem(
        sys.modules, "datasets", types.SimpleNamespace(load_from_disk=load_from_disk)
    )
    rows, report = load_dataset_rows(tmp_path, prompt_column="question", split="test")
    assert rows == [{"prompt": "E?", "answer": "2"}]
    assert calls == [str(tmp_path)] and report.source == str(tmp_path)
    with pytest.raises(ValueError, match=r"holds splits \['train', 'test'\]; pass split="):
        load_dataset_rows(tmp_path, prompt_column="question")


def test_in_memory_dataset_dict_is_split_not_dataset():
    splits = FakeDatasetDict(train=FakeDataset([{"prompt": "T"}]))
    rows, _ = load_dataset_rows(splits)
    assert rows == [{"prompt": "T"}]
