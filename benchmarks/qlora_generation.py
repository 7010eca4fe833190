"""How to generate on a QLoRA base, measured side by side on this machine.

The two candidates (docs/speed-memory.md, "QLoRA"):

- hf: the HF engine decodes on the policy itself. Each 4-bit layer (``bitsandbytes.nn.
  Linear4bit``) dequantises its NF4 weight into the compute dtype at every call, then multiplies,
  and the LoRA adapter runs beside it (two extra thin matmuls).
- static: the static engine decodes from its own 16-bit weights, the base dequantised and the
  adapter merged into it layer by layer, rebuilt after every optimizer step.

Per decoder layer of SmolLM2-135M (hidden 576, MLP 1536, 3 KV heads of 64) at the decode shape
(B rows of one token), this prints the time of one layer's seven projections for each path, the
static path's rebuild (dequantise + merge, once per optimizer step) and the bytes each path
keeps per layer, then the same bytes for a Llama-3-8B-shaped model (hidden 4096, MLP 14336,
32 layers, 8 KV heads of 128), and AdamW's state bytes per parameter, torch's vs 8-bit. Ratios
are static / hf.

    python benchmarks/qlora_generation.py [--rows 1 16 64] [--repeats 50] [--rank 16]
        [--device cuda]   # on a GPU the 4-bit layers compute in bf16
"""

from __future__ import annotations

import argparse
import time

import bitsandbytes as bnb
import bitsandbytes.functional as bnbf
import torch

from groupwise.runtime.quantization import keep_trainable_layout, quantize_4bit


def projections(hidden: int, mlp: int, kv: int) -> list[tuple[int, int]]:
    """(out, in) of a Llama decoder layer's q, k, v, o, gate, up, down projections."""
    return [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden),
            (mlp, hidden), (mlp, hidden), (hidden, mlp)]  # fmt: skip


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()  # CUDA launches are asynchronous: time the work, not the launches
    return (time.perf_counter() - start) / repeats * 1e3


