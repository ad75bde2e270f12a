"""Sharded corpora read as a map-style source: the listing (footers only), the rows served against the files, the
block order, the same batches at any number of workers, exact and elastic resume, every batching mode, the local
cache (hits, budget, a shard changed or gone) and clear refusals. Object storage: test_sharded_s3.py."""

import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from engine import Shards, UniversalDataModule
from engine.sampling.blocks import BlockOrder
from engine.sources.adapt import as_source
from engine.sources.shards.listing import list_shards
from engine.sources.shards.source import ShardedSource
from tests.engine.sources.shards.shard_corpus import SPEC, docs, write_corpus


@pytest.fixture()
def corpus(tmp_path):
    rows = write_corpus(tmp_path / "corpus")
    return tmp_path / "corpus", rows


def shards(folder, tmp_path, **options):
    return Shards(str(folder), cache_dir=str(tmp_path / "cache"), **{"shuffle_window": 64, **options})


def module(data, workers=0, **options):
    settings = dict(task_spec=SPEC, batch_size=8, val_split=0, seed=3, num_workers=workers)
    settings.update(options)
    return UniversalDataModule(data, **settings)


def epoch(dm):
    return docs(dm.train_dataloader())


def test_the_listing_reads_row_groups_from_the_footers(corpus, tmp_path):
    folder, rows = corpus
    listing = list_shards(shards(folder, tmp_path))
    assert listing.num_rows == len(rows) == 600
    assert listing.num_groups == 4 * 4  # 150 rows in row groups of 40: 40, 40, 40, 30
    assert listing.group_rows().tolist() == [40, 40, 40, 30] * 4
    assert [os.path.basename(name) for name in listing.files] == [f"part-{n:03d}.parquet" for n in range(4)]
    assert not (tmp_path / "cache").exists()  # no row was read


@pytest.mark.parametrize("kind", ["parquet", "arrow", "stream"])
def test_rows_are_the_rows_of_the_files(tmp_path, kind):
    rows = write_corpus(tmp_path / "c", kind=kind)
    source = as_source(shards(tmp_path / "c", tmp_path))
    assert isinstance(source, ShardedSource) and len(source) == 600
    picked = [599, 0, 41, 40, 333, 150]
    batch = source.__getitems__(picked)
    assert [row["doc"] for row in batch] == picked
    assert [row["input_ids"] for row in batch] == [rows[i] for i in picked]
    columns = source.fetch_columns(picked)
    assert columns["input_ids"].rows() == [rows[i] for i in picked] and columns["doc"] == picked


def test_an_epoch_serves_every_row_once_in_a_block_order(corpus, tmp_path):
    folder, _ = corpus
    served = epoch(module(shards(folder, tmp_path)))
    assert sorted(served) == list(range(600))
    windows = [served[start:start + 64] for start in range(0, 576, 64)]
    groups = [len({doc // 150 * 4 + doc % 150 // 40 for doc in window}) for window in windows]
    assert max(groups) <= 3  # a window of 64 rows spans at most 3 row groups of 30-40 rows
    assert served != sorted(served)


def test_the_same_batches_at_any_number_of_workers_and_threads(corpus, tmp_path):
    folder, _ = corpus
    reference = epoch(module(shards(folder, tmp_path)))
    assert epoch(module(shards(folder, tmp_path), workers=2)) == reference
    assert epoch(module(shards(folder, tmp_path), num_threads=2)) == reference


def test_a_local_folder_url_and_a_file_list_read_the_same(corpus, tmp_path):
    folder, _ = corpus
    files = sorted(str(path) for path in folder.glob("*.parquet"))
    reference = epoch(module(shards(folder, tmp_path)))
    assert epoch(module(Shards(files, cache_dir=str(tmp_path / "cache"), shuffle_window=64))) == reference
    assert epoch(module(Shards(f"file://{folder}", cache_dir=str(tmp_path / "cache"),
                               shuffle_window=64))) == reference
    assert epoch(module(Shards(f"{folder}/*.parquet", cache_dir=str(tmp_path / "cache"),
                               shuffle_window=64))) == reference


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0)])
def test_resume_mid_epoch_is_exact_across_worker_counts(corpus, tmp_path, before, after):
    folder, _ = corpus
    full = epoch(module(shards(folder, tmp_path)))
    first = module(shards(folder, tmp_path), workers=before)
    iterator = iter(first.train_dataloader())
    served = docs(next(iterator) for _ in range(30))
    state = pickle.loads(pickle.dumps(first.data_state()))
    resumed = module(shards(folder, tmp_path), workers=after)
    resumed.load_state_dict(state)
    assert served + epoch(resumed) == full


