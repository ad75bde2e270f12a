"""on_error='skip' and 'warn': a row whose read, decode or transform raises is left out of its batch and recorded
(dataset index, split, exception type and message) in ``dm.skipped``; every other row, batch and batch count is
the one a run over clean data gives, with 0 and 2 workers and across an exact resume; the cap turns a systematic
failure into an error; 'raise' stays the default."""

import contextlib
import hashlib
import os
import pickle
import signal
import warnings

import datasets
import pytest
import torch
from PIL import Image
from torch.utils.data._utils.pin_memory import pin_memory

from engine import UniversalDataModule
from engine.core.skipped_rows import SkippedRow, WithSkippedRows
from engine.datasets import ImageFolderDataset
from engine.sources.lengths import lengths_of
from task_spec import TaskSpec

SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 64})
BAD = (3, 13, 17)


class Rows(torch.utils.data.Dataset):
    """20 rows that carry their id; reading a row in ``bad`` raises, as a truncated file would."""

    def __init__(self, bad=BAD, rows=20):
        self.bad, self.rows = frozenset(bad), rows

    def __len__(self):
        return self.rows

    def __getitem__(self, index):
        if index in self.bad:
            raise OSError(f"truncated file img_{index}.png")
        return {"input_ids": torch.arange(1, 2 + index % 6) + index, "row_id": index}


def module(data, **options):
    settings = dict(task_spec=SPEC, batch_size=4, val_split=4, seed=3)
    return UniversalDataModule(data, **{**settings, **options})


def rows_of(batch):
    """``[(row id, its tokens without padding)]``: what a batch holds, whatever the padded width."""
    mask = batch["attention_mask"].bool()
    return [(int(i), ids[m].tolist()) for i, ids, m in zip(batch["row_id"], batch["input_ids"], mask)]


def passes(dm, epochs=2):
    """Each training epoch's batches, then the validation batches, as row lists."""
    loader = dm.train_dataloader()
    train = [[rows_of(batch) for batch in loader] for _ in range(epochs)]
    return train, [rows_of(batch) for batch in dm.val_dataloader()]


