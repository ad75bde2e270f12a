"""Masked-LM masking: the 15% / 80-10-10 statistics, protected positions, determinism, and the global RNG."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from transformers import DataCollatorForLanguageModeling

from collators.masking import build_special_tokens_mask, mask_tokens
from collators.text import TextCollator, create_text_collator
from task_spec import TaskSpec

CLS, SEP, MASK, PAD, VOCAB = 101, 102, 103, 0, 30522
SIGMAS = 5.0


def within(share: float, p: float, n: int) -> bool:
    """Whether an observed share of ``n`` Bernoulli(p) draws lies within SIGMAS binomial standard deviations."""
    return abs(share - p) <= SIGMAS * math.sqrt(p * (1 - p) / n)


def bert_batch(rows: int = 512, width: int = 300, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``[CLS] words [SEP] [PAD]...`` rows of random lengths; returns the ids and a padding mask (True = pad)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=gen)
    ids = torch.randint(1000, VOCAB, (rows, width), generator=gen)
    padding = torch.arange(width) >= lengths.unsqueeze(1)
    ids[:, 0] = CLS
    ids[torch.arange(rows), lengths - 1] = SEP
    return ids.masked_fill(padding, PAD), padding


def check_statistics(ids: torch.Tensor, masked: torch.Tensor, labels: torch.Tensor, eligible: torch.Tensor) -> None:
    selected = labels != -100
    n_eligible, n_selected = int(eligible.sum()), int(selected.sum())
    assert n_eligible >= 100_000
    assert not (selected & ~eligible).any(), "a special or padding position was selected"
    assert within(n_selected / n_eligible, 0.15, n_eligible)
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(masked[~selected], ids[~selected]), "an unselected position changed"
    to_mask = selected & (masked == MASK)
    unchanged = selected & (masked == ids)
    randomized = selected & ~to_mask & ~unchanged
    # A random draw equals the original or the mask id with probability 2/VOCAB: negligible at this vocabulary.
    assert within(int(to_mask.sum()) / n_selected, 0.8, n_selected)
    assert within(int(randomized.sum()) / n_selected, 0.1, n_selected)
    assert within(int(unchanged.sum()) / n_selected, 0.1, n_selected)
    assert int(masked[randomized].min()) >= 0 and int(masked[randomized].max()) < VOCAB


class TestMaskTokens:
    def test_statistics_on_100k_tokens(self):
        ids, padding = bert_batch()
        masked, labels = mask_tokens(ids, mask_token_id=MASK, vocab_size=VOCAB, special_ids=[CLS, SEP, PAD, MASK],
                                     padding_mask=padding, generator=torch.Generator().manual_seed(0))
        eligible = ~padding & (ids != CLS) & (ids != SEP)
        check_statistics(ids, masked, labels, eligible)

    def test_padding_is_protected_by_position(self):
        # Pad id 5 is also a real token here and not listed as special: only the padded positions are protected.
        ids = torch.full((64, 64), 5)
        padding = torch.zeros(64, 64, dtype=torch.bool)
        padding[:, 32:] = True
        _, labels = mask_tokens(ids, mask_token_id=MASK, vocab_size=VOCAB, padding_mask=padding,
                                mlm_probability=1.0, generator=torch.Generator().manual_seed(0))
        assert (labels[:, :32] == 5).all() and (labels[:, 32:] == -100).all()

    def test_special_tokens_mask_is_respected(self):
        ids = torch.arange(10, 20).repeat(8, 1)
        special = torch.zeros_like(ids)
        special[:, ::2] = 1
        _, labels = mask_tokens(ids, mask_token_id=MASK, vocab_size=VOCAB, special_tokens_mask=special,
                                mlm_probability=1.0, generator=torch.Generator().manual_seed(0))
        assert (labels[:, ::2] == -100).all() and (labels[:, 1::2] != -100).all()

    def test_input_is_not_modified(self):
        ids, _ = bert_batch(rows=8, width=32)
        saved = ids.clone()
        mask_tokens(ids, mask_token_id=MASK, vocab_size=VOCAB, mlm_probability=1.0,
                    generator=torch.Generator().manual_seed(0))
        assert torch.equal(ids, saved)

    def test_same_seed_same_output_different_seed_differs(self):
        ids, padding = bert_batch(rows=16, width=64)

        def run(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
            return mask_tokens(ids, mask_token_id=MASK, vocab_size=VOCAB, special_ids=[CLS, SEP],
                               padding_mask=padding, generator=torch.Generator().manual_seed(seed))

        first, again, other = run(3), run(3), run(4)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
        assert not torch.equal(first[1], other[1])

    def test_global_rng_untouched(self):
        torch_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
        ids, padding = bert_batch(rows=16, width=64)
        mask_tokens(ids, mask_token_id=MASK, vocab_size=VOCAB, padding_mask=padding,
                    generator=torch.Generator().manual_seed(0))
        create_text_collator(TaskSpec.mlm_tiny())([row for row in ids])
        assert torch.equal(torch_state, torch.get_rng_state())
        assert np.array_equal(np_state[1], np.random.get_state()[1]) and py_state == random.getstate()

    def test_needs_an_explicit_generator(self):
        with pytest.raises(TypeError, match=r"draws only from an explicit generator, but got generator=None"):
            mask_tokens(torch.ones(2, 2, dtype=torch.long), mask_token_id=MASK, vocab_size=VOCAB, generator=None)

    def test_bad_probabilities(self):
        ids = torch.ones(2, 2, dtype=torch.long)
        with pytest.raises(ValueError, match=r"mlm_probability should be a probability in \[0, 1\], "
                                             r"but got mlm_probability=1.5"):
            mask_tokens(ids, mask_token_id=MASK, vocab_size=VOCAB, mlm_probability=1.5, generator=torch.Generator())
        with pytest.raises(ValueError, match=r"mask_replace_prob \+ random_replace_prob should not exceed 1"):
            mask_tokens(ids, mask_token_id=MASK, vocab_size=VOCAB, mask_replace_prob=0.9, random_replace_prob=0.2,
                        generator=torch.Generator())

    def test_build_special_tokens_mask(self):
        ids = torch.tensor([[CLS, 7, SEP, PAD]])
        assert build_special_tokens_mask(ids, [PAD, CLS, SEP]).tolist() == [[True, False, True, True]]
        assert not build_special_tokens_mask(ids, []).any()


class TestMaskedLMCollator:
    def test_statistics_through_the_collator(self):
        ids, padding = bert_batch()
        rows = [{"input_ids": row[~pad]} for row, pad in zip(ids, padding)]
        collate = create_text_collator(TaskSpec.mlm_tiny(), max_length=None)
        batch = collate(rows, generator=torch.Generator().manual_seed(0))
        assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
        eligible = ~padding & (ids != CLS) & (ids != SEP)
        check_statistics(ids, batch["input_ids"], batch["labels"], eligible)
        assert torch.equal(batch["attention_mask"], (~padding).long())

    def test_generator_argument_and_own_generator(self):
        ids, padding = bert_batch(rows=16, width=64)
        rows = [row[~pad] for row, pad in zip(ids, padding)]
        collate = create_text_collator(TaskSpec.mlm_tiny())
        given = [collate(rows, generator=torch.Generator().manual_seed(9))["labels"] for _ in range(2)]
        assert torch.equal(given[0], given[1])
        own = [collate(rows)["labels"], collate(rows)["labels"]]
        assert not torch.equal(own[0], own[1]), "the own generator should advance between calls"
        fresh = create_text_collator(TaskSpec.mlm_tiny())
        assert torch.equal(fresh(rows)["labels"], own[0])
        assert not torch.equal(create_text_collator(TaskSpec.mlm_tiny(), seed=1)(rows)["labels"], own[0])

    def test_row_special_tokens_mask_is_used_and_dropped(self, tokenizer):
        rows = [{"input_ids": [2, 10, 11, 12, 3], "special_tokens_mask": [1, 1, 0, 1, 1]}, {"input_ids": [2, 3],
                 "special_tokens_mask": [1, 1]}]
        batch = TextCollator(tokenizer=tokenizer, task_type="masked_lm", mlm_probability=1.0)(rows)
        assert "special_tokens_mask" not in batch
        assert batch["labels"].tolist() == [[-100, -100, 11, -100, -100], [-100] * 5]

    def test_tokenizer_special_ids_never_masked(self, tokenizer):
        collate = TextCollator(tokenizer=tokenizer, task_type="masked_lm", mlm_probability=1.0)
        assert collate.special_token_ids == (0, 1, 2, 3, 4, 5)
        batch = collate([[2, 1, 6, 7, 3, 5], [2, 4, 3]])
        assert batch["labels"].tolist() == [[-100, -100, 6, 7, -100, -100], [-100] * 6]

    def test_given_labels_raise(self):
        with pytest.raises(ValueError, match=r"masked_lm' builds the labels under 'labels' itself"):
            create_text_collator(TaskSpec.mlm_tiny())([{"input_ids": [1, 2], "labels": [1, 2]}])

    def test_missing_mask_token(self):
        with pytest.raises(ValueError, match=r"mask_token_id is needed to mask tokens for masked_lm, .* "
                                             r"special_tokens=\{'mask_token_id'"):
            create_text_collator(TaskSpec.cls_tiny(), task_type="masked_lm")

    def test_statistics_match_transformers(self, tokenizer):
        # Not bit-equal (different random streams): both masked shares must sit within 5 sigma of 15%.
        gen = torch.Generator().manual_seed(2)
        rows = []
        for _ in range(500):
            words = torch.randint(6, len(tokenizer), (int(torch.randint(100, 300, (1,), generator=gen)),),
                                  generator=gen).tolist()
            rows.append({"input_ids": [2, *words, 3]})
        theirs = DataCollatorForLanguageModeling(tokenizer, mlm=True, seed=0)([dict(row) for row in rows])
        ours = TextCollator(tokenizer=tokenizer, task_type="masked_lm")(rows)
        for batch in (theirs, ours):
            real = batch["attention_mask"].bool()
            selected = batch["labels"] != -100
            n_words, n_selected = int(real.sum()) - 2 * len(rows), int(selected.sum())
            assert n_words >= 100_000
            assert not (selected & ~real).any() and int(batch["labels"][selected].min()) >= 6
            assert within(n_selected / n_words, 0.15, n_words)
            # A random replacement may draw the mask id (1 in 33): a 0.3% bias, well inside 5 sigma here.
            assert within(int((batch["input_ids"][selected] == 4).sum()) / n_selected, 0.8, n_selected)