def test_a_state_saved_on_two_ranks_finishes_its_epoch_on_one(corpus, tmp_path, monkeypatch):
    """Two ranks simulated in one process (the module reads its rank at setup); real processes:
    tests/distributed/test_sharded_elastic.py."""
    folder, _ = corpus
    served, states = [], []
    for rank in range(2):
        monkeypatch.setattr("engine.datamodule.universal.resolve_world", lambda trainer, rank=rank: (rank, 2))
        dm = module(shards(folder, tmp_path), batch_size=4)
        iterator = iter(dm.train_dataloader())
        served += docs(next(iterator) for _ in range(10))
        states.append(dm.data_state())
    monkeypatch.undo()
    resumed = module(shards(folder, tmp_path), batch_size=8)
    resumed.load_state_dict(states[0])
    rest = epoch(resumed)
    assert len(served) == len(set(served)) == 80
    assert not set(rest) & set(served) and sorted(rest + served) == list(range(600))


@pytest.mark.parametrize("options", [{"batching": "grouped"}, {"batching": "token_budget", "max_tokens": 160},
                                     {"batching": "packed", "max_tokens": 160}])
def test_every_batching_mode_serves_every_row_once(corpus, tmp_path, options):
    folder, rows = corpus
    dm = module(shards(folder, tmp_path), **options)
    served = epoch(dm) if options["batching"] != "packed" else None
    if served is not None:
        assert sorted(served) == list(range(600))
    else:
        tokens = sum(int(batch["input_ids"].numel()) for batch in dm.train_dataloader())
        assert tokens == sum(len(row) for row in rows)


def test_a_second_run_reads_from_the_cache(corpus, tmp_path):
    folder, _ = corpus
    first = module(shards(folder, tmp_path))
    epoch(first)
    stats = first.train_dataloader().dataset.reader.stats
    assert 15 <= stats["fetched"] <= 16  # each row group once (row 0's may have been read at construction)
    assert stats["read_ahead"] >= 10  # most while an earlier batch was served
    second = module(shards(folder, tmp_path))
    epoch(second)
    stats = second.train_dataloader().dataset.reader.stats
    assert stats["fetched"] == 0 and stats["cache_hits"] == 16


def test_a_batch_starts_reading_the_row_groups_of_a_later_batch(corpus, tmp_path):
    from engine.sampling.base import BatchIndices

    folder, _ = corpus
    source = as_source(shards(folder, tmp_path))
    batch = BatchIndices([0, 1, 2])
    batch.ahead = [400, 599]  # row groups 10 (rows 380-419) and 15 (570-599)
    assert [row["doc"] for row in source.__getitems__(batch)] == [0, 1, 2]
    for future in list(source.reader._pending.values()):
        future.result(timeout=30)
    assert source.reader.stats["read_ahead"] == 2
    assert [row["doc"] for row in source.__getitems__([400, 599])] == [400, 599]
    assert source.reader.stats["fetched"] == 3 and source.reader.stats["cache_hits"] == 2


def test_the_cache_keeps_to_its_byte_budget(corpus, tmp_path):
    folder, _ = corpus
    source = as_source(shards(folder, tmp_path, cache_bytes=3 * 600))
    for group in range(16):
        source.reader.table(group)
    cached = [entry.stat().st_size for entry in os.scandir(tmp_path / "cache") if entry.name.endswith(".arrow")]
    assert sum(cached) <= 3 * 600 or len(cached) == 1
    assert source.reader.stats["evicted"] >= 10


def test_a_shard_replaced_after_listing_is_named(corpus, tmp_path):
    folder, _ = corpus
    source = as_source(shards(folder, tmp_path))
    table = pq.read_table(folder / "part-002.parquet")
    pq.write_table(table.slice(0, 100), folder / "part-002.parquet", row_group_size=40)
    with pytest.raises(ValueError, match=r"part-002.parquet' changed since it was listed"):
        source.__getitems__([320])
    assert source.__getitems__([0])[0]["doc"] == 0  # other shards still read


