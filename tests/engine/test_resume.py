"""Exact resume: stopping at any step and continuing yields exactly the batches an uninterrupted run sees."""

import hashlib
import pickle

import pytest
import torch

from engine import UniversalDataModule
from task_spec import TaskSpec

SPEC = TaskSpec.mlm_tiny().replace(special_tokens={"pad_token_id": 0, "mask_token_id": 1},
                                   additional_config={"vocab_size": 600})


def rows(count=45, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 25, (count,), generator=generator)
    return [torch.randint(2, 600, (int(n),), generator=generator) for n in lengths]


def fingerprint(batch):
    """A hash of every tensor of a batch: inputs, masks and the MLM labels (so masks must match too); other values
    (a packed batch's ``max_length_q``) by their repr."""
    digest = hashlib.blake2b(digest_size=8)
    for key in sorted(batch):
        value = batch[key]
        digest.update(key.encode() + (value.numpy().tobytes() if torch.is_tensor(value) else repr(value).encode()))
    return digest.hexdigest()


def module(workers=0, data=None, **kwargs):
    options = dict(task_spec=SPEC, batch_size=8, val_split=5, seed=11, num_workers=workers)
    options.update(kwargs)
    return UniversalDataModule(data if data is not None else rows(), **options)


def run(dm, steps):
    """Consume ``steps`` training batches, passing epochs as a plain loop would; return their hashes."""
    seen, loader = [], dm.train_dataloader()
    while len(seen) < steps:
        for batch in loader:
            seen.append(fingerprint(batch))
            if len(seen) == steps:
                break
    return seen


class TestPlainLoop:
    @pytest.mark.parametrize("batching", ["plain", "grouped"])
    @pytest.mark.parametrize("workers", [0, 2])
    @pytest.mark.parametrize("stop", [0, 1, 3, 5, 6, 9])
    def test_resume_at_any_step_continues_exactly(self, workers, stop, batching):
        total = 12  # 5 batches per epoch: stops land mid-epoch, on the boundary and in the next epoch
        reference = run(module(workers, batching=batching), total)
        first = module(workers, batching=batching)
        assert run(first, stop) == reference[:stop]
        state = pickle.loads(pickle.dumps(first.data_state()))
        resumed = module(workers, batching=batching)
        resumed.load_state_dict(state)
        assert run(resumed, total - stop) == reference[stop:]

    def test_batches_do_not_depend_on_the_number_of_workers(self):
        reference = run(module(0), 10)
        assert run(module(1), 10) == reference
        assert run(module(2), 10) == reference

    def test_loading_replaces_a_loader_in_use_and_stale_iterators_raise(self):
        dm = module()
        stale = iter(dm.train_dataloader())
        next(stale)
        saved = dm.data_state()
        dm.load_state_dict(saved)
        with pytest.raises(RuntimeError, match=r"load_state_dict\(\) replaced this train loader"):
            for _ in stale:
                pass
        assert run(dm, 2) == run(module(), 3)[1:]

    def test_loading_does_not_start_workers_on_a_loader_that_was_never_iterated(self):
        state = module(2).data_state()
        dm = module(2)
        unused = dm.train_dataloader()
        dm.load_state_dict(state)
        assert unused._iterator is None  # torchdata creates one (and its workers) on state_dict(); none was needed

    def test_state_survives_a_round_trip_through_state_dict_before_any_batch(self):
        dm = module()
        state = dm.data_state()
        resumed = module()
        resumed.load_state_dict(state)
        assert run(resumed, 4) == run(module(), 4)


class TestMismatch:
    @pytest.mark.parametrize(("change", "field"), [
        (dict(seed=12), "seed"),
        (dict(data=rows(seed=1)), "data_fingerprint"),
        (dict(data=rows(count=46)), "data_fingerprint"),
        (dict(val_split=6), "split_fingerprint"),
    ])
    def test_state_from_other_data_is_refused(self, change, field):
        state = module().data_state()
        with pytest.raises(ValueError, match=f"does not match this data module: {field} was"):
            module(**change).load_state_dict(state)

    def test_random_augmentation_in_getitem_does_not_block_resume(self):
        class Augmented(torch.utils.data.Dataset):
            def __len__(self):
                return 20

            def __getitem__(self, index):
                return {"input_ids": torch.randint(2, 600, (5,))}  # different on every read

        state = module(data=Augmented(), val_split=0).data_state()
        module(data=Augmented(), val_split=0).load_state_dict(state)

    def test_state_from_another_engine_version_is_refused(self):
        state = module().data_state()
        state["version"] = 0
        with pytest.raises(ValueError, match="has version 0, but this engine writes version"):
            module().load_state_dict(state)


class TestDrawnSeed:
    """seed=None draws one seed at construction and records it where a resume reads it: dm.seed, the state, the
    checkpoint's hyperparameters and the sampler all hold the same seed, so resuming with it continues exactly."""

    @pytest.mark.parametrize("workers", [0, 2])
    def test_the_drawn_seed_is_recorded_everywhere_and_a_resume_reproduces_the_run(self, workers):
        first = module(workers, seed=None)
        assert isinstance(first.seed, int) and 0 <= first.seed < 2**31
        assert first.train_dataloader().batch_sampler.seed == first.seed
        assert first.data_state()["seed"] == first.seed and first.hparams["seed"] == first.seed
        reference = run(module(workers, seed=first.seed), 8)
        assert run(first, 3) == reference[:3]
        resumed = module(workers, seed=first.hparams["seed"])
        resumed.load_state_dict(pickle.loads(pickle.dumps(first.data_state())))
        assert run(resumed, 5) == reference[3:]

    def test_the_seed_is_drawn_with_secrets(self, monkeypatch):
        import secrets

        monkeypatch.setattr(secrets, "randbits", lambda bits: 777)
        dm = module(seed=None)
        assert dm.seed == 777 and run(dm, 4) == run(module(seed=777), 4)
