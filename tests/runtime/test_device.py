"""The device a run or a reward model names (runtime.distributed.resolve_device)."""

import pytest
import torch

from groupwise.errors import ConfigError
from groupwise.runtime.distributed import resolve_device


def test_auto_and_none_take_cuda_when_there_is_one_else_the_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device(None).type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_cuda_without_cuda_is_refused_by_name(name):
    with pytest.raises(ConfigError, match=r"device='cuda.*CUDA is not available.*auto or cpu"):
        resolve_device(name)
