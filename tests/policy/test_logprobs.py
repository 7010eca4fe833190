import inspect

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from groupwise.policy.logprobs import (
    ChunkedLMHeadLogprob,
    _is_plain_linear,
    completion_logprobs,
    full_logits_logprobs,
)
from groupwise.runtime.kv_cache import cache_keyword, returned_cache


def _batch(group: int = 3):
    torch.manual_seed(1)
    # Two prompts of different lengths (left padded), `group` completions each (right padded).
    prompt_ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]])
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    completion_ids = torch.randint(3, 1000, (2 * group, 6))
    lengths = torch.tensor([6, 2, 4, 1, 5, 3][: 2 * group])
    completion_mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    return prompt_ids, prompt_mask, completion_ids * completion_mask, completion_mask


def test_chunked_matches_full_logits(tiny_model):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    rows = torch.arange(6) // 3
    expected = full_logits_logprobs(
        tiny_model, prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask, 0.7
    )
    for group, chunk in ((1, 4), (3, 4), (3, 1000)):
        p_ids = prompt_ids if group == 3 else prompt_ids[rows]
        p_mask = prompt_mask if group == 3 else prompt_mask[rows]
        logp, entropy = completion_logprobs(
            tiny_model,
            p_ids,
            p_mask,
            completion_ids,
            completion_mask,
            temperature=0.7,
            chunk_size=chunk,
            group_size=group,
        )
        torch.testing.assert_close(logp, expected, atol=1e-5, rtol=1e-5)
        assert (logp[completion_mask == 0] == 0).all()
        assert (entropy[completion_mask == 1] > 0).all()


def test_entropy_matches_direct_computation(tiny_model):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch(group=1)
    _, entropy = completion_logprobs(
        tiny_model, prompt_ids, prompt_mask, completion_ids, completion_mask, chunk_size=3
    )
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    logits = tiny_model(
        input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
    ).logits[:, 4:10]
    logp = torch.log_softmax(logits.float(), -1)
    direct = -(logp.exp() * logp).sum(-1) * completion_mask
    torch.testing.assert_close(entropy, direct, atol=1e-4, rtol=1e-4)


def test_gradients_match_full_logits_and_shared_prompt(tiny_model):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    rows = torch.arange(6) // 3
    weights = torch.randn(completion_ids.shape)

    def grads(fn):
        tiny_model.zero_grad()
        (fn() * weights).sum().backward()
        return [p.grad.clone() for p in tiny_model.parameters()]

    reference = grads(
        lambda: full_logits_logprobs(
            tiny_model, prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask
        )
    )
    per_row = grads(
        lambda: completion_logprobs(
            tiny_model,
            prompt_ids[rows],
            prompt_mask[rows],
            completion_ids,
            completion_mask,
            chunk_size=5,
        )[0]
    )
    shared = grads(
        lambda: completion_logprobs(
            tiny_model,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            chunk_size=5,
            group_size=3,
        )[0]
    )
    for ref, a, b in zip(reference, per_row, shared, strict=True):
        torch.testing.assert_close(a, ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(b, ref, atol=1e-5, rtol=1e-4)


# --- The custom autograd function (impl="chunked") against the naive full-logits computation.


def _naive(h, y, weight, bias, temperature, softcap):
    """Eqs. 1-3 of groupwise.policy.logprobs with all [M, V] logits, differentiated by autograd."""
    z = F.linear(h, weight, bias).to(torch.promote_types(h.dtype, torch.float32))
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    log_probs = torch.log_softmax(z / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, y[:, None]).squeeze(-1), entropy.detach()


def _head_inputs(dtype=torch.float64, bias=True, rows=10, hidden=6, vocab=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=gen, dtype=dtype).requires_grad_()
    weight = torch.randn(vocab, hidden, generator=gen, dtype=dtype).requires_grad_()
    b = torch.randn(vocab, generator=gen, dtype=dtype).requires_grad_() if bias else None
    y = torch.randint(0, vocab, (rows,), generator=gen)
    upstream = torch.randn(rows, generator=gen, dtype=torch.promote_types(dtype, torch.float32))
    return h, y, weight, b, upstream


def _values_and_grads(fn, h, y, weight, bias, upstream):
    leaves = [t for t in (h, weight, bias) if t is not None and t.requires_grad]
    logp, entropy = fn(h, y, weight, bias)
    grads = torch.autograd.grad((logp * upstream).sum(), leaves)
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("temperature", "softcap", "chunk", "bias"),
    [
        (1.0, None, 3, False),  # 3 does not divide M = 10
        (0.7, None, 5, True),  # 5 does
        (1.3, 2.0, 4, True),  # soft-capped logits
        (0.7, 2.0, 64, False),  # one chunk larger than M
    ],
)
def test_function_matches_naive_values_and_gradients(dtype, temperature, softcap, chunk, bias):
    h, y, weight, b, upstream = _head_inputs(dtype, bias)
    ours = _values_and_grads(
        lambda *a: ChunkedLMHeadLogprob.apply(*a, temperature, softcap, chunk),
        h, y, weight, b, upstream,
    )  # fmt: skip
    naive = _values_and_grads(
        lambda *a: _naive(*a, temperature, softcap), h, y, weight, b, upstream
    )
    assert ours[0].dtype == torch.promote_types(dtype, torch.float32)
    torch.testing.assert_close(ours[0], naive[0], atol=1e-5, rtol=1e-5)  # log-probs
    torch.testing.assert_close(ours[1], naive[1], atol=1e-5, rtol=1e-5)  # entropy
    for a, ref in zip(ours[2], naive[2], strict=True):  # hidden, weight (, bias)
        torch.testing.assert_close(a, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("temperature", "softcap"), [(1.0, None), (0.7, 1.5)])
