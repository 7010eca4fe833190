"""The static engine's decode step through CUDA-graph buffers (rollout/static_graphs.py).

A CPU cannot capture graphs, so the engine runs the same arithmetic through the same static
buffers with the graph replaced by a direct call (``capture=False``): its rollouts must equal the
plain engine's, its buffers must be reused (never reallocated) across the steps of a rollout
and released after it, and inputs must be copied in. The capture protocol itself (side-stream
warm-up, one capture per shape, replays after, eager after a failed capture) is checked against
fakes of torch.cuda's graph API.
"""

import contextlib

import pytest
import torch

from conftest import sampling, static_engine_options
from groupwise.rollout.static import StaticEngine, decode_step
from groupwise.rollout.static_graphs import DecodeGraphs

COUNTS = [3, 1, 4]


def _prompts(tokenizer):
    texts = ["What is 2 + 2?", "Name a colour of the sky at noon, please", "x"]
    return [tokenizer(t)["input_ids"] for t in texts]


def _engine(model, tokenizer, graphs=None, temperature=0.0):
    params = sampling(10, temperature=temperature)
    return StaticEngine(model, tokenizer, params, **static_engine_options(
        dtype=torch.float32, compact=False, pack_weights=False, decode_graphs=graphs))  # fmt: skip


@pytest.mark.parametrize("bucket", [1, 64])
def test_graphed_step_gives_the_plain_engines_rollouts(tiny_model, tokenizer, bucket):
    """Greedy and sampled (same random stream) rollouts equal the plain engine's; with slots
    padded to a bucket of 64 the extra, never-valid slots get no attention weight."""
    prompts = _prompts(tokenizer)
    plain = _engine(tiny_model, tokenizer)
    graphs = DecodeGraphs(decode_step, capture=False, slot_bucket=bucket)
    graphed = _engine(tiny_model, tokenizer, graphs)
    for temperature in (0.0, 1.0):
        params = sampling(10, temperature=temperature)
        a = plain.generate(prompts, COUNTS, params, torch.Generator().manual_seed(3))
        b = graphed.generate(prompts, COUNTS, params, torch.Generator().manual_seed(3))
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.completion_mask, b.completion_mask)
        tolerance = 0.0 if bucket == 1 else 1e-5  # longer reductions: another addition order
        gap = (a.sampling_logprobs - b.sampling_logprobs).abs().max()
        assert gap <= tolerance, (temperature, gap)
    assert graphs.slots(width := 17) == (width if bucket == 1 else 64)


def test_buffers_are_reused_across_steps_and_released_after_the_rollout(tiny_model, tokenizer):
    graphs = DecodeGraphs(decode_step, capture=False, max_graphs=2)
    engine = _engine(tiny_model, tokenizer, graphs)
    prompts = _prompts(tokenizer)
    seen = []
    step = graphs.__call__

    def spy(*args):
        out = step(*args)
        buf = graphs._current
        seen.append((out.data_ptr(), buf.cache_k.data_ptr(), args[3].data_ptr()))
        assert [key[1] for key in graphs._shapes] == [sum(COUNTS)]  # one shape, 8 rows
        assert next(iter(graphs._shapes))[3] == 64  # slots bucketed to 64
        return out

    engine._step = spy
    engine.generate(prompts, COUNTS)
    assert len(seen) > 8 and len(set(seen)) == 1  # every step on the same buffers
    assert seen[0][1] == seen[0][2]  # the step reads the graph's own cache
    # The rollout is over: no KV buffer or graph outlives it into the update.
    assert not graphs._shapes and graphs._current is None
    # Within a rollout, shapes beyond max_graphs drop the oldest.
    for rows in (1, 2, 3):
        graphs.buffers((1, rows, 1, 64, 4), torch.float32, torch.device("cpu"))
    assert [key[1] for key in graphs._shapes] == [2, 3]


def test_inputs_are_copied_into_the_static_buffers():
    """The step always sees the buffers' addresses; the caller's tensors are copied in."""
    seen = []

    def step(w, token, position, cache_k, cache_v, slot, valid):
        seen.append((token.data_ptr(), position.data_ptr(), slot.data_ptr(),
                     token.tolist(), position.tolist(), int(slot)))  # fmt: skip
        valid.index_fill_(1, slot, True)
        return (token + position).float()[:, None].expand(-1, 5).clone()

    graphs = DecodeGraphs(step, capture=False)
    buf = graphs.buffers((1, 2, 1, graphs.slots(10), 4), torch.float32, torch.device("cpu"))
    out1 = graphs(None, torch.tensor([4, 5]), torch.tensor([7, 8]), buf.cache_k, buf.cache_v,
                  torch.tensor([3]), buf.valid)  # fmt: skip
    first = out1.clone()
    out2 = graphs(None, torch.tensor([1, 1]), torch.tensor([8, 9]), buf.cache_k, buf.cache_v,
                  torch.tensor([4]), buf.valid)  # fmt: skip
    pointers = {(t, p, s) for t, p, s, *_ in seen}
    assert pointers == {(buf.token.data_ptr(), buf.position.data_ptr(), buf.slot.data_ptr())}
    assert [s[3:] for s in seen] == [([4, 5], [7, 8], 3), ([1, 1], [8, 9], 4)]
    assert out1 is out2 and first[:, 0].tolist() == [11.0, 13.0] and out2[:, 0].tolist() == [9, 10]
    assert buf.valid[:, 3:5].all() and not buf.valid[:, :3].any()
    with pytest.raises(RuntimeError, match="buffers"):
        graphs(None, buf.token, buf.position, buf.cache_k.clone(), buf.cache_v, buf.slot, buf.valid)


