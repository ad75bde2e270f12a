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
        raise AssertionError("the fingerprint must not read rows (they may be augmented at random)")


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

    def test_torch_datasets_are_not_read(self):
        assert data_fingerprint(as_source(NoReads())) == data_fingerprint(as_source(NoReads()))


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