def test_a_shard_removed_after_listing_is_named(corpus, tmp_path):
    folder, _ = corpus
    source = as_source(shards(folder, tmp_path))
    os.remove(folder / "part-001.parquet")
    with pytest.raises(FileNotFoundError, match=r"part-001.parquet' was listed but no longer exists"):
        source.__getitems__([160])


def test_a_state_of_another_corpus_is_refused(corpus, tmp_path):
    folder, _ = corpus
    first = module(shards(folder, tmp_path))
    next(iter(first.train_dataloader()))
    state = first.data_state()
    write_corpus(tmp_path / "other", seed=1)
    other = module(shards(tmp_path / "other", tmp_path))
    with pytest.raises(ValueError, match="data"):
        other.load_state_dict(state)


def test_refusals_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        as_source(Shards(str(tmp_path / "missing")))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    with pytest.raises(ValueError, match=r"holds no shard.*Parquet"):
        as_source(Shards(str(tmp_path / "notes")))
    write_corpus(tmp_path / "mixed", files=1)
    write_corpus(tmp_path / "mixed2", files=1, kind="arrow")
    os.rename(tmp_path / "mixed2" / "part-000.arrow", tmp_path / "mixed" / "part-001.arrow")
    with pytest.raises(ValueError, match="one kind"):
        as_source(Shards(str(tmp_path / "mixed")))
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "mixed" / "part-000.parquet")
    write_corpus(tmp_path / "schemas", files=1)
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "schemas" / "part-009.parquet")
    with pytest.raises(ValueError, match=r"columns of the first .*part-009.parquet"):
        as_source(Shards(str(tmp_path / "schemas")))
    with pytest.raises(ValueError, match="shuffle_window should be a positive integer"):
        Shards("s3://bucket/x", shuffle_window=0)
    with pytest.raises(TypeError, match="storage_options should be a dict"):
        Shards("s3://bucket/x", storage_options="key=1")


def test_long_rows_drop_leaves_rows_out(corpus, tmp_path):
    """'split': test_sharded_long_rows.py."""
    folder, rows = corpus
    short = SPEC.replace(additional_config={"max_seq_len": 16})
    dm = module(shards(folder, tmp_path), long_rows="drop", task_spec=short)
    served = epoch(dm)
    assert sorted(served) == [index for index, row in enumerate(rows) if len(row) <= 16]


def test_block_order_is_a_permutation_that_keeps_windows_in_few_groups():
    groups = np.repeat(np.arange(50), 100)
    order = BlockOrder(groups, window=200)
    first, again, other = order.permutation(1), order.permutation(1), order.permutation(2)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert np.array_equal(np.sort(first), np.arange(5000))
    assert max(len(set(groups[first[start:start + 200]])) for start in range(0, 5000, 200)) <= 3
    shuffled = np.random.default_rng(0).permutation(groups)  # a split's rows, not in storage order
    view = BlockOrder(shuffled, window=200).permutation(1)
    assert np.array_equal(np.sort(view), np.arange(5000))
    assert max(len(set(shuffled[view[start:start + 200]])) for start in range(0, 5000, 200)) <= 3


def test_a_split_of_shards_serves_its_rows(corpus, tmp_path):
    folder, _ = corpus
    dm = module(shards(folder, tmp_path), val_split=100)
    train = epoch(dm)
    val = docs(dm.val_dataloader())
    assert len(train) == 500 and len(val) == 100 and sorted(train + val) == list(range(600))
    assert torch.is_tensor(next(iter(dm.val_dataloader()))["input_ids"])


