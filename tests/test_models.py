import torch

from groupwise.models import (
    _atomic_save,
    cache_dir,
    load_model_and_tokenizer,
    smollm2_path,
    tiny_random_model,
)


def test_tiny_random_is_seeded_and_small():
    a, b, c = tiny_random_model(seed=0), tiny_random_model(seed=0), tiny_random_model(seed=1)
    params = sum(p.numel() for p in a.parameters())
    assert 1_000_000 < params < 10_000_000
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


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

    from groupwise.models import load_model_and_tokenizer

    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    Gemma2ForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="groupwise.models"):
        model, _ = load_model_and_tokenizer(str(tmp_path), attn_implementation="sdpa")
    assert model.config._attn_implementation == "eager"
    assert "no SDPA attention" in caplog.text
    # An explicit eager request loads without the note.
    caplog.clear()
    model, _ = load_model_and_tokenizer(str(tmp_path), attn_implementation="eager")
    assert model.config._attn_implementation == "eager" and caplog.text == ""