def test_function_gradcheck(temperature, softcap):
    h, y, weight, b, _ = _head_inputs(torch.float64, rows=5, hidden=3, vocab=7)
    assert torch.autograd.gradcheck(
        lambda h, w, b: ChunkedLMHeadLogprob.apply(h, y, w, b, temperature, softcap, 2)[0],
        (h, weight, b),
    )


class _CountMatmuls(TorchDispatchMode):
    """Counts matrix products (aten mm, addmm, addmm_) dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("frozen", [False, True])
def test_frozen_head_gets_no_gradient_and_skips_its_matmul(frozen):
    h, y, weight, b, upstream = _head_inputs(torch.float32, bias=False)
    weight.requires_grad_(not frozen)
    logp, _ = ChunkedLMHeadLogprob.apply(h, y, weight, None, 0.7, None, 3)
    with _CountMatmuls() as counter:
        (logp * upstream).sum().backward()
    chunks = 4  # ceil(10 / 3)
    # Per chunk: recompute logits, grad_h (Eq. 6), and grad_W only when the head is trained.
    assert counter.count == chunks * (2 if frozen else 3)
    assert (weight.grad is None) == frozen
    reference = torch.autograd.grad((_naive(h, y, weight, None, 0.7, None)[0] * upstream).sum(), h)
    torch.testing.assert_close(h.grad, reference[0], atol=1e-5, rtol=1e-5)


def test_bfloat16_head_does_softmax_math_in_float32():
    h, y, weight, b, upstream = _head_inputs(torch.bfloat16, vocab=300)
    ours = _values_and_grads(
        lambda *a: ChunkedLMHeadLogprob.apply(*a, 0.7, None, 4), h, y, weight, b, upstream
    )
    naive = _values_and_grads(lambda *a: _naive(*a, 0.7, None), h, y, weight, b, upstream)
    assert ours[0].dtype == torch.float32
    torch.testing.assert_close(ours[0], naive[0], atol=1e-4, rtol=1e-4)
    for a, ref in zip(ours[2], naive[2], strict=True):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a, ref, atol=2e-2, rtol=2e-2)


def _saved_tensors(fn) -> list[torch.Tensor]:
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def _vocab_sized_activations(saved, params):
    """Saved tensors with a vocab-sized dimension (that of params[0], the head weight [V, H])
    other than the head's own parameters."""
    vocab = params[0].shape[0]
    storages = {p.untyped_storage().data_ptr() for p in params if p is not None}
    return [t for t in saved if vocab in t.shape and t.untyped_storage().data_ptr() not in storages]


def test_function_saves_nothing_vocab_sized():
    h, y, weight, b, _ = _head_inputs(torch.float32, rows=10, hidden=6, vocab=1000)
    saved = _saved_tensors(lambda: ChunkedLMHeadLogprob.apply(h, y, weight, b, 0.7, 2.0, 4))
    # The inputs (hidden, targets, weight, bias) and logsumexp(z) [M], nothing else.
    assert [tuple(t.shape) for t in saved] == [(10, 6), (10,), (1000, 6), (1000,), (10,)]
    assert not _vocab_sized_activations(saved, [weight, b])
    # The check does see [M, V] activations where they exist.
    naive_saved = _saved_tensors(lambda: _naive(h, y, weight, b, 0.7, 2.0))
    assert _vocab_sized_activations(naive_saved, [weight, b])


def test_model_chunked_path_saves_nothing_vocab_sized(tiny_model):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    head_weight = [tiny_model.get_output_embeddings().weight]

    def run(impl):
        return lambda: completion_logprobs(
            tiny_model, prompt_ids, prompt_mask, completion_ids, completion_mask,
            chunk_size=4, group_size=3, impl=impl,
        )  # fmt: skip

    assert not _vocab_sized_activations(_saved_tensors(run("chunked")), head_weight)
    assert _vocab_sized_activations(_saved_tensors(run("naive")), head_weight)