def test_the_report_reads_the_lengths_of_the_shards(corpus, tmp_path):
    from engine.tools.report import collect

    folder, rows = corpus
    dm = module(shards(folder, tmp_path), val_split=100)
    dm.setup()
    numbers = collect(dm)[0]
    assert numbers["split_sizes"] == {"train": 500, "val": 100}
    train = [len(rows[i]) for i in dm.split_plan.train.tolist()]
    stats = numbers["lengths"]["train"]
    assert (stats["rows"], stats["total"], stats["max"]) == (500, sum(train), max(train))
    reads = numbers["shards"]["train, val"]  # one corpus, one reader: the splits cut from it share its counts
    assert list(numbers["shards"]) == ["train, val"] and (reads["row_groups"], reads["rows"]) == (16, 600)
    assert reads["process"]["fetched"] == 0  # construction and setup read no row
    dm.first_batch()  # the first batch's row groups, read in this process
    assert collect(dm)[0]["shards"]["train, val"]["process"]["fetched"] >= 1
    assert "<svg" in dm.report()._repr_html_()


def add_marker(row, generator):
    """A per-row transform: token 1 prepended, and a random bit drawn from the row's own generator."""
    return {**row, "input_ids": [1, *row["input_ids"]], "bit": int(torch.randint(2, (1,), generator=generator))}


def fails_on_doc_7(row, generator):
    if row["doc"] == 7:
        raise ValueError("bad row")
    return row


def test_transforms_and_skipped_rows_work_on_shards(corpus, tmp_path):
    folder, _ = corpus
    first = [batch for batch in module(shards(folder, tmp_path), train_transform=add_marker).train_dataloader()]
    again = [batch for batch in module(shards(folder, tmp_path), train_transform=add_marker,
                                       workers=2).train_dataloader()]
    assert all(bool((batch["input_ids"][:, 0] == 1).all()) for batch in first)
    assert [batch["bit"].tolist() for batch in first] == [batch["bit"].tolist() for batch in again]
    dm = module(shards(folder, tmp_path), train_transform=fails_on_doc_7, on_error="skip")
    served = epoch(dm)
    assert sorted(served) == [doc for doc in range(600) if doc != 7]
    assert [(row.index, row.split) for row in dm.skipped.records] == [(7, "train")]


def test_a_forked_worker_does_not_wait_for_the_parents_read_ahead(corpus, tmp_path):
    """A loader worker forked while the parent was reading ahead inherits the parent's reader, with futures whose
    threads stayed in the parent: it must fetch for itself rather than wait for them (forever)."""
    import threading
    from concurrent.futures import Future

    folder, _ = corpus
    source = as_source(shards(folder, tmp_path))
    reader = source.reader
    reader._pending[3] = Future()  # running in a thread of the parent: never finished in this process
    reader._pid = -1  # this reader was built in another process (the parent), as in a forked worker
    tables = []
    reading = threading.Thread(target=lambda: tables.append(reader.table(3)), daemon=True)
    reading.start()
    reading.join(timeout=30)
    assert not reading.is_alive(), "the read waited for a future of the parent's threads"
    table = tables[0]
    assert table.column("doc").to_pylist() == list(range(120, 150))  # row group 3: rows 120-149 of shard 0


def test_plain_batching_reads_no_shard_before_its_batches(corpus, tmp_path):
    """Truncation and the empty-row check read no token column up front: the first batch fetches only the row groups
    it and the batches read ahead need, so a cold start or a resume is a few row groups, not the corpus."""
    folder, _ = corpus
    dm = module(shards(folder, tmp_path))
    next(iter(dm.train_dataloader()))
    assert not list((tmp_path / "cache").glob("lengths-*"))
    assert len(list((tmp_path / "cache").glob("*.arrow"))) < 16


def test_an_empty_token_row_is_refused_when_its_batch_is_read(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[5, 6], [], [7]], pa.list_(pa.int32())), "doc": [0, 1, 2]}),
                   folder / "part-0.parquet")
    dm = module(shards(folder, tmp_path), batch_size=3, shuffle=False)
    with pytest.raises(ValueError, match=r"'input_ids' should hold at least one token in every row, but row 1 of "
                                         r"the train data holds 0 tokens"):
        next(iter(dm.train_dataloader()))