class _FakeCuda:
    """torch.cuda's stream and graph API, recording what the capture does in which order."""

    def __init__(self):
        self.events = []
        self.capturing = False
        fake = self

        class Stream:
            def __init__(self, device=None):
                self.name = "side"

            def wait_stream(self, other):
                fake.events.append(f"{self.name} waits {other.name}")

        class Current(Stream):
            def __init__(self):
                self.name = "current"

        class Graph:
            def replay(self):
                fake.events.append("replay")

        @contextlib.contextmanager
        def graph(g, **options):
            fake.events.append(f"capture mode {options.get('capture_error_mode')}")
            fake.capturing = True
            yield
            fake.capturing = False

        @contextlib.contextmanager
        def stream(s):
            fake.events.append(f"on {s.name}")
            yield

        self.Stream, self.CUDAGraph, self.graph, self.stream = Stream, Graph, graph, stream
        self.current = Current()


def test_capture_warms_up_on_a_side_stream_then_captures_once_per_shape(monkeypatch):
    fake = _FakeCuda()
    for name in ("Stream", "CUDAGraph", "graph", "stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: fake.current)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def step(w, token, position, cache_k, cache_v, slot, valid):
        fake.events.append("capture" if fake.capturing else "run")
        return torch.zeros(token.shape[0], 5)

    graphs = DecodeGraphs(step, warmup=2)
    buf = graphs.buffers((1, 2, 1, 64, 4), torch.float32, torch.device("cpu"))
    args = (buf.cache_k, buf.cache_v, torch.tensor([0]), buf.valid)
    for _ in range(3):
        graphs(None, torch.tensor([1, 2]), torch.tensor([3, 4]), *args[:2], args[2], args[3])
    assert fake.events == ["side waits current", "on side", "run", "run", "current waits side",
                           "capture mode thread_local", "capture", "replay", "replay",
                           "replay"]  # fmt: skip
    assert graphs.captures == 1
    other = graphs.buffers((1, 3, 1, 64, 4), torch.float32, torch.device("cpu"))
    graphs(None, torch.tensor([1, 2, 3]), torch.tensor([3, 4, 5]), other.cache_k, other.cache_v,
           torch.tensor([0]), other.valid)  # fmt: skip
    assert graphs.captures == 2 and fake.events[-1] == "replay"


def test_a_failed_capture_is_logged_once_and_the_step_runs_eagerly(monkeypatch, caplog):
    fake = _FakeCuda()
    for name in ("Stream", "CUDAGraph", "stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: fake.current)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    @contextlib.contextmanager
    def failing_graph(g, **options):
        yield
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(torch.cuda, "graph", failing_graph)
    calls = []

    def step(w, token, position, cache_k, cache_v, slot, valid):
        calls.append(int(slot))
        return (token + position).float()[:, None].expand(-1, 5).clone()

    graphs = DecodeGraphs(step, warmup=1)
    buf = graphs.buffers((1, 2, 1, 64, 4), torch.float32, torch.device("cpu"))
    outs = [
        graphs(None, torch.tensor([1, 2]), torch.tensor([3, 4]), buf.cache_k, buf.cache_v,
               torch.tensor([s]), buf.valid)[:, 0].tolist()
        for s in (5, 6)
    ]  # fmt: skip
    assert outs == [[4.0, 6.0], [4.0, 6.0]]  # the eager step's logits, through the buffers
    assert not graphs.capture and graphs.captures == 0
    assert graphs.capture_error == "operation not permitted when stream is capturing"
    warnings = [r.getMessage() for r in caplog.records if "capture" in r.getMessage()]
    assert len(warnings) == 1 and "decoding eagerly" in warnings[0]
    assert calls[-2:] == [5, 6]  # warm-up, capture attempt, then eager runs


def test_graphs_are_refused_without_cuda_or_with_compaction(tiny_model, tokenizer):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA device"):
        DecodeGraphs(decode_step)
    params = sampling(4)
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
        StaticEngine(tiny_model, tokenizer, params,
                     **static_engine_options(dtype=torch.float32, cuda_graphs=True))  # fmt: skip
    graphs = DecodeGraphs(decode_step, capture=False)
    with pytest.raises(ValueError, match="compact=False"):
        StaticEngine(tiny_model, tokenizer, params, **static_engine_options(
            dtype=torch.float32, compact=True, decode_graphs=graphs))  # fmt: skip
    # On a CPU the default is no graphs.
    options = static_engine_options(dtype=torch.float32)
    assert StaticEngine(tiny_model, tokenizer, params, **options).graphs is None
