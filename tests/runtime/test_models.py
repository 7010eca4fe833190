import shutil

import torch

from conftest import TargetToken, tiny_config
from groupwise import GRPOTrainer
from groupwise.runtime import models
from groupwise.runtime.models import (
    _atomic_save,
    build_tiny_random_model,
    cache_dir,
    load_model_and_tokenizer,
    smollm2_path,
    smollm2_tokenizer,
    tiny_random_model,
)


def test_tiny_random_is_seeded_and_small():
    a, b, c = tiny_random_model(seed=0), tiny_random_model(seed=0), tiny_random_model(seed=1)
    params = sum(p.numel() for p in a.parameters())
    assert 1_000_000 < params < 10_000_000
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def _storages(model: torch.nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in model.state_dict().values()}


def test_the_cached_tiny_model_is_a_fresh_build_and_each_caller_owns_its_copy():
    fresh = build_tiny_random_model(seed=0)
    a, b = tiny_random_model(seed=0), tiny_random_model(seed=0)
    for copy in (a, b):
        assert copy.state_dict().keys() == fresh.state_dict().keys()
        for name, tensor in fresh.state_dict().items():
            assert torch.equal(copy.state_dict()[name], tensor), name
        assert copy.config.to_dict() == fresh.config.to_dict()
        assert copy.lm_head.weight is copy.model.embed_tokens.weight  # still tied
    assert not _storages(a) & _storages(b)  # no tensor shared
    with torch.no_grad():
        a.model.embed_tokens.weight.add_(1.0)
    assert torch.equal(b.lm_head.weight, fresh.lm_head.weight)
    assert torch.equal(tiny_random_model(seed=0).lm_head.weight, fresh.lm_head.weight)
    eager = tiny_random_model(seed=0, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    assert torch.equal(eager.lm_head.weight, fresh.lm_head.weight)


def test_a_tiny_model_asked_for_on_the_meta_device_is_not_cached(monkeypatch):
    monkeypatch.setattr(models, "_TINY_RANDOM", {})
    with torch.device("meta"):
        skeleton = tiny_random_model(seed=0)
    assert {p.device.type for p in skeleton.parameters()} == {"meta"}
    assert models._TINY_RANDOM == {}
    model = tiny_random_model(seed=0)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert torch.equal(model.lm_head.weight, build_tiny_random_model(seed=0).lm_head.weight)


def test_the_tiny_model_is_built_once_per_process_for_the_same_arguments(monkeypatch):
    calls = []
    real = models.build_tiny_random_model

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(models, "build_tiny_random_model", counting)
    monkeypatch.setattr(models, "_TINY_RANDOM", {})
    tiny_random_model(seed=7, vocab_size=64)
    tiny_random_model(seed=7, vocab_size=64)
    tiny_random_model(seed=8, vocab_size=64)
    assert calls == [(7, 64, None), (8, 64, None)]
    # Built under another default dtype, the model is built again, in that dtype.
    torch.set_default_dtype(torch.float64)
    try:
        wide = tiny_random_model(seed=7, vocab_size=64)
    finally:
        torch.set_default_dtype(torch.float32)
    assert calls[-1] == (7, 64, None) and len(calls) == 3
    assert wide.lm_head.weight.dtype == torch.float64
    assert tiny_random_model(seed=7, vocab_size=64).lm_head.weight.dtype == torch.float32


def test_the_tokenizer_is_read_once_per_process_and_each_caller_owns_its_copy(
    tmp_path, monkeypatch
):
    shutil.copytree(cache_dir() / "tokenizers", tmp_path / "tokenizers")
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path))
    reads = []
    real = models.AutoTokenizer.from_pretrained

    def counting(*args, **kwargs):
        reads.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", counting)
    a, b = smollm2_tokenizer(), smollm2_tokenizer()
    assert reads == [tmp_path / "tokenizers" / "smollm2"]
    assert a is not b and a._tokenizer is not b._tokenizer
    text = "<|im_start|>user\nWhat is 3 + 4?<|im_end|>"
    assert a(text)["input_ids"] == b(text)["input_ids"]
    a.padding_side = "left"
    a.add_tokens(["<only-in-a>"])
    a.chat_template = "{{ messages }}"
    for other in (b, smollm2_tokenizer()):
        assert other.padding_side == "right" and len(other) == len(b) == len(a) - 1
        assert other.chat_template != a.chat_template


def test_two_trainers_on_tiny_random_share_no_weights(tmp_path):
    rows = [{"prompt": "a b c"}, {"prompt": "d e"}] * 4
    first = GRPOTrainer("tiny-random", TargetToken(), rows, args=tiny_config(tmp_path / "1"))
    second = GRPOTrainer("tiny-random", TargetToken(), rows, args=tiny_config(tmp_path / "2"))
    assert not _storages(first.model) & _storages(second.model)
    assert first.tokenizer is not second.tokenizer
    first.train()
    fresh = build_tiny_random_model(seed=0).state_dict()
    trained = first.model.state_dict()
    assert any(not torch.equal(trained[name], fresh[name]) for name in fresh)  # it learned
    for name, tensor in second.model.state_dict().items():
        assert torch.equal(tensor, fresh[name]), name


def test_smollm2_conversion_gives_a_working_model():
    # The converted GGUF must be the real model: a broken dequantisation or q/k permutation
    # would not answer a one-line sum correctly.
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) > 130_000_000
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1] :])
    assert "7" in answer, answer
    path = smollm2_path()
    assert path.parent == cache_dir() / "models"
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]  # no half-written cache


def test_atomic_save_leaves_nothing_on_failure(tmp_path):
    def crash(folder):
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt  # interrupted mid-conversion

    target = tmp_path / "models" / "m"
    try:
        _atomic_save(target, crash)
    except KeyboardInterrupt:
        pass
    assert not target.exists()
    assert list((tmp_path / "models").iterdir()) == []


def test_an_architecture_without_sdpa_loads_with_eager_attention(tmp_path, tokenizer, caplog):
    # Gemma2 has no SDPA kernel in transformers: the default attn_implementation ("sdpa") must
    # not make it unloadable; it falls back to eager, as transformers' own default does.
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from groupwise.runtime.models import load_model_and_tokenizer

    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    Gemma2ForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="groupwise.runtime.models"):
        model, _ = load_model_and_tokenizer(str(tmp_path), attn_implementation="sdpa")
    assert model.config._attn_implementation == "eager"
    assert "no SDPA attention" in caplog.text
    # An explicit eager request loads without the note.
    caplog.clear()
    model, _ = load_model_and_tokenizer(str(tmp_path), attn_implementation="eager")
    assert model.config._attn_implementation == "eager" and caplog.text == ""