def hashed(batch):
    digest = hashlib.blake2b(digest_size=8)
    for key in sorted(batch):
        digest.update(key.encode() + batch[key].numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("on_error", ["skip", "warn"])
def test_failing_rows_are_left_out_recorded_and_everything_else_is_unchanged(workers, on_error):
    clean_train, clean_val = passes(module(Rows(bad=()), num_workers=workers))
    dm = module(Rows(), num_workers=workers, on_error=on_error)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train, val = passes(dm)
    for epoch, clean in enumerate(clean_train):  # same batch count; each batch is the clean one less its bad rows
        assert train[epoch] == [[row for row in batch if row[0] not in BAD] for batch in clean]
    assert val == [[row for row in batch if row[0] not in BAD] for batch in clean_val]
    split = {index: "train" if index in dm.split_plan.train else "val" for index in BAD}
    order = [row[0] for clean in clean_train for batch in clean for row in batch if row[0] in BAD]
    order += [row[0] for batch in clean_val for row in batch if row[0] in BAD]
    assert dm.skipped.records == [SkippedRow(i, split[i], "OSError", f"truncated file img_{i}.png") for i in order]
    assert dm.skipped.count == len(order) == 2 * sum(s == "train" for s in split.values()) + list(
        split.values()).count("val")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if on_error == "skip":
        assert messages == []
    else:  # once per row, though a train row is left out in each epoch
        assert sorted(messages) == sorted(f"on_error='warn' left out {split[i]} row {i} (OSError: truncated file "
                                          f"img_{i}.png) from its batch; it is recorded in dm.skipped" for i in BAD)


def test_a_transform_error_in_a_hugging_face_dataset_is_left_out_too():
    def transform(batch):
        if 5 in batch["row_id"]:
            raise ValueError("cannot decode row 5")
        return batch

    data = datasets.Dataset.from_dict({"input_ids": [[1 + i, 2 + i] for i in range(12)], "row_id": list(range(12))})
    dm = UniversalDataModule(data.with_transform(transform), task_spec=SPEC, batch_size=4, seed=0, on_error="skip")
    seen = [int(i) for batch in dm.train_dataloader() for i in batch["row_id"]]
    assert sorted(seen) == [i for i in range(12) if i != 5]
    assert dm.skipped.records == [SkippedRow(5, "train", "ValueError", "cannot decode row 5")]


def test_a_thread_loader_leaves_out_and_records_the_same_rows_as_no_workers():
    dm = module(Rows(), on_error="skip")
    threaded = module(Rows(), on_error="skip", num_threads=1)
    assert passes(threaded) == passes(dm)
    assert threaded.skipped.records == dm.skipped.records and dm.skipped.count > 0


class FailOn:
    """A module-level train_transform that raises on the rows in ``bad`` and adds a seeded random offset elsewhere."""

    def __init__(self, bad):
        self.bad = frozenset(bad)

    def __call__(self, row):
        if row["row_id"] in self.bad:
            raise ValueError(f"cannot augment row {row['row_id']}")
        return {**row, "input_ids": row["input_ids"] + torch.randint(0, 3, (1,))}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_train_transform_row_is_left_out_and_kept_rows_keep_their_augmentation(workers):
    clean = module(Rows(bad=()), val_split=0, num_workers=workers, train_transform=FailOn(()))
    dm = module(Rows(bad=()), val_split=0, num_workers=workers, train_transform=FailOn({3, 13}), on_error="skip")
    expected = [[row for row in batch if row[0] not in (3, 13)] for batch in passes(clean, epochs=1)[0][0]]
    assert passes(dm, epochs=1)[0][0] == expected  # a row augments alike in a batch or alone (seeded by its index)
    assert sorted(r.index for r in dm.skipped.records) == [3, 13]
    assert {(r.split, r.error_type) for r in dm.skipped.records} == {("train", "ValueError")}
    with pytest.raises(ValueError, match=r"train_transform failed on row (3|13) of the train data"):
        passes(module(Rows(bad=()), val_split=0, num_workers=workers, train_transform=FailOn({3, 13})), epochs=1)


class TestCap:
    def test_a_pass_leaving_out_more_rows_than_max_skipped_raises_naming_count_cap_and_rows(self):
        dm = module(Rows(bad=range(1, 13, 3)), val_split=0, on_error="skip", max_skipped=3)
        with pytest.raises(RuntimeError, match=r"on_error='skip' left out 4 rows of the train data in this pass, more "
                                               r"than max_skipped=3 allows \(3 of 20 rows\): the failures look "
                                               r"systematic .* First: train row \d+ \(OSError: truncated file"):
            passes(dm, epochs=1)

    def test_a_fraction_is_of_the_split_and_the_cap_counts_each_pass(self):
        dm = module(Rows(), val_split=0, on_error="skip", max_skipped=0.15)  # 3 of 20 rows per pass
        passes(dm, epochs=3)  # 3 rows left out in each pass: at the cap, never above it
        assert dm.skipped.count == 9
        strict = module(Rows(), val_split=0, on_error="skip", max_skipped=0.1)
        with pytest.raises(RuntimeError, match=r"more than max_skipped=0.1 allows \(2 of 20 rows\)"):
            passes(strict, epochs=1)

    def test_a_batch_whose_every_row_fails_raises_rather_than_yield_an_empty_batch(self):
        dm = module(Rows(bad=range(4, 8)), val_split=0, on_error="skip", shuffle=False)
        with pytest.raises(OSError, match=r"every row of the batch \[4, 5, 6, 7\] of the train data failed to read, "
                                          r"and on_error='skip' leaves out rows, not whole batches"):
            passes(dm, epochs=1)


@pytest.mark.parametrize("workers", [0, 2])
def test_resuming_after_a_skip_gives_the_uninterrupted_batches_and_count(workers):
    def run(dm, steps):
        seen, loader = [], dm.train_dataloader()
        while len(seen) < steps:
            for batch in loader:
                seen.append(hashed(batch))
                if len(seen) == steps:
                    break
        return seen

    total, stop = 7, 3  # 4 batches an epoch: the stop is mid-epoch, after row 3 or 13 was left out
    reference = module(Rows(), num_workers=workers, on_error="skip")
    expected = run(reference, total)
    first = module(Rows(), num_workers=workers, on_error="skip")
    assert run(first, stop) == expected[:stop] and first.skipped.count > 0
    state = pickle.loads(pickle.dumps(first.data_state()))
    assert state["skipped_rows"] == first.skipped.count
    resumed = module(Rows(), num_workers=workers, on_error="skip")
    resumed.load_state_dict(state)
    assert run(resumed, total - stop) == expected[stop:]
    assert resumed.skipped.count == reference.skipped.count  # the records before the save are not carried
    assert len(resumed.skipped) == reference.skipped.count - first.skipped.count


class MixedDtypes(Rows):
    """Row 6 holds float token ids, which the collator refuses (as it refuses a corrupt image it decodes)."""

    def __getitem__(self, index):
        row = super().__getitem__(index)
        return {**row, "input_ids": row["input_ids"].float()} if index == 6 else row


def test_raise_is_the_default_and_names_the_row_and_a_row_that_fails_to_collate_is_left_out_when_skipping():
    with pytest.raises(OSError, match=r"reading row (3|13|17) of the train data failed; fix or remove that row"):
        passes(module(Rows(), val_split=0), epochs=1)
    assert "skipped_rows" not in module(Rows(bad=()), val_split=0).data_state()
    with pytest.raises(TypeError, match=r"collating the batch of rows .* of the train data failed"):
        passes(module(MixedDtypes(bad=()), val_split=0), epochs=1)
    dm = module(MixedDtypes(bad=()), val_split=0, on_error="skip")
    (train,), _ = passes(dm, epochs=1)
    assert sorted(row for batch in train for row, _ in batch) == [row for row in range(20) if row != 6]
    assert [(record.index, record.split) for record in dm.skipped.records] == [(6, "train")]


def test_a_batch_that_fails_to_collate_with_no_row_at_fault_still_raises_when_skipping():
    def refuses_batches(rows):  # every row collates alone; no batch of two or more does
        if len(rows) > 1:
            raise ValueError("rows of unequal shapes")
        return {"row_id": torch.tensor([row["row_id"] for row in rows])}

    with pytest.raises(ValueError, match=r"collating the batch of rows .* of the train data failed \(ValueError: "
                                         r"rows of unequal shapes\)"):
        passes(module(Rows(bad=()), val_split=0, on_error="skip", collate_fn=refuses_batches), epochs=1)


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"on_error": "ignore"}, ValueError, r"on_error should be one of 'raise', 'skip', 'warn', but got "
                                         r"on_error='ignore'"),
    ({"max_skipped": 3}, ValueError, r"max_skipped caps the rows that on_error='skip' or 'warn' leaves out, but "
                                     r"got max_skipped=3 with on_error='raise'"),
    ({"on_error": "skip", "max_skipped": -1}, ValueError, r"max_skipped should be a non-negative integer, but got "
                                                          r"max_skipped=-1"),
    ({"on_error": "skip", "max_skipped": 1.5}, ValueError, r"max_skipped should be a row count \(an integer >= 0\) "
                                                           r"or a fraction of the split in \(0, 1\), but got "
                                                           r"max_skipped=1.5"),
    ({"on_error": "skip", "max_skipped": "3"}, TypeError, r"max_skipped should be a non-negative integer, but got "
                                                          r"max_skipped='3'"),
])
def test_bad_options_are_refused_at_construction(options, error, match):
    with pytest.raises(error, match=match):
        module(Rows(), **options)