def four_bit_bytes(layer: bnb.nn.Linear4bit) -> int:
    """Bytes a 4-bit weight keeps: packed codes, absmax (8-bit with double quantisation) and
    the second-level constants."""
    state = layer.weight.quant_state
    total = layer.weight.data.numel() * layer.weight.data.element_size()
    total += state.absmax.numel() * state.absmax.element_size()
    if state.nested:
        total += state.state2.absmax.numel() * state.state2.absmax.element_size()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    # The run's compute dtype (runtime.quantization.compute_dtype): bf16 on a GPU, fp32 on a CPU.
    compute = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    shapes = projections(576, 1536, 192)
    plain = torch.nn.ModuleList(torch.nn.Linear(i, o, bias=False) for o, i in shapes)
    for layer in plain:
        torch.nn.init.normal_(layer.weight, std=0.02)
    four = keep_trainable_layout(
        quantize_4bit(
            torch.nn.ModuleList(torch.nn.Linear(i, o, bias=False) for o, i in shapes),
            "nf4", True, compute, device,
        )
    )  # fmt: skip
    for src, dst in zip(plain, four, strict=True):  # the same weights in both
        q = quantize_4bit(torch.nn.Sequential(src), "nf4", True, compute, device)
        dst.weight = q[0].weight
    lora = [(torch.randn(args.rank, i, device=device) * 0.01,
             torch.randn(o, args.rank, device=device) * 0.01) for o, i in shapes]  # fmt: skip
    merged = {
        dtype: [
            (bnbf.dequantize_4bit(m.weight.data, m.weight.quant_state).float() + b @ a).to(dtype)
            for m, (a, b) in zip(four, lora, strict=True)
        ]
        for dtype in (torch.float32, torch.bfloat16)
    }

    def hf_step(x: torch.Tensor) -> None:
        with torch.no_grad():
            for layer, (a, b) in zip(four, lora, strict=True):
                inputs = x[..., : layer.in_features]
                # peft runs the fp32 adapter on the input cast to its dtype, beside the base.
                layer(inputs) + ((inputs.to(a.dtype) @ a.T) @ b.T).to(inputs.dtype)

    def static_step(x: torch.Tensor, dtype: torch.dtype) -> None:
        x = x.to(dtype)
        with torch.no_grad():
            for weight in merged[dtype]:
                x[..., : weight.shape[1]] @ weight.T

    def rebuild() -> None:
        for m, (a, b) in zip(four, lora, strict=True):
            (bnbf.dequantize_4bit(m.weight.data, m.weight.quant_state).float() + b @ a).to(
                torch.bfloat16
            )

    print(f"torch {torch.__version__}, bitsandbytes {bnb.__version__}, "
          f"{torch.get_num_threads()} thread(s); one SmolLM2-135M decoder layer, "
          f"LoRA r={args.rank}")  # fmt: skip
    print("| rows | hf: 4-bit + LoRA (ms) | static fp32 merged (ms) | ratio | "
          "static bf16 merged (ms) | ratio |")
    print("|---|---|---|---|---|---|")
    for rows in args.rows:
        x = torch.randn(rows, 1536, device=device, dtype=compute)
        hf = timed(lambda: hf_step(x), args.repeats)  # noqa: B023
        fp32 = timed(lambda: static_step(x, torch.float32), args.repeats)  # noqa: B023
        bf16 = timed(lambda: static_step(x, torch.bfloat16), args.repeats)  # noqa: B023
        print(f"| {rows} | {hf:.3f} | {fp32:.3f} | {fp32 / hf:.2f} | {bf16:.3f} | "
              f"{bf16 / hf:.2f} |")  # fmt: skip
    rebuild_ms = timed(rebuild, max(args.repeats // 5, 3))
    print(f"static rebuild of the layer (dequantise + merge into bf16), once per optimizer step: "
          f"{rebuild_ms:.3f} ms")  # fmt: skip

    four_bytes = sum(four_bit_bytes(m) for m in four)
    bf16_bytes = sum(o * i * 2 for o, i in shapes)
    lora_bytes = sum((o + i) * args.rank * 4 for o, i in shapes)
    print(f"bytes per layer: 4-bit base {four_bytes:,} + LoRA {lora_bytes:,} (fp32); the static "
          f"path adds a bf16 copy of {bf16_bytes:,} ({bf16_bytes / four_bytes:.2f}x the 4-bit "
          "base)")
    # The same formula for a Llama-3-8B-shaped model: 4.127 bits per weight with double
    # quantisation (4 + 8/64 for the 8-bit absmax + 32/(64*256) for the second level), as the
    # SmolLM2 layer above measures (its ratio is 16 / that).
    bits = 8 * four_bytes / sum(o * i for o, i in shapes)
    weights = 32 * sum(o * i for o, i in projections(4096, 14336, 1024))
    print(f"measured {bits:.3f} bits per 4-bit weight; Llama-3-8B-shaped, 32 layers: "
          f"{weights / 1e9:.2f}B quantised weights -> 4-bit {weights * bits / 8 / 2**30:.2f} GiB, "
          f"a bf16 copy {weights * 2 / 2**30:.2f} GiB")

    # AdamW's states for a full fine-tune: torch's fp32 moments vs bitsandbytes' 8-bit ones.
    sizes = {}
    for name, make in (("adamw_torch", torch.optim.AdamW), ("adamw_8bit", bnb.optim.AdamW8bit)):
        param = torch.nn.Parameter(torch.randn(1536, 576))
        opt = make([param], lr=1e-3)
        param.grad = torch.randn_like(param)
        opt.step()
        sizes[name] = sum(v.numel() * v.element_size() for v in opt.state[param].values()
                          if torch.is_tensor(v) and v.dim() > 0)  # fmt: skip
    per = {name: size / param.numel() for name, size in sizes.items()}
    print(f"AdamW states per parameter (a 1536 x 576 weight): adamw_torch "
          f"{per['adamw_torch']:.3f} bytes, adamw_8bit {per['adamw_8bit']:.3f} bytes "
          f"({per['adamw_8bit'] / per['adamw_torch']:.3f}x)")


if __name__ == "__main__":
    main()
