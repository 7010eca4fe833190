import torch

from groupwise.logprobs import completion_logprobs, full_logits_logprobs


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
