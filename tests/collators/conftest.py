"""Fixtures for the collator tests: small tokenizers built locally (nothing is downloaded)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "</s>"]
"""Ids 0..5 in this order: pad 0, unk 1, cls 2, sep 3, mask 4, eos 5."""
SENTENCES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "birds sing at dawn and dusk",
    "we read books about old ships",
    "rain falls on quiet streets tonight",
]


def build_tokenizer(*, pad_token: str | None = "[PAD]", post_processor: bool = True, eos_token: str | None = "</s>",
                    mask_token: str | None = "[MASK]") -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over SENTENCES; with ``post_processor`` it adds ``[CLS] ... [SEP]`` like BERT.

    ``pad_token``, ``eos_token`` and ``mask_token`` None: a tokenizer without that special token (the ids stay).
    """
    words = sorted({word for sentence in SENTENCES for word in sentence.split()})
    vocab = {token: index for index, token in enumerate(SPECIALS + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if post_processor:
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad_token,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token=mask_token,
        eos_token=eos_token,
    )


@pytest.fixture
def tokenizer() -> PreTrainedTokenizerFast:
    """BERT-like: adds [CLS]/[SEP], pad id 0, mask id 4, eos id 5; pad differs from eos."""
    return build_tokenizer()


@pytest.fixture
def gpt_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2-like: no special tokens added, and the pad token is the eos token (id 5)."""
    return build_tokenizer(pad_token="</s>", post_processor=False)


@pytest.fixture(scope="module")
def tokenizers() -> dict[tuple[str, str], PreTrainedTokenizerFast]:
    """``(kind, padding_side) -> tokenizer`` for kind 'bert' (pad 0 != eos 5) and 'gpt' (pad = eos = 5).

    Module-scoped, one per padding side, for property tests: nothing is mutated between examples.
    """
    out = {}
    for side in ("right", "left"):
        for kind, options in (("bert", {}), ("gpt", {"pad_token": "</s>", "post_processor": False})):
            tokenizer = build_tokenizer(**options)
            tokenizer.padding_side = side
            out[kind, side] = tokenizer
    return out
