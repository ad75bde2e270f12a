"""The thread loader (``num_threads``): the batches, state and resume of ``num_workers=0``, loaded off the step."""

import logging
import pickle
import threading
import warnings

import datasets
import pytest
import torch

from engine import DataLoaderConfig, DataLoaderFactory, MultiDataModule, UniversalDataModule
from engine.loading.loader import ResumableLoader
from engine.loading.pipeline import Threads
from task_spec import TaskSpec
from tests.engine.test_resume import SPEC, fingerprint, module, rows, run
from tests.engine.test_resume_lightning import Recorder, trainer


def threaded(**kwargs):
    return module(0, num_threads=kwargs.pop("num_threads", 1), **kwargs)


def pipeline_threads():
    return [t for t in threading.enumerate() if t is not threading.main_thread() and t.daemon]


class TestOption:
    def test_negative_num_threads_is_refused_in_torch_form(self):
        with pytest.raises(ValueError, match="num_threads should be"):
            DataLoaderConfig(num_threads=-1)

    def test_threads_and_workers_are_not_combined(self):
        with pytest.raises(ValueError, match="num_threads=1 and num_workers=2 cannot be combined"):
            DataLoaderConfig(num_threads=1, num_workers=2)
        with pytest.raises(ValueError, match="cannot be combined"):
            UniversalDataModule(rows(), task_spec=TaskSpec.lm_tiny(), num_threads=1, num_workers=2)

    def test_a_stream_is_refused_naming_the_fix(self):
        stream = datasets.Dataset.from_dict({"x": [[1.0]] * 4}).to_iterable_dataset()
        with pytest.raises(ValueError, match="set num_threads=0"):
            DataLoaderFactory().create_dataloader(stream, DataLoaderConfig(num_threads=1))

    def test_the_module_builds_a_thread_loader_and_says_why(self):
        loader = threaded().train_dataloader()
        assert isinstance(loader, ResumableLoader) and isinstance(loader.executor, Threads)
        assert loader.executor.num_threads == 1
        _, reasons = DataLoaderConfig(num_threads=2).resolve()
        assert "2 background thread(s)" in reasons["num_threads"]


class TestSameBatches:
    @pytest.mark.parametrize("num_threads", [1, 3])
    @pytest.mark.parametrize("batching", ["plain", "grouped"])
    def test_three_epochs_equal_workers_0_masks_included(self, num_threads, batching):
        # mlm_tiny: the masks are drawn per batch from its seed, so they must match bit for bit too
        reference = run(module(0, batching=batching), 15)
        assert run(threaded(num_threads=num_threads, batching=batching), 15) == reference

    def test_arrow_rows_equal_workers_0(self):
        table = datasets.Dataset.from_dict({"input_ids": [list(range(2, 2 + n % 17 + 3)) for n in range(50)]})
        options = dict(task_spec=TaskSpec.lm_tiny(), batch_size=8, seed=3)
        plain = UniversalDataModule(table, **options).train_dataloader()
        thread = UniversalDataModule(table, num_threads=1, **options).train_dataloader()
        for _ in range(2):
            assert [fingerprint(b) for b in thread] == [fingerprint(b) for b in plain]

    @pytest.mark.parametrize("columns", [False, True], ids=["dataset_rows", "dict_of_columns"])
    def test_image_batches_equal_workers_0_in_threads_and_workers(self, columns):
        # the vision collator's batch path and the column gather, in a thread and in worker processes
        images = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
        labels = torch.arange(40) % 4
        data = {"pixel_values": images, "labels": labels} if columns else torch.utils.data.StackDataset(
            pixel_values=list(images), labels=labels.tolist())
        options = dict(task_spec=TaskSpec.vision_tiny(), batch_size=8, seed=5)
        reference = run(UniversalDataModule(data, **options), 10)
        assert run(UniversalDataModule(data, num_threads=1, **options), 10) == reference
        assert run(UniversalDataModule(data, num_workers=2, **options), 10) == reference

    def test_evaluation_loaders_read_every_row_once_in_order(self):
        plain, thread = module(0, val_split=12), threaded(val_split=12)
        assert isinstance(thread.val_dataloader().executor, Threads)
        assert [fingerprint(b) for b in thread.val_dataloader()] == [fingerprint(b) for b in plain.val_dataloader()]

    def test_ranks_get_equal_batch_counts_and_the_batches_of_workers_0(self):
        source = list(rows(count=45))
        factory = DataLoaderFactory()
        counts = []
        for rank in (0, 1):
            loaders = [factory.create_dataloader(source, DataLoaderConfig(
                batch_size=4, shuffle=True, seed=5, collate_fn=_first_values, num_threads=threads),
                rank=rank, num_replicas=2, uneven="pad") for threads in (0, 1)]
            plain, thread = ([batch for batch in loader] for loader in loaders)
            assert thread == plain and len(thread) == len(loaders[1])
            counts.append(len(thread))
        assert counts[0] == counts[1] == 6  # 45 rows padded to 46, 23 per rank, batches of 4


def _first_values(rows_):
    return [int(row[0]) for row in rows_]