def test_a_stream_cannot_skip_rows():
    stream = datasets.Dataset.from_dict({"input_ids": [[1, 2]] * 8}).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"on_error='skip' leaves out rows by their index, which a stream"):
        UniversalDataModule(stream, task_spec=SPEC, batch_size=4, on_error="skip")



class KilledAtRow21(torch.utils.data.Dataset):
    """A row whose read kills its worker process (SIGKILL, as the out-of-memory killer does). Row 21 is read after
    the first batches were taken, so the death is seen while the loop waits for a batch, as in a long epoch."""

    def __len__(self):
        return 24

    def __getitem__(self, index):
        if index == 21 and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"input_ids": torch.arange(1, 4) + index}


@contextlib.contextmanager
def no_hang(seconds=60):
    """A hang fails the test with TimeoutError instead of blocking the suite."""
    def hung(signum, frame):
        raise TimeoutError(f"the loader still waited after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_killed_worker_raises_an_error_naming_it_and_the_split_and_never_hangs():
    # on_error='skip' cannot leave out a row that kills its process: the death is an error, not a skip
    dm = module(KilledAtRow21(), val_split=0, shuffle=False, num_workers=2, on_error="skip")
    expected = (r"a worker process of the train loader died: worker [01] \(pid \d+\) was killed by SIGKILL "
                r"\(DataLoader worker .*\)\. A worker killed by SIGKILL is most often stopped by the out-of-memory "
                r"killer")
    with no_hang(), pytest.raises(RuntimeError, match=expected):
        for _ in dm.train_dataloader():
            pass


class KilledAtRowOne(KilledAtRow21):
    """Row 1 is read by the first prefetch, while the pass is still starting its workers."""

    def __getitem__(self, index):
        if index == 1 and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"input_ids": torch.arange(1, 4) + index}


