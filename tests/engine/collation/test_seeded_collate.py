"""engine.collation.seeded_collate: each batch's randomness comes from its rows, not from the worker that built it."""

import pickle

import pytest
import torch

from collators import TextCollator
from collators.columns import RowBatch
from engine.collation.seeded_collate import SeededCollate, accepts_generator, build_collator
from engine.sampling.base import BatchIndices
from task_spec import TaskSpec

MLM = TextCollator(task_type="masked_lm", pad_token_id=0, mask_token_id=1, vocab_size=50, mlm_probability=0.5)


def rows_with_seed(seed):
    rows = RowBatch([{"input_ids": list(range(5, 25))}, {"input_ids": list(range(5, 15))}])
    rows.rng_seed = seed
    return rows


def test_the_same_batch_seed_gives_the_same_masks_and_another_seed_others():
    collate = SeededCollate(MLM)
    first, again, other = collate(rows_with_seed(7)), collate(rows_with_seed(7)), collate(rows_with_seed(8))
    assert torch.equal(first["labels"], again["labels"]) and not torch.equal(first["labels"], other["labels"])


def test_stream_rows_without_indices_seed_from_their_content():
    collate = SeededCollate(MLM, content_seed_from=3)
    assert torch.equal(collate(rows_with_seed(None))["labels"], collate(rows_with_seed(None))["labels"])


def test_a_generator_is_built_only_for_collators_that_draw_random_numbers(monkeypatch):
    # A causal-LM batch draws nothing random: no per-batch generator is seeded for it (its batch is the same
    # either way); a masked-LM batch gets one, and a collator that does not say gets one too.
    import engine.collation.seeded_collate as seeded_collate

    built = []
    monkeypatch.setattr(seeded_collate, "generator_from", lambda seed: built.append(seed) or torch.Generator())
    causal = TextCollator(task_type="causal_lm", pad_token_id=0)
    assert not causal.draws_random and MLM.draws_random
    assert torch.equal(SeededCollate(causal)(rows_with_seed(7))["labels"], causal(rows_with_seed(7))["labels"])
    assert built == []
    SeededCollate(MLM)(rows_with_seed(7))
    SeededCollate(lambda rows, generator=None: generator)(rows_with_seed(9))
    assert built == [7, 9]


def test_functions_without_a_generator_are_called_plainly_and_the_wrapper_pickles():
    def plain(rows):
        return len(rows)

    assert not accepts_generator(plain) and accepts_generator(MLM)
    assert SeededCollate(plain)(BatchIndices([1, 2])) == 2
    restored = pickle.loads(pickle.dumps(SeededCollate(MLM)))
    assert torch.equal(restored(rows_with_seed(7))["labels"], SeededCollate(MLM)(rows_with_seed(7))["labels"])


@pytest.mark.parametrize(("arguments", "error", "message"), [
    (dict(collate_fn=len, name="text", kwargs={}), ValueError, "do not pass collator_name or collator_kwargs"),
    (dict(collate_fn=3, name=None, kwargs={}), TypeError, "collate_fn should be callable, but got 3"),
])
def test_build_collator_refuses_contradictions(arguments, error, message):
    with pytest.raises(error, match=message):
        build_collator(TaskSpec.lm_tiny(), None, arguments["collate_fn"], arguments["name"], arguments["kwargs"])


def test_a_tokenizer_for_a_collator_that_takes_none_is_refused():
    spec = TaskSpec.vision_tiny()
    with pytest.raises(ValueError, match="tokenizer= was given, but the collator 'vision' .* takes no tokenizer"):
        build_collator(spec, object(), None, None, {})