class TestResume:
    @pytest.mark.parametrize("stop", [0, 3, 5, 7])
    def test_resume_mid_epoch_and_after_a_finished_epoch_continues_exactly(self, stop):
        total = 12  # 5 batches per epoch
        reference = run(module(0), total)
        first = threaded()
        assert run(first, stop) == reference[:stop]
        state = pickle.loads(pickle.dumps(first.data_state()))
        resumed = threaded()
        resumed.load_state_dict(state)
        assert run(resumed, total - stop) == reference[stop:]

    def test_the_position_counts_delivered_batches_not_prefetched_ones(self):
        loader = threaded(batch_size=4).train_dataloader()  # 10 batches per epoch
        iterator = iter(loader)
        next(iterator), next(iterator)
        for _ in range(100):  # let the thread fill its prefetch queue
            if loader.batch_sampler.state_dict()["position"] >= 4:
                break
            threading.Event().wait(0.01)
        assert loader.batch_sampler.state_dict()["position"] >= 4  # the thread ran ahead...
        assert loader.data_state()["_index_sampler_state"]["position"] == 2  # ...the saved position did not

    def test_the_sampler_has_finished_its_pass_when_the_last_batch_arrives(self):
        # so a caller's set_epoch after the last batch (Lightning stops at len, before StopIteration) never runs
        # while the thread is still inside the sampler
        loader = threaded().train_dataloader()
        iterator = iter(loader)
        for _ in range(len(loader)):
            next(iterator)
        state = loader.batch_sampler.state_dict()
        assert {key: state[key] for key in ("seed", "epoch", "position", "epoch_offset")} == {
            "seed": 11, "epoch": 1, "position": 0, "epoch_offset": 0}
        assert loader.data_state()["_index_sampler_state"]["position"] == len(loader)  # delivered: all of epoch 0

    @pytest.mark.parametrize("taken", [0, 2, 4, 5, 6])
    def test_the_module_state_equals_the_one_workers_0_saves(self, taken):
        states = []
        for dm in (module(0), threaded()):  # 5 batches per epoch: mid-epoch, the last batch, into the next epoch
            loader = dm.train_dataloader()
            iterator = iter(loader)
            for _ in range(min(taken, 5)):
                next(iterator)
            if taken > 5:
                next(iterator, None)  # the end of the pass
                next(iter(loader))
            states.append(dm.data_state())
        assert states[1] == states[0]

    def test_a_finished_pass_saves_the_next_epoch(self):
        dm = threaded()
        for _ in dm.train_dataloader():
            pass
        state = dm.data_state()
        assert state["train_loader"]["_iterator_finished"] and state["epoch"] == 1
        assert state["train_loader"]["_index_sampler_state"]["position"] == 0

    def test_a_state_moves_between_threads_and_workers_0_both_ways(self):
        reference = run(module(0), 9)
        for saver, loader in ((threaded, lambda: module(0)), (lambda: module(0), threaded)):
            first = saver()
            run(first, 3)
            resumed = loader()
            resumed.load_state_dict(first.data_state())
            assert run(resumed, 6) == reference[3:]

    def test_a_dropped_iterator_continues_its_pass_and_a_replaced_one_counts_as_an_epoch(self):
        reference = run(module(0), 10)
        loader = threaded().train_dataloader()
        iterator = iter(loader)
        seen = [fingerprint(next(iterator)) for _ in range(2)]
        loader._iterator = None  # what Lightning does at the end of fit
        assert loader.data_state()["_index_sampler_state"]["position"] == 2
        seen += [fingerprint(batch) for batch in loader]
        assert seen == reference[:5]
        iterator = iter(loader)
        next(iterator)  # abandoned after one batch: the next pass is the next epoch, as with workers=0
        plain = module(0).train_dataloader()
        for _ in plain:
            pass
        next(iter(plain))
        assert [fingerprint(b) for b in loader] == [fingerprint(b) for b in plain]

    def test_loading_a_state_retires_running_iterators(self):
        dm = threaded()
        iterator = iter(dm.train_dataloader())
        next(iterator)
        dm.load_state_dict(dm.data_state())
        with pytest.raises(RuntimeError, match="replaced this train loader"):
            next(iterator)

    def test_threads_stop_when_a_pass_ends_or_is_dropped(self):
        before = len(pipeline_threads())
        loader = threaded().train_dataloader()
        list(loader)
        iterator = iter(loader)
        next(iterator)
        loader._iterator = None
        assert len(pipeline_threads()) == before


class TestLightning:
    @pytest.fixture(autouse=True)
    def quiet(self):
        logging.getLogger("lightning").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield

    def test_fit_sees_the_batches_of_workers_0_and_a_new_trainer_extends_the_run(self, tmp_path):
        full = Recorder()
        trainer(max_steps=9).fit(full, datamodule=module(0))  # 5 batches per epoch: crosses into epoch 1
        first, dm = Recorder(), threaded()
        stopped = trainer(max_steps=2)
        stopped.fit(first, datamodule=dm)
        assert first.seen == full.seen[:2]
        stopped.save_checkpoint(tmp_path / "two.ckpt")
        extended = Recorder()
        trainer(max_steps=9).fit(extended, datamodule=threaded(), ckpt_path=tmp_path / "two.ckpt")
        assert extended.seen == full.seen[2:9]


def test_a_failing_row_is_named():
    class Broken(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            if index == 5:
                raise KeyError("no such row")
            return torch.ones(3)

    loader = DataLoaderFactory().create_dataloader(Broken(), DataLoaderConfig(batch_size=4, num_threads=1))
    with pytest.raises(Exception, match="row 5"):
        list(loader)


def test_several_named_datasets_load_in_threads_and_resume_exactly():
    def named(**kwargs):
        return MultiDataModule({"a": rows(), "b": rows(30, seed=1)}, task_spec=SPEC, batch_size=8, seed=3,
                               **kwargs)

    def take(dm, count):
        seen, loader = [], dm.train_dataloader()
        while len(seen) < count:
            for name, batch in loader:
                seen.append((name, fingerprint(batch)))
                if len(seen) == count:
                    break
        return seen

    reference = take(named(), 20)
    assert take(named(num_threads=1), 20) == reference
    first = named(num_threads=1)
    take(first, 7)
    resumed = named(num_threads=1)
    resumed.load_state_dict(first.data_state())
    assert take(resumed, 13) == reference[7:]