def test_loader_workers_send_their_reader_counts_back_once(corpus, tmp_path):
    """Each worker's counts come back with its batches, without the parent's that a forked worker inherits."""
    folder, _ = corpus
    epoch(module(shards(folder, tmp_path)))  # fills the cache: every later read is a cache hit
    dm = module(shards(folder, tmp_path), workers=2)
    dm.setup()
    source = dm.datasets["train"]
    source.__getitems__(list(range(40)))  # row group 0, opened in the parent before the workers fork
    assert source.reader_counts()["process"]["cache_hits"] == 1
    loader = dm.train_dataloader()
    batches = loader.batch_sampler.epoch_batches(0)
    groups = [set(source.group_of(source.corpus_rows(batch)).tolist()) for batch in batches]
    opened = sum(len(set().union(*groups[worker::2]) - {0}) for worker in range(2))  # group 0 is open already
    assert len(epoch(dm)) == 600
    counts = source.reader_counts()
    assert counts["workers"]["cache_hits"] == opened and counts["workers"]["fetched"] == 0
    assert counts["process"]["cache_hits"] == 1


def test_building_the_module_reads_no_row(corpus, tmp_path):
    """The construction checks read the columns from the schema: a row would fetch its whole row group into the
    cache before the loader exists, in the parent, on the way to the first batch."""
    folder, _ = corpus
    module(shards(folder, tmp_path))
    assert not list((tmp_path / "cache").glob("*.arrow"))


def test_a_row_group_is_cached_in_several_record_batches_and_read_as_one(corpus, tmp_path, monkeypatch):
    """A row group is decoded a few rows at a time into its cache file (the decoder's buffers stay small); rows,
    token columns and windows read from those batches are the files' rows."""
    from engine.sources.shards import decode as shard_decode

    monkeypatch.setattr(shard_decode, "DECODE_BYTES", 64)  # a few rows a record batch
    folder, rows = corpus
    source = as_source(shards(folder, tmp_path))
    picked = [599, 0, 41, 40, 333, 150, 39, 79]
    assert [row["input_ids"] for row in source.__getitems__(picked)] == [rows[i] for i in picked]
    with pa.memory_map(str(source.reader.cache_path(0))) as mapped:
        assert pa.ipc.open_file(mapped).num_record_batches > 5
    assert source.fetch_columns(picked)["input_ids"].rows() == [rows[i] for i in picked]
    starts, ends = [1, 0, 2, 0, 1, 0, 1, 0], [3, 2, 3, 1, 2, 3, 2, 1]
    windows = source.windowed(np.asarray(picked), np.asarray(starts), np.asarray(ends), ["input_ids"])
    cut = windows.fetch_columns(list(range(8)))["input_ids"].rows()
    assert cut == [rows[i][start:end] for i, start, end in zip(picked, starts, ends)]


def test_a_process_decodes_one_row_group_at_a_time(corpus, tmp_path, monkeypatch):
    """Row groups read ahead are fetched in parallel, but decoded one at a time: each decode's buffers are the
    process's own memory (a loader worker's) until its row group is written."""
    import threading
    import time

    import pyarrow.parquet as parquet

    folder, _ = corpus
    source = as_source(shards(folder, tmp_path))
    live, most, guard = [0], [0], threading.Lock()
    batches = parquet.ParquetFile.iter_batches

    def decoding(self, *args, **kwargs):
        with guard:
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.05)  # widens the window two decodes would overlap in
        try:
            yield from batches(self, *args, **kwargs)
        finally:
            with guard:
                live[0] -= 1

    monkeypatch.setattr(parquet.ParquetFile, "iter_batches", decoding)
    source.reader.read_ahead(list(range(1, 8)))
    source.reader.table(0)
    for future in list(source.reader._pending.values()):
        future.result(timeout=30)
    assert source.reader.stats["fetched"] == 8 and most[0] == 1