def test_a_worker_killed_while_the_pass_starts_is_named_too():
    # torch's SIGCHLD handler raises wherever the main thread is: starting the workers, or waiting for a batch
    dm = module(KilledAtRowOne(), val_split=0, shuffle=False, num_workers=2)
    expected = r"a worker process of the train loader died.* killed by .* A worker killed by SIGKILL is most often"
    with no_hang(), pytest.raises(RuntimeError, match=expected):
        for _ in dm.train_dataloader():
            pass


class Pinnable:
    """Stands for a batch whose tensors get pinned (pinning real tensors needs an accelerator)."""

    def pin_memory(self):
        return "pinned"


def test_a_pinning_loader_pins_the_batch_and_keeps_its_records():
    # torch's pin_memory (what the loader's pinning thread calls) reaches the wrapper's pin_memory(), which pins
    # the batch inside (a wrapper without it would pass the batch on unpinned) and keeps the records
    skipped = [SkippedRow(3, "train", "OSError", "truncated file img_3.png")]
    pinned = pin_memory(WithSkippedRows({"names": ["a"], "ids": Pinnable()}, skipped))
    assert type(pinned) is WithSkippedRows and pinned.skipped == skipped
    assert pinned.batch == {"names": ["a"], "ids": "pinned"}


def test_length_grouped_batching_measures_a_failing_row_as_one_token_and_leaves_it_out():
    dm = module(Rows(), val_split=0, on_error="skip", batching="grouped")
    dm.setup()
    measured = lengths_of(dm.datasets["train"], "input_ids").tolist()
    assert measured == [1 if index in BAD else 1 + index % 6 for index in range(20)]  # the others in their place
    for epoch in passes(dm, epochs=2)[0]:
        seen = [row[0] for batch in epoch for row in batch]
        assert sorted(seen) == [index for index in range(20) if index not in BAD]
    assert sorted(row.index for row in dm.skipped) == sorted(2 * BAD)


def test_first_batch_validation_checks_the_batch_less_its_failing_row():
    dm = module(Rows(bad=(1,)), val_split=0, on_error="skip", shuffle=False, validate=True)
    dm.setup()  # validates the first batch, rows [0, 1, 2, 3], of which row 1 fails
    assert dm.validation_report.passed, dm.validation_report.problems
    assert dm.validation_report.summary["input_ids"].endswith("[3, 4]")  # rows 0, 2 and 3


def test_a_truncated_image_file_is_left_out_of_an_image_folder(tmp_path):
    generator = torch.Generator().manual_seed(0)
    for number in range(12):
        pixels = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=generator).numpy()
        path = tmp_path / f"class{number % 4}" / f"img{number:02d}.png"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(pixels).save(path)
    broken = tmp_path / "class2" / "img06.png"
    broken.write_bytes(broken.read_bytes()[:60])  # a download cut short
    data = ImageFolderDataset(tmp_path)
    index = [path for path, _ in data.samples].index(str(broken))
    dm = UniversalDataModule(data, task_spec=TaskSpec.vision_tiny(), batch_size=4, seed=0, on_error="skip")
    batches = list(dm.train_dataloader())
    assert sorted(len(batch["labels"]) for batch in batches) == [3, 4, 4]  # 12 files, one unreadable
    (record,) = dm.skipped.records
    assert (record.index, record.split, record.error_type) == (index, "train", "OSError")
    assert record.message.startswith(f"cannot read image '{broken}'") and "truncated" in record.message


class UnreadableFirstRow(torch.utils.data.Dataset):
    """Image rows whose first ``broken`` rows raise OSError, as a corrupt image file does."""

    def __init__(self, broken=1, count=8):
        self.broken, self.count = broken, count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        if index < self.broken:
            raise OSError(f"cannot identify image file 'img{index}.png'")
        return {"pixel_values": torch.zeros(3, 32, 32, dtype=torch.uint8), "labels": index % 4}