def test_no_grad_inference_matches_naive(tiny_model):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    with torch.no_grad():
        chunked, naive = (
            completion_logprobs(
                tiny_model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                temperature=0.7, chunk_size=4, group_size=3, impl=impl,
            )
            for impl in ("chunked", "naive")
        )  # fmt: skip
    for a, ref in zip(chunked, naive, strict=True):
        assert not a.requires_grad
        torch.testing.assert_close(a, ref, atol=1e-5, rtol=1e-5)


def _untied_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return LlamaForCausalLM(config)


@pytest.mark.parametrize(
    ("model_kind", "temperature", "softcap", "frozen_head", "runs"),
    [
        # tiny-random (head weight = embedding matrix). M = 21 unmasked tokens: chunks of 8
        # (does not divide M, shared prompt), 7 (divides, one prompt per row), and the
        # checkpointed path.
        ("tied", 0.7, None, False, (("chunked", 8, 3), ("chunked", 7, 1), ("checkpoint", 8, 3))),
        # Soft-capped logits (random logits are ~0.2, so c = 0.1 bites).
        ("tied", 1.0, 0.1, False, (("chunked", 5, 3),)),
        # Frozen head (so frozen tied embedding too), as under LoRA: no head gradient at all.
        ("tied", 0.7, None, True, (("chunked", 8, 3),)),
        ("untied", 1.3, None, False, (("chunked", 4, 1),)),
    ],
)
def test_model_gradients_match_naive(
    tiny_model, model_kind, temperature, softcap, frozen_head, runs
):
    model = (tiny_model if model_kind == "tied" else _untied_model()).double()
    head = model.get_output_embeddings()
    assert (head.weight is model.get_input_embeddings().weight) == (model_kind == "tied")
    assert _is_plain_linear(head)  # so "chunked" really runs the custom function
    model.config.final_logit_softcapping = softcap
    head.weight.requires_grad_(not frozen_head)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    upstream = torch.randn(completion_ids.shape, dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]

    def run(impl, chunk=4, group=3):
        rows = torch.arange(6) // 3 if group == 1 else torch.arange(2)
        logp, entropy = completion_logprobs(
            model, prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask,
            temperature=temperature, chunk_size=chunk, group_size=group, impl=impl,
        )  # fmt: skip
        return logp.detach(), entropy, torch.autograd.grad((logp * upstream).sum(), params)

    naive = run("naive")
    assert naive[0].dtype == torch.float64
    for impl, chunk, group in runs:
        logp, entropy, grads = run(impl, chunk, group)
        torch.testing.assert_close(logp, naive[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy, naive[1], atol=1e-5, rtol=1e-5)
        for g, ref in zip(grads, naive[2], strict=True):
            torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-5)
    if model_kind == "tied" and softcap is None and not frozen_head:
        rows = torch.arange(6) // 3  # "naive" itself equals logits through model.forward
        expected = full_logits_logprobs(
            model, prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask,
            temperature,
        )  # fmt: skip
        torch.testing.assert_close(naive[0], expected.double(), atol=1e-5, rtol=1e-5)


def test_heads_that_are_not_plain_linear_fall_back_to_the_module(tiny_model):
    head = tiny_model.get_output_embeddings()
    assert _is_plain_linear(head)
    handle = head.register_forward_hook(lambda module, args, out: out * 2.0)
    try:
        assert not _is_plain_linear(head)
        prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
        kwargs = dict(temperature=0.7, chunk_size=4, group_size=3)
        chunked, _ = completion_logprobs(
            tiny_model, prompt_ids, prompt_mask, completion_ids, completion_mask, **kwargs
        )
        naive, _ = completion_logprobs(
            tiny_model, prompt_ids, prompt_mask, completion_ids, completion_mask, impl="naive",
            **kwargs,
        )  # fmt: skip
        torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=1e-5)
    finally:
        handle.remove()

    class Wrapped(torch.nn.Linear):
        pass

    assert not _is_plain_linear(Wrapped(4, 5))
    with pytest.raises(ValueError, match="impl"):
        completion_logprobs(tiny_model, *_batch(), group_size=3, impl="fused")


class _Float32Head(torch.nn.Module):
    """The model's own head, run in fp32 even under autocast (the naive reference below)."""

    def __init__(self, head: torch.nn.Linear) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return self.head(hidden.float())