def test_a_row_group_wanted_by_two_processes_at_once_is_fetched_once(corpus, tmp_path, monkeypatch):
    """The loader workers read batches of the same row groups: the first to want one fetches it, and the others
    wait for its cache file (a claim on the file, which two readers hold apart as two processes do)."""
    import threading
    import time

    from engine.sources.shards.reader import RowGroupReader

    folder, rows = corpus
    source = as_source(shards(folder, tmp_path))
    fetch = RowGroupReader._row_group_bytes

    def slow(self, *args):
        time.sleep(0.1)  # widens the window two fetches would overlap in
        return fetch(self, *args)

    monkeypatch.setattr(RowGroupReader, "_row_group_bytes", slow)
    readers = [RowGroupReader(source.listing) for _ in range(2)]
    tables = [None, None]
    threads = [threading.Thread(target=lambda n=n: tables.__setitem__(n, readers[n].table(3))) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tables[0].column("doc").to_pylist() == tables[1].column("doc").to_pylist() == list(range(120, 150))
    assert sum(reader.stats["fetched"] for reader in readers) == 1
    assert sum(reader.stats["cache_hits"] for reader in readers) == 1
    assert not list((tmp_path / "cache").glob(".*.lock"))


def test_a_reader_reuses_the_footers_its_process_listed(corpus, tmp_path, monkeypatch):
    """Loader workers forked after the listing read a row group with one ranged read, not its footer again."""
    import pyarrow.parquet as parquet

    from engine.sources.shards.reader import RowGroupReader

    folder, rows = corpus
    listing = list_shards(shards(folder, tmp_path))
    read = []
    monkeypatch.setattr(parquet, "read_metadata", lambda *args, **kwargs: read.append(args))
    table = RowGroupReader(listing).table(5)  # the process's own reader, or a forked worker's
    assert table.column("input_ids").to_pylist() == rows[190:230] and not read


def test_hidden_files_and_writer_leftovers_are_skipped_as_pyarrow_dataset_skips_them(corpus, tmp_path):
    folder, rows = corpus
    write_corpus(folder / "_temporary" / "0" / "task-1", files=1)  # Spark's / Hadoop's uncommitted attempt
    write_corpus(folder / ".ipynb_checkpoints", files=1)
    pq.write_table(pa.table({"input_ids": [[1]], "doc": [0]}), folder / ".part-004.parquet")
    pq.write_table(pa.table({"input_ids": [[1]], "doc": [0]}), folder / "_committed_part-005.parquet")
    (folder / "_SUCCESS").write_text("")
    listing = list_shards(shards(folder, tmp_path))
    assert [os.path.basename(name) for name in listing.files] == [f"part-{n:03d}.parquet" for n in range(4)]
    assert listing.num_rows == len(rows)
    globbed = list_shards(shards(str(folder) + "/**/*.parquet", tmp_path))
    assert globbed.files == listing.files
    hidden = list_shards(shards(folder / "_temporary" / "0" / "task-1", tmp_path))  # named: read as named
    assert hidden.num_rows == 150


def test_a_file_named_twice_is_refused_naming_it(corpus, tmp_path):
    folder, _ = corpus
    twice = Shards([str(folder), str(folder / "part-002.parquet")], cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"the shard '.*part-002.parquet' is named twice.*name each file once"):
        list_shards(twice)


def test_a_local_shard_replaced_with_its_size_and_modification_time_kept_is_a_new_version(tmp_path):
    """``cp -p`` and ``rsync -a`` keep the modification time over new content: the version hashes the content's
    ends (a Parquet footer whole), so the old cache is not served and an old state is refused."""
    folder = tmp_path / "kept"
    folder.mkdir()

    def write(offset):
        table = pa.table({"input_ids": [[5, 6, 7]] * 40, "doc": pa.array(range(offset, offset + 40), pa.int64())})
        pq.write_table(table, folder / "part-000.parquet", row_group_size=20, compression="none",
                       use_dictionary=False)

    write(0)
    before = os.stat(folder / "part-000.parquet")
    first = module(shards(folder, tmp_path), batch_size=4)
    assert sorted(epoch(first)) == list(range(40))
    state = first.data_state()
    write(1000)  # other rows of the same size
    os.utime(folder / "part-000.parquet", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(folder / "part-000.parquet").st_size == before.st_size
    second = module(shards(folder, tmp_path), batch_size=4)
    with pytest.raises(ValueError, match="data_fingerprint"):
        second.load_state_dict(state)
    assert sorted(epoch(second)) == list(range(1000, 1040))
    assert list_shards(shards(folder, tmp_path)).versions == second.datasets["train"].listing.versions  # stable


def test_a_state_resumed_with_another_shuffle_window_is_refused_naming_it(corpus, tmp_path):
    folder, _ = corpus
    first = module(shards(folder, tmp_path, shuffle_window=64))
    next(iter(first.train_dataloader()))
    state = first.data_state()
    assert state["shuffle_window"] == 64
    with pytest.raises(ValueError, match=r"shuffle_window was 64 when saved and is 128 now \(sharded data's epoch "
                                         r"order.*Resume with Shards\(shuffle_window=\.\.\.\) as saved \(64\)"):
        module(shards(folder, tmp_path, shuffle_window=128)).load_state_dict(state)
    mixed = module({"a": shards(folder, tmp_path, shuffle_window=64)}, mix={"a": 1.0})
    assert mixed.data_state()["shuffle_window"] == {"a": 64}
    same = module(shards(folder, tmp_path, shuffle_window=64))
    same.load_state_dict(state)
    older = {key: value for key, value in state.items() if key != "shuffle_window"}  # saved before it was recorded
    module(shards(folder, tmp_path, shuffle_window=64)).load_state_dict(older)


@pytest.mark.parametrize("damage", ["not parquet", "footer"])
def test_a_file_that_is_no_parquet_or_has_a_damaged_footer_is_named_at_the_listing(corpus, tmp_path, damage):
    folder, _ = corpus
    data = bytearray((folder / "part-001.parquet").read_bytes())
    if damage == "footer":
        length = int.from_bytes(data[-8:-4], "little")
        for at in range(len(data) - 8 - length, len(data) - 8):
            data[at] ^= 0x5A
    (folder / "part-001.parquet").write_bytes(bytes(data) if damage == "footer" else b"id,text\n1,a\n")
    with pytest.raises(ValueError, match=r"(?s)shard '.*part-001.parquet' is not a readable Parquet file .*rewrite it, "
                                         r"or move it out of the corpus"):
        list_shards(shards(folder, tmp_path))


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_cache_file_is_fetched_again(corpus, tmp_path, damage):
    folder, rows = corpus
    first = as_source(shards(folder, tmp_path))
    first.__getitems__([0])
    cached = next(path for path in (tmp_path / "cache").iterdir() if path.suffix == ".arrow")
    data = cached.read_bytes()
    cached.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\0" * len(data))
    again = as_source(shards(folder, tmp_path))
    assert [row["input_ids"] for row in again.__getitems__([0, 1])] == rows[:2]
    assert again.reader.stats["fetched"] == 1


def test_a_cache_dir_that_is_a_file_is_refused_naming_it(corpus, tmp_path):
    folder, _ = corpus
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"cache_dir should be a folder, but cache_dir='.*file' is a file"):
        Shards(str(folder), cache_dir=str(tmp_path / "file"))
    below = as_source(Shards(str(folder), cache_dir=str(tmp_path / "file" / "cache")))
    with pytest.raises(NotADirectoryError, match=r"cache_dir should be a folder, but '.*file/cache' is a file \(or "
                                                 r"lies under one\)"):
        below.__getitems__([0])


@pytest.mark.parametrize("kind", ["arrow", "stream"])
def test_arrow_ipc_shards_are_listed_from_metadata_and_a_stream_is_read_from_each_batchs_offset(tmp_path, kind,
                                                                                               monkeypatch):
    rows = write_corpus(tmp_path / "c", kind=kind)
    monkeypatch.setattr(pa.RecordBatchFileReader, "get_batch", None, raising=False)  # a batch's body: not read
    monkeypatch.setattr(pa.ipc.RecordBatchFileReader, "get_batch", None, raising=False)
    listing = list_shards(shards(tmp_path / "c", tmp_path))
    assert listing.group_rows().tolist() == [40, 40, 40, 30] * 4
    assert sorted(listing.batch_offsets) == ([0, 1, 2, 3] if kind == "stream" else [])
    monkeypatch.undo()
    if kind == "stream":
        def from_the_start(*args, **kwargs):
            raise AssertionError("a stream shard was read from its start")

        monkeypatch.setattr(pa.ipc, "open_stream", from_the_start)
    source = ShardedSource(listing)
    picked = [599, 0, 41, 40, 333, 150, 130]
    assert [row["input_ids"] for row in source.__getitems__(picked)] == [rows[i] for i in picked]


def test_a_batchs_missing_row_groups_are_fetched_side_by_side_each_once(corpus, tmp_path, monkeypatch):
    """A batch whose rows span several uncached row groups (a shuffle window's) fetches them together, not one
    after another, and counts each as fetched (not as a cache hit)."""
    import threading
    import time

    from engine.sources.shards.reader import RowGroupReader

    folder, rows = corpus
    source = as_source(shards(folder, tmp_path))
    live, most, guard = [0], [0], threading.Lock()
    fetch = RowGroupReader._row_group_bytes

    def slow_fetch(self, shard, index):
        with guard:
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.2)  # the store's latency, in which the other fetches should start
        try:
            return fetch(self, shard, index)
        finally:
            with guard:
                live[0] -= 1

    monkeypatch.setattr(RowGroupReader, "_row_group_bytes", slow_fetch)
    picked = [0, 45, 90, 160, 599, 300]  # six row groups
    batch = source.__getitems__(picked)
    assert [row["doc"] for row in batch] == picked and [row["input_ids"] for row in batch] == [rows[i] for i in picked]
    assert most[0] > 1
    assert source.reader.stats["fetched"] == 6 and source.reader.stats["cache_hits"] == 0
    again = as_source(shards(folder, tmp_path))  # another process's reader: each row group from the cache
    again.__getitems__(picked)
    assert again.reader.stats["fetched"] == 0 and again.reader.stats["cache_hits"] == 6


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_loop_shuffles_shards_in_the_block_order_of_the_module(corpus, tmp_path, workers):
    """``DataLoaderFactory.create_dataloader`` over sharded data with ``shuffle=True`` serves the block order (row
    groups in a seeded order, rows shuffled within windows), the order a module's train loader serves, not a full
    shuffle that would read a different row group for nearly every row."""
    from collators import CollatorRegistry
    from engine import DataLoaderConfig, DataLoaderFactory

    folder, _ = corpus
    collator = CollatorRegistry.get_instance().get_collator(SPEC, pad_token_id=0)
    config = DataLoaderConfig(batch_size=8, shuffle=True, seed=3, num_workers=workers, collate_fn=collator)
    loader = DataLoaderFactory().create_dataloader(shards(folder, tmp_path), config)
    served = [doc for batch in loader for doc in batch["doc"].tolist()]
    assert served == epoch(module(shards(folder, tmp_path)))
    groups = [len({doc // 150 * 4 + doc % 150 // 40 for doc in served[start:start + 64]})
              for start in range(0, 576, 64)]
    assert max(groups) <= 3


@pytest.mark.parametrize("other", [{"shuffle_window": 32}, "full permutation"])
def test_a_plain_loops_state_saved_with_another_shuffle_is_refused(corpus, tmp_path, other):
    """A plain loop's state records its shuffle: loading it into a loader that shuffles otherwise (another window,
    or a full permutation of data without a block order) is refused, naming both, rather than serving other rows
    for the rest of the epoch."""
    from torch.utils.data import TensorDataset

    from collators import CollatorRegistry
    from engine import DataLoaderConfig, DataLoaderFactory

    folder, _ = corpus
    config = DataLoaderConfig(batch_size=8, shuffle=True, seed=3,
                              collate_fn=CollatorRegistry.get_instance().get_collator(SPEC, pad_token_id=0))
    saved = DataLoaderFactory().create_dataloader(shards(folder, tmp_path), config)
    batches = iter(saved)
    next(batches)
    state = saved.state_dict()
    same = DataLoaderFactory().create_dataloader(shards(folder, tmp_path), config)
    same.load_state_dict(state)
    assert [doc for batch in same for doc in batch["doc"].tolist()][:8] == next(batches)["doc"].tolist()
    if other == "full permutation":
        data, message = TensorDataset(torch.arange(600)), r"saved shuffling by blocks with shuffle_window=64, but "
        config = DataLoaderConfig(batch_size=8, shuffle=True, seed=3)
        message += r"this sampler shuffles by a full permutation of the rows"
    else:
        data = shards(folder, tmp_path, **other)
        message = r"blocks with shuffle_window=64, but this sampler shuffles by blocks with shuffle_window=32"
    loader = DataLoaderFactory().create_dataloader(data, config)
    with pytest.raises(ValueError, match=message):
        loader.load_state_dict(state)
        next(iter(loader))
