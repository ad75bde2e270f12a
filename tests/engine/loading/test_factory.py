import random
import sys
import types

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from engine import DataLoaderConfig, DataLoaderFactory


class RandomPerRow(Dataset):
    """Rows drawn from the worker's global RNGs, as a user augmentation would."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor([index, random.randint(0, 10**6), int(np.random.randint(0, 10**6)),
                             int(torch.randint(0, 10**6, ()))])


class StacksWithOwnGenerator:
    """A collate function that keeps a torch.Generator, as a user's augmenting collator may."""

    def __init__(self):
        self.generator = torch.Generator().manual_seed(0)

    def __call__(self, rows):
        return torch.stack([row[0] for row in rows])


class Counting(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(6).split(1))


def collect(loader):
    return [batch if isinstance(batch, torch.Tensor) else batch[0] for batch in loader]


class TestCreateDataloader:
    def test_returns_a_stateful_loader_with_identical_batches_per_seed(self):
        dataset = TensorDataset(torch.randn(100, 32))
        config = DataLoaderConfig(batch_size=32, shuffle=True, seed=42)
        factory = DataLoaderFactory()
        first, second = factory.create_dataloader(dataset, config), factory.create_dataloader(dataset, config)
        assert isinstance(first, StatefulDataLoader)
        assert all(torch.equal(a, b) for a, b in zip(collect(first), collect(second)))

    def test_each_epoch_reorders_the_same_rows(self):
        loader = DataLoaderFactory().create_dataloader(
            TensorDataset(torch.arange(20)), DataLoaderConfig(batch_size=5, shuffle=True, seed=0))
        epoch0, epoch1 = torch.cat(collect(loader)), torch.cat(collect(loader))
        assert not torch.equal(epoch0, epoch1) and torch.equal(epoch0.sort().values, epoch1.sort().values)

    def test_workers_are_seeded_reproducibly(self):
        config = DataLoaderConfig(batch_size=4, num_workers=2, seed=7, persistent_workers=False)

        def draws():
            return torch.cat(collect(DataLoaderFactory().create_dataloader(RandomPerRow(), config)))

        first, second = draws(), draws()
        assert torch.equal(first, second)
        assert len(set(first[:, 1].tolist())) > 1  # workers got different seeds

    def test_loader_state_resumes_mid_epoch(self):
        config = DataLoaderConfig(batch_size=4, shuffle=True, seed=3)
        factory = DataLoaderFactory()
        loader = factory.create_dataloader(TensorDataset(torch.arange(24)), config)
        iterator = iter(loader)
        next(iterator), next(iterator)
        state = loader.state_dict()
        rest = [b[0] for b in iterator]
        resumed = factory.create_dataloader(TensorDataset(torch.arange(24)), config)
        resumed.load_state_dict(state)
        assert all(torch.equal(a, b) for a, b in zip(collect(resumed), rest)) and len(rest) == 4

    def test_iterable_dataset(self):
        loader = DataLoaderFactory().create_dataloader(Counting(), DataLoaderConfig(batch_size=4))
        assert [b.flatten().tolist() for b in loader] == [[0, 1, 2, 3], [4, 5]]
        with pytest.raises(ValueError, match="shuffle=True cannot reorder an IterableDataset"):
            DataLoaderFactory().create_dataloader(Counting(), DataLoaderConfig(shuffle=True))

    def test_unpicklable_collate_fn_under_spawn_fails_at_creation(self):
        config = DataLoaderConfig(num_workers=1, multiprocessing_context="spawn", collate_fn=lambda rows: rows)
        with pytest.raises(TypeError, match="with the 'spawn' start method sends the collate_fn"):
            DataLoaderFactory().create_dataloader(TensorDataset(torch.arange(4)), config)

    def test_a_collate_fn_holding_a_generator_under_spawn_fails_at_creation(self):
        config = DataLoaderConfig(num_workers=1, multiprocessing_context="spawn", collate_fn=StacksWithOwnGenerator())
        with pytest.raises(TypeError, match="sends the collate_fn to each worker by pickling, but it holds a torch"):
            DataLoaderFactory().create_dataloader(TensorDataset(torch.arange(4)), config)

    def test_a_tensor_carrying_a_generator_under_spawn_fails_at_creation(self):
        """The check skips a plain tensor's data, not what a tensor carries as attributes of its own."""
        values = torch.arange(4)
        values.generator = torch.Generator().manual_seed(0)
        config = DataLoaderConfig(num_workers=1, multiprocessing_context="spawn")
        with pytest.raises(TypeError, match="sends the dataset to each worker by pickling, but it holds a torch"):
            DataLoaderFactory().create_dataloader(TensorDataset(values), config)

    @pytest.mark.parametrize("context", ["spawn", "forkserver"])
    def test_a_collate_fn_of_a_main_module_without_a_file_is_refused_naming_it_and_the_fix(self, monkeypatch, context):
        """A notebook's, python -c's or stdin's __main__: pickling by reference works here, but a started worker
        cannot import __main__.StacksRows and would die at its first batch."""
        notebook = types.ModuleType("__main__")  # no __file__, no __spec__: as in Jupyter
        notebook.StacksRows = type("StacksRows", (), {"__module__": "__main__", "__call__": lambda self, rows: rows})
        monkeypatch.setitem(sys.modules, "__main__", notebook)
        config = DataLoaderConfig(num_workers=1, multiprocessing_context=context, collate_fn=notebook.StacksRows())
        with pytest.raises(TypeError, match=rf"the collate_fn should be importable by the workers that num_workers=1 "
                                            rf"starts with the '{context}' start method, but it refers to StacksRows, "
                                            rf"defined in __main__, which has no file here \(a notebook, python -c or "
                                            rf"stdin\).* Move StacksRows into a module .* or use the 'fork' start "
                                            rf"method"):
            DataLoaderFactory().create_dataloader(TensorDataset(torch.arange(4)), config)
        notebook.__file__ = "train.py"  # a script: started workers run it again as __mp_main__ and find the class
        DataLoaderFactory().create_dataloader(TensorDataset(torch.arange(4)), config)

    def test_config_of_wrong_type(self):
        with pytest.raises(TypeError, match="config should be a DataLoaderConfig, but got dict"):
            DataLoaderFactory().create_dataloader(TensorDataset(torch.arange(4)), {"batch_size": 2})