class TestAnUnreadableRowAtConstruction:
    """Construction reads a row to check its fields: a row 0 that fails is named with the fix (not a bare OSError),
    and with on_error='skip' construction looks on to the first row that reads and the batch leaves row 0 out."""

    def test_row_0_is_named_with_the_split_and_the_fix(self):
        with pytest.raises(OSError, match=r"reading row 0 of train_data failed at construction, which reads a row "
                                          r"to check its fields; fix or remove that row \(or its file\), or pass "
                                          r"on_error='skip' .* \(OSError: cannot identify image file 'img0.png'\)"):
            UniversalDataModule(UnreadableFirstRow(), task_spec=TaskSpec.vision_tiny(), batch_size=4)

    def test_val_data_is_named_as_val_data(self):
        with pytest.raises(OSError, match=r"reading row 0 of val_data failed at construction"):
            UniversalDataModule(UnreadableFirstRow(broken=0), val_data=UnreadableFirstRow(),
                                task_spec=TaskSpec.vision_tiny(), batch_size=4)

    @pytest.mark.parametrize("workers", [0, 2])
    def test_on_error_skip_constructs_and_leaves_row_0_out(self, workers):
        dm = UniversalDataModule(UnreadableFirstRow(), task_spec=TaskSpec.vision_tiny(), batch_size=4,
                                 shuffle=False, on_error="skip", num_workers=workers)
        batches = list(dm.train_dataloader())
        assert [batch["labels"].tolist() for batch in batches] == [[1, 2, 3], [0, 1, 2, 3]]
        assert [(record.index, record.split) for record in dm.skipped.records] == [(0, "train")]

    def test_on_error_skip_with_no_readable_row_names_the_rows_tried(self):
        with pytest.raises(OSError, match=r"reading rows 0 to 7 of train_data failed at construction"):
            UniversalDataModule(UnreadableFirstRow(broken=8), task_spec=TaskSpec.vision_tiny(), on_error="skip")


@pytest.mark.parametrize("workers", [0, 2])
def test_packing_skips_an_unreadable_row_like_the_other_batching_modes(workers):
    """Under on_error='skip' an unreadable row is left out of its pack and recorded, not refused as an empty row."""
    dm = module(Rows(), val_split=0, on_error="skip", batching="packed", max_tokens=24, num_workers=workers)
    batches = list(dm.train_dataloader())
    assert batches and sorted(row.index for row in dm.skipped) == sorted(BAD)
    assert {row.split for row in dm.skipped} == {"train"}


def test_a_split_view_is_measured_row_by_row_in_its_own_positions():
    dm = module(Rows(), val_split=4, on_error="skip", batching="grouped")
    dm.setup()
    measured = lengths_of(dm.datasets["train"], "input_ids").tolist()
    assert measured == [1 if index in BAD else 1 + index % 6 for index in dm.split_plan.train.tolist()]


@pytest.mark.parametrize("persistent", [False, True])
def test_an_error_out_of_the_workers_stops_them_and_the_next_pass_goes_on_from_the_failed_batch(persistent):
    # The caller's traceback keeps the raising iterator alive: workers left running would be stopped only when a
    # later garbage collection reaches it, after torch's 5 s join per worker, in unrelated code.
    dm = module(Rows(bad=(13,)), val_split=0, shuffle=False, num_workers=2, persistent_workers=persistent)
    loader = dm.train_dataloader()
    batches = iter(loader)
    workers = list(batches._workers)
    served = []
    with no_hang(), pytest.raises(OSError, match=r"reading row 13 of the train data failed") as raised:
        for batch in batches:
            served.append(rows_of(batch))
    assert [row for batch in served for row, _ in batch] == list(range(12))
    assert not any(worker.is_alive() for worker in workers), raised.value
    state = loader.data_state()  # the position before the failed batch: the rest of the epoch is not lost
    repaired = module(Rows(bad=()), val_split=0, shuffle=False, num_workers=2).train_dataloader()
    repaired.load_state_dict(state)
    assert [row for batch in repaired for row, _ in rows_of(batch)] == list(range(12, 20))
    again = iter(loader)
    assert list(again._workers) and not set(again._workers) & set(workers)  # new workers
    with no_hang(), pytest.raises(OSError, match=r"reading row 13 of the train data failed"):
        next(again)  # the pass goes on from its failed batch (rows 12..15), not from a new epoch
