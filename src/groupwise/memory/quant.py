"""Bytes of what QLoRA, 8-bit optimizers and activation offloading keep, tensor by tensor.

Pure arithmetic over parameter counts, following bitsandbytes' storage formats:

- NF4 with double quantisation (Dettmers et al. 2023, QLoRA, section 3; bitsandbytes
  ``quantize_4bit``, blocksize 64, ``compress_statistics``): two 4-bit codes per byte, one absmax
  per 64-element block, itself quantised to 8 bits in blocks of 256 with one fp32 scale per
  block of 256 and one fp32 offset per tensor: 0.5 + 1/64 + 4/(64 x 256) bytes per parameter
  (0.5 + 4/64 without double quantisation). Only the decoder blocks' linears are quantised
  (transformers keeps the LM head in full precision; embeddings and norms are not linears).
  The forward and backward passes dequantise one linear's weight at a time to the compute dtype.
  The 4-bit code book (16 values) and the 256-entry fp32 map of the nested quantisation are
  shared, under 1 kB, and not counted.
- 8-bit AdamW (Dettmers et al. 2022, 8-bit optimizers via block-wise quantisation;
  bitsandbytes ``Optimizer2State``): m and v in 1 byte each with one fp32 absmax per block of
  256 for each, 2 + 8/256 bytes per parameter; tensors under 4096 elements
  (``min_8bit_size``) keep fp32 m and v, 8 bytes per parameter. The paged variant holds the same
  bytes in CUDA unified memory, which the driver may evict to host memory under pressure;
  ``paged_adamw32bit`` keeps fp32 m and v (8 bytes per parameter) there.
"""

from __future__ import annotations

from collections.abc import Iterable

NF4_BLOCK = 64  # elements per absmax (bitsandbytes' default 4-bit blocksize)
NESTED_BLOCK = 256  # absmax values per fp32 scale in double quantisation
ADAM8_BLOCK = 256  # elements per absmax of an 8-bit optimizer state
ADAM8_MIN_SIZE = 4096  # smaller tensors keep 32-bit states (bitsandbytes' min_8bit_size)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def nf4_bytes(numel: int, double_quant: bool = True) -> int:
    """Bytes of one tensor stored as NF4: packed codes, plus its absmax statistics."""
    blocks = _ceil_div(numel, NF4_BLOCK)
    codes = _ceil_div(numel, 2)
    if not double_quant:
        return codes + 4 * blocks  # one fp32 absmax per block
    # uint8 absmax per block, an fp32 scale per 256 of them, one fp32 offset (their mean)
    return codes + blocks + 4 * _ceil_div(blocks, NESTED_BLOCK) + 4


def adam_state_bytes(numels: Iterable[int], optimizer: str, state_width: int = 4) -> int:
    """Bytes of the optimizer's states for trained tensors of ``numels`` elements:
    ``adamw``: m and v of ``state_width`` bytes each; ``adamw8bit`` / ``paged_adamw8bit``:
    bitsandbytes' block-wise 8-bit m and v (module doc); ``sgd`` (no momentum): none."""
    if optimizer == "sgd":
        return 0
    if optimizer == "adamw":
        return sum(2 * state_width * n for n in numels)
    if optimizer == "paged_adamw32bit":
        return sum(8 * n for n in numels)
    total = 0
    for n in numels:
        if n < ADAM8_MIN_SIZE:
            total += 8 * n
        else:
            total += 2 * n + 2 * 4 * _ceil_div(n, ADAM8_BLOCK)
    return total