FORKED_BATCHES = """
import json, sys

import torch

from collators import CollatorRegistry, _kernels, warm_token_loops
from engine import DataLoaderConfig, DataLoaderFactory
from task_spec import TaskSpec

collator = CollatorRegistry.get_instance().get_collator(TaskSpec.lm_tiny(), pad_token_id=0)
rows = [torch.arange(5, 5 + n % 37) for n in range(200)]


def noting(rows):  # the batch, and whether its process had numba and the compiled loops
    batch = collator(rows)
    batch["numba"] = torch.tensor(["numba" in sys.modules, _kernels.pad_spans.dispatcher is not None])
    return batch


runs = {}
for name in ("twins", "inherited", "main"):
    if name == "inherited":
        warm_token_loops()  # the compiled loops, loaded before the workers fork
    workers = 0 if name == "main" else 2
    config = DataLoaderConfig(batch_size=8, shuffle=True, seed=1, num_workers=workers, collate_fn=noting,
                              multiprocessing_context="fork" if workers else None, timeout=120 if workers else 0)
    batches = [{key: value.tolist() for key, value in batch.items()}
               for batch in DataLoaderFactory().create_dataloader(rows, config)]
    runs[name] = {"numba": sorted({tuple(batch.pop("numba")) for batch in batches}), "batches": batches}
print(json.dumps({"same": runs["twins"]["batches"] == runs["inherited"]["batches"] == runs["main"]["batches"],
                  "batches": len(runs["main"]["batches"]), **{name: run["numba"] for name, run in runs.items()}}))
"""


def test_forked_workers_run_the_numpy_twins_or_inherit_the_compiled_loops_with_the_same_batches():
    """The loader does not load numba before forking its workers (about a second on the way to the first batch):
    they run the loops' numpy twins, and import no numba. Where the parent has loaded the loops
    (``warm_token_loops``), forked workers inherit them. The batches are those of the main process either way."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", FORKED_BATCHES], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root)}, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"same": True, "batches": 25, "twins": [[False, False]],
                                                        "inherited": [[True, True]], "main": [[True, True]]}
