"""engine/loading/state.py: fingerprints, the identity a state must match, structure checks, and TrainPosition."""

import datasets
import pytest
import torch

from engine.loading.config import DataLoaderConfig
from engine.loading.factory import DataLoaderFactory
from engine.loading.state import (
    IDENTITY_CHECKS,
    STATE_VERSION,
    TrainPosition,
    check_compatible,
    check_structure,
    data_fingerprint,
    module_identity,
)
from engine.sources.adapt import as_source

ROWS = [torch.arange(n) for n in range(3, 23)]


class NoReads(torch.utils.data.Dataset):
    fingerprint = "files-v1"

    def __len__(self):
        return 10

    def __getitem__(self, index):
        raise AssertionError("a dataset that declares its fingerprint is not read for one")


class Squares(torch.utils.data.Dataset):
    """Rows computed from their index; ``changed`` rows differ, ``noisy`` rows are drawn at random at every read."""

    def __init__(self, size=100, changed=(), noisy=False):
        self.size, self.changed, self.noisy = size, set(changed), noisy

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        value = torch.tensor([index * index + (7 if index in self.changed else 0)])
        return value + torch.rand(1) if self.noisy else value


class Declared(Squares):
    def fingerprint(self):
        return f"squares-{self.size}-{sorted(self.changed)}"


class TestDataFingerprint:
    def test_tensor_lists_change_when_rows_change_move_or_grow(self):
        base = data_fingerprint(as_source(ROWS))
        assert base == data_fingerprint(as_source([row.clone() for row in ROWS]))
        changed = [row.clone() for row in ROWS]
        changed[0][0] = 99
        assert len({base, data_fingerprint(as_source(changed)), data_fingerprint(as_source(ROWS[::-1])),
                    data_fingerprint(as_source(ROWS + [torch.arange(2)]))}) == 4

    def test_hf_datasets_use_their_own_fingerprint(self):
        first = datasets.Dataset.from_dict({"x": list(range(10))})
        assert data_fingerprint(as_source(first)) != data_fingerprint(as_source(first.map(lambda row: row)))
        assert data_fingerprint(as_source(first)) == data_fingerprint(as_source(first))

    def test_a_torch_dataset_that_declares_a_fingerprint_is_not_read(self):
        assert data_fingerprint(as_source(NoReads())) == data_fingerprint(as_source(NoReads()))

    def test_torch_datasets_of_the_same_length_whose_rows_differ_differ(self):
        assert data_fingerprint(as_source(Squares())) == data_fingerprint(as_source(Squares()))
        assert data_fingerprint(as_source(Squares())) != data_fingerprint(as_source(Squares(changed=[0])))

    def test_rows_drawn_at_random_still_resume_on_the_same_dataset(self):
        assert data_fingerprint(as_source(Squares(noisy=True))) == data_fingerprint(as_source(Squares(noisy=True)))
        assert data_fingerprint(as_source(Squares(noisy=True))) != data_fingerprint(as_source(Squares(size=99,
                                                                                                   noisy=True)))

    def test_a_declared_fingerprint_is_used(self):
        assert data_fingerprint(as_source(Declared(changed=[50]))) != data_fingerprint(as_source(Declared()))
        with pytest.raises(TypeError, match=r"Bad.fingerprint\(\) should return a str, but got int"):
            data_fingerprint(as_source(type("Bad", (Squares,), {"fingerprint": lambda self: 3})()))

    def test_every_row_of_a_tensor_list_counts(self):
        changed = [row.clone() for row in ROWS]
        changed[4][1] = 99  # not among the 16 evenly spaced rows a sample of these 20 reads
        assert data_fingerprint(as_source(ROWS)) != data_fingerprint(as_source(changed))


class TestIdentity:
    def identity(self, **changes):
        values = dict(seed=1, data_fingerprint="d", split_plan=None, world_size=1, config=DataLoaderConfig(),
                      uneven="pad", batching="plain", max_tokens=None)
        values.update(changes)
        return module_identity(**values)

    def test_every_checked_field_is_in_the_identity(self):
        assert set(IDENTITY_CHECKS) | {"version"} == set(self.identity())
        assert self.identity()["version"] == STATE_VERSION

    @pytest.mark.parametrize(("changes", "field"), [(dict(seed=2), "seed"), (dict(world_size=2), "world_size"),
                                                    (dict(config=DataLoaderConfig(batch_size=8)), "batch_size"),
                                                    (dict(batching="grouped"), "batching")])
    def test_a_difference_names_the_field(self, changes, field):
        with pytest.raises(ValueError, match=f"{field} was .* when saved and is .* now"):
            check_compatible(self.identity(), self.identity(**changes))

    def test_another_version_is_refused_first(self):
        with pytest.raises(ValueError, match="has version 1, but this engine writes version"):
            check_compatible({**self.identity(), "version": 1, "seed": 5}, self.identity())


class TestStructure:
    def test_refuses_non_dicts_missing_keys_and_bad_loader_parts(self):
        with pytest.raises(TypeError, match="should be a dict from dm.state_dict"):
            check_structure([1, 2])
        with pytest.raises(ValueError, match=r"missing \['train_loader'\]"):
            check_structure({"version": 3, "seed": 0, "epoch": 0})
        with pytest.raises(TypeError, match="but got str"):
            check_structure({"version": 3, "seed": 0, "epoch": 0, "train_loader": "x"})


class TestTrainPosition:
    def loader(self):
        rows = [torch.full((4,), n) for n in range(20)]  # equal lengths: the default collator stacks them
        return DataLoaderFactory().create_dataloader(rows, DataLoaderConfig(batch_size=4, shuffle=True, seed=3))

    def test_a_loaded_state_waits_for_the_loader_and_continues_it(self):
        reference = [batch.tolist() for batch in self.loader()]
        first = TrainPosition()
        iterator = iter(first.attach(self.loader()))
        next(iterator), next(iterator)
        saved = first.save()
        assert saved["epoch"] == 0
        second = TrainPosition()
        second.load(saved, retired_because="replaced")
        assert second.save()["train_loader"] == saved["train_loader"]  # not yet applied: kept as loaded
        rest = [batch.tolist() for batch in second.attach(self.loader())]
        assert rest == reference[2:]

    def test_loading_retires_iterators_of_the_loader_in_use(self):
        position = TrainPosition()
        iterator = iter(position.attach(self.loader()))
        next(iterator)
        position.load({"epoch": 0, "train_loader": None}, retired_because="a new state was loaded")
        with pytest.raises(RuntimeError, match="a new state was loaded"):
            next(iterator)
