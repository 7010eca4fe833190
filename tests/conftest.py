import pytest
import torch

from groupwise.models import smollm2_tokenizer, tiny_random_model


@pytest.fixture(scope="session")
def tokenizer():
    tok = smollm2_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture()
def tiny_model():
    torch.manual_seed(0)
    return tiny_random_model(seed=0)
