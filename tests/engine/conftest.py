"""Shared fixtures for engine tests: a locally trained tokenizer and small raw-text datasets."""

from __future__ import annotations

import datasets
import pytest
import torch

from demo.sample_data import build_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def text_rows():
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    return datasets.Dataset.from_dict(
        {
            "text": [" ".join(words[: 1 + i % 6]) * (1 + i % 3) for i in range(40)],
            "row_id": list(range(40)),
            "labels": [i % 2 for i in range(40)],
        }
    )


@pytest.fixture
def token_tensors():
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 30, (60,), generator=generator)
    return [torch.randint(5, 500, (int(n),), generator=generator) for n in lengths]