def test_bf16_autocast_head_is_consistent_between_passes(tiny_model):
    # Under autocast the decoder runs in bf16 but the custom function runs the head in the
    # weight's dtype in both passes, so its gradient is exactly that of the log-probs it
    # returned: it matches autograd through the naive path with an fp32 head, same autocast.
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    head = tiny_model.lm_head
    grads, values = {}, {}
    for impl in ("chunked", "naive"):
        tiny_model.zero_grad()
        if impl == "naive":
            tiny_model.lm_head = _Float32Head(head)
        try:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                logp, _ = completion_logprobs(
                    tiny_model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                    chunk_size=4, group_size=3, impl=impl,
                )  # fmt: skip
            (logp * completion_mask).sum().backward()
        finally:
            tiny_model.lm_head = head
        values[impl] = logp.detach()
        grads[impl] = {n: p.grad.clone() for n, p in tiny_model.named_parameters()}
    torch.testing.assert_close(values["chunked"], values["naive"], atol=1e-5, rtol=1e-5)
    for name, grad in grads["naive"].items():
        torch.testing.assert_close(grads["chunked"][name], grad, atol=1e-5, rtol=1e-4, msg=name)


class _RenamedCacheModel(torch.nn.Module):
    """A forward with transformers 5.24's name for the KV cache."""

    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return input_ids


class _Wrapper(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, attribute: str) -> None:
        super().__init__()
        setattr(self, attribute, inner)

    def forward(self, *args, **kwargs):
        raise NotImplementedError


def test_cache_keyword_follows_the_forward_signature_under_wrappers(tiny_model):
    # The installed transformers' Llama: whichever name its forward declares.
    declared = inspect.signature(type(tiny_model).forward).parameters
    assert cache_keyword(tiny_model) == ("cache" if "cache" in declared else "past_key_values")
    renamed = _RenamedCacheModel()
    assert cache_keyword(renamed) == "cache"
    # DDP keeps the model in .module, torch.compile in ._orig_mod: the inner forward decides.
    assert cache_keyword(_Wrapper(renamed, "module")) == "cache"
    assert cache_keyword(_Wrapper(_Wrapper(renamed, "_orig_mod"), "module")) == "cache"

    class OldNames(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, **kwargs):
            return input_ids

    assert cache_keyword(OldNames()) == "past_key_values"


def test_returned_cache_reads_either_output_name():
    from types import SimpleNamespace

    assert returned_cache(SimpleNamespace(cache="new")) == "new"
    assert returned_cache(SimpleNamespace(past_key_values="old")) == "old"
    assert returned_cache(SimpleNamespace(cache=None, past_key_values="old")) == "old"
    assert returned_cache(SimpleNamespace(logits=1)) is None


# --- Unequal groups (a curriculum's rollout counts): each prompt encoded once, its KV repeated
# for its own rows.


@pytest.mark.parametrize("impl", ["chunked", "checkpoint", "naive"])
def test_unequal_groups_share_their_prompts_with_the_unshared_values_and_gradients(
    tiny_model, impl
):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()  # 2 prompts, 6 rows
    counts = [2, 4]  # prompt 0 answers rows 0-1, prompt 1 rows 2-5
    rows = torch.tensor([0, 0, 1, 1, 1, 1])
    weights = torch.randn(completion_ids.shape)

    def run(shared: bool):
        tiny_model.zero_grad()
        logp, entropy = completion_logprobs(
            tiny_model,
            prompt_ids if shared else prompt_ids[rows],
            prompt_mask if shared else prompt_mask[rows],
            completion_ids,
            completion_mask,
            temperature=0.7,
            chunk_size=4,
            group_size=counts if shared else 1,
            impl=impl,
            entropy_grad=True,
        )
        ((logp + 0.1 * entropy) * weights).sum().backward()
        return logp.detach(), entropy.detach(), [p.grad.clone() for p in tiny_model.parameters()]

    shared, unshared = run(True), run(False)
    expected = full_logits_logprobs(
        tiny_model, prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask, 0.7
    )
    torch.testing.assert_close(shared[0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[0], unshared[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(shared[1], unshared[1], atol=1e-6, rtol=1e-6)
    for a, b in zip(shared[2], unshared[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_unequal_groups_encode_each_prompt_once(tiny_model):
    """The decoder sees the two prompts once (a batch of 2), then the 6 completions."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    batches = []
    hook = tiny_model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        completion_logprobs(
            tiny_model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size=[2, 4]
        )
    finally:
        hook.remove()
    assert [tuple(b) for b in batches] == [(2, 5), (6, 5)]  # prompts once; completions[:, :-1]


def test_group_counts_must_cover_the_completions(tiny_model):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    with pytest.raises(ValueError, match=r"2 prompts with group_size \[2, 3\] != 6 completions"):
        completion_logprobs(
            tiny_model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size=[2, 3]
        )
