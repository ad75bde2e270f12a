"""Image-text shards through ``Shards``: WebDataset tars (checked against ``webdataset`` reading the same tars) and
Parquet shards of ``datasets``' ``Image`` struct, local and on moto's S3 server; seeded batches at any worker count,
exact resume, samples cut short and corrupt images named by shard and key."""

import io
import pickle
import tarfile

import pytest

from engine import Shards, UniversalDataModule
from engine.sources.shards import listing as shard_listing
from engine.sources.shards import tars
from engine.sources.shards.source import ShardedSource
from tests.engine.sources.shards.image_text import (
    SPEC,
    DecodeImages,
    samples,
    served,
    write_image_parquet,
    write_tars,
)
from tests.engine.sources.test_bad_rows import no_hang


def shards(url, tmp_path, **options):
    return Shards(str(url), cache_dir=str(tmp_path / "cache"), **{"shuffle_window": 64, **options})


def module(data, workers=0, **options):
    return UniversalDataModule(data, task_spec=SPEC, batch_size=8, val_split=0, seed=3, num_workers=workers,
                               collate_fn=DecodeImages(), **options)


def epoch(dm):
    with no_hang(180):
        return served(dm.train_dataloader())


def test_tar_rows_are_the_samples_webdataset_reads(tmp_path):
    import webdataset

    folder = write_tars(tmp_path / "wds")
    urls = sorted(str(path) for path in folder.glob("*.tar"))
    theirs = list(webdataset.WebDataset(urls, shardshuffle=False))
    source = ShardedSource.from_shards(shards(folder, tmp_path))
    ours = source.__getitems__(list(range(len(source))))
    assert len(ours) == len(theirs) == 300
    for row, sample in zip(ours, theirs):
        assert row["__key__"] == sample["__key__"]
        assert row["image"] == sample["png"]
        assert row["text"] == sample["txt"].decode()
        assert row["json"] == sample["json"].decode()
        assert row["label"] == int(sample["cls"])


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_members_are_grouped_by_the_key_before_the_first_dot_as_webdataset_does(tmp_path):
    import webdataset

    path = tmp_path / "corpus" / "part.tar"
    path.parent.mkdir()
    with tarfile.open(path, "w") as tar:
        for name, data in [("photos/a.seg.png", b"mask"), ("photos/a.jpg", b"jpeg-bytes"), ("photos/a.txt", b"x"),
                           ("c.png", b"png-bytes"), ("c.txt", b"y")]:
            add(tar, name, data)
    rows = ShardedSource.from_shards(shards(path.parent, tmp_path)).__getitems__([0, 1])
    theirs = list(webdataset.WebDataset(str(path), shardshuffle=False))
    assert [row["__key__"] for row in rows] == [sample["__key__"] for sample in theirs] == ["photos/a", "c"]
    assert theirs[0]["seg.png"] == b"mask"
    assert rows[0]["image"] == b"jpeg-bytes" and rows[0]["seg.png"] == b"mask" and rows[0]["text"] == "x"
    assert rows[1]["image"] == b"png-bytes" and rows[1]["seg.png"] is None


@pytest.mark.parametrize("group_rows", [256, 16])
def test_the_same_batches_at_any_worker_count_and_exact_resume(tmp_path, monkeypatch, group_rows):
    monkeypatch.setattr(tars, "TAR_GROUP_ROWS", group_rows)  # 16: each tar read in 7 ranged reads, not one
    folder = write_tars(tmp_path / "wds")
    assert ShardedSource.from_shards(shards(folder, tmp_path)).listing.num_groups == 3 * -(-100 // group_rows)
    full = epoch(module(shards(folder, tmp_path)))
    assert sorted(full) == list(range(300))
    assert epoch(module(shards(folder, tmp_path), workers=2, multiprocessing_context="fork")) == full
    first = module(shards(folder, tmp_path))
    iterator = iter(first.train_dataloader())
    before = served(next(iterator) for _ in range(11))
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = module(shards(folder, tmp_path), workers=2, multiprocessing_context="fork")
    resumed.load_state_dict(state)
    assert before + epoch(resumed) == full


def test_parquet_shards_of_image_structs_serve_every_row(tmp_path):
    folder = write_image_parquet(tmp_path / "parquet")
    rows = ShardedSource.from_shards(shards(folder, tmp_path)).__getitems__([5])
    assert set(rows[0]["image"]) == {"bytes", "path"} and rows[0]["image"]["path"] == "sample00005.png"
    full = epoch(module(shards(folder, tmp_path)))
    assert sorted(full) == list(range(300))
    assert epoch(module(shards(folder, tmp_path), workers=2, multiprocessing_context="fork")) == full


def test_a_sample_cut_short_by_the_tar_s_end_is_named_and_can_be_left_out(tmp_path):
    folder = write_tars(tmp_path / "wds", files=2)
    path = folder / "shard-00001.tar"
    with tarfile.open(path) as tar:
        last = tar.getmember("sample00199.png")  # the last sample's image
    path.write_bytes(path.read_bytes()[:last.offset_data + last.size // 2])
    with pytest.raises(OSError, match=r"'sample00199.png' of sample 'sample00199' in shard '.*shard-00001.tar' is "
                                      r"cut short"):
        epoch(module(shards(folder, tmp_path)))
    dm = module(shards(folder, tmp_path), on_error="skip")
    assert sorted(epoch(dm)) == list(range(199))
    (record,) = dm.skipped.records
    assert record.index == 199 and "cut short" in record.message and "shard-00001.tar" in record.message


@pytest.mark.parametrize("write", [write_tars, write_image_parquet])
def test_a_corrupt_image_is_left_out_where_it_is_decoded_naming_its_shard_and_key(tmp_path, write):
    folder = write(tmp_path / "data", corrupt=123)
    with pytest.raises(RuntimeError, match=r"collating the batch of rows \[.*\b123\b.*\] of the train data failed"):
        epoch(module(shards(folder, tmp_path)))
    for workers in (0, 2):
        dm = module(shards(folder, tmp_path), workers=workers, on_error="skip")
        assert sorted(epoch(dm)) == [doc for doc in range(300) if doc != 123]
        (record,) = dm.skipped.records
        where = ("shard-00001.tar' key 'sample00123'" if write is write_tars
                 else "part-001.parquet' row 23 of row group 0")
        assert record.index == 123 and f"shard '{folder}/{where}" in record.message


def test_a_sample_with_two_images_is_refused_at_listing(tmp_path):
    path = tmp_path / "corpus" / "part.tar"
    path.parent.mkdir()
    with tarfile.open(path, "w") as tar:
        add(tar, "a.jpg", b"1")
        add(tar, "a.png", b"2")
    with pytest.raises(ValueError, match=r"sample 'a' of shard .* holds two members for its 'image' column"):
        ShardedSource.from_shards(shards(path.parent, tmp_path))


def test_a_tar_is_indexed_once_per_process(tmp_path, monkeypatch):
    folder = write_tars(tmp_path / "wds", files=1)
    first = ShardedSource.from_shards(shards(folder, tmp_path))
    monkeypatch.setattr(tars, "index_tar", lambda *args: pytest.fail("the tar was indexed again"))
    again = ShardedSource.from_shards(shards(folder, tmp_path))
    assert again.listing.fingerprint() == first.listing.fingerprint()
    assert shard_listing.TAR_INDEXES


def test_tars_on_s3_serve_the_batches_of_the_same_tars_on_disk(tmp_path, s3_bucket):
    folder = write_tars(tmp_path / "wds")
    s3_bucket.upload_folder(folder, "wds/")
    options = s3_bucket.storage_options
    local = epoch(module(shards(folder, tmp_path / "local")))
    for client_options in ({key: options[key] for key in ("key", "secret", "client_kwargs")}, options):
        remote = Shards(s3_bucket.url("wds/"), storage_options=client_options, cache_dir=str(tmp_path / "remote"),
                        shuffle_window=64, retry_wait=0.01)
        assert epoch(module(remote, workers=2, multiprocessing_context="fork")) == local


class ImagesOrText:
    """A collator for a mixture of image-text and text-only rows: which rows hold an image, and their text."""

    def __call__(self, rows):
        import torch

        return {"image": torch.tensor([row.get("image") is not None for row in rows]),
                "text": [row["text"] for row in rows]}


def test_a_mixture_of_image_text_tars_and_text_only_rows_serves_both_and_resumes_exactly(tmp_path):
    import datasets
    import webdataset

    folder = tmp_path / "pairs"
    folder.mkdir()
    with webdataset.TarWriter(str(folder / "shard-00000.tar")) as writer:
        for sample in samples(0, 40):
            writer.write({"__key__": sample["__key__"], "png": sample["png"], "txt": sample["txt"]})
    words = datasets.Dataset.from_dict({"text": [f"only words {doc}" for doc in range(40)]})

    def mixed():
        return UniversalDataModule({"pairs": shards(folder, tmp_path), "words": words},
                                   mix={"pairs": 0.5, "words": 0.5}, batch_size=8, val_split=0, seed=2,
                                   collate_fn=ImagesOrText())

    def texts(batches):
        return [text for batch in batches for text in batch["text"]]

    with no_hang(120):
        full = list(mixed().train_dataloader())
        first = mixed()
        iterator = iter(first.train_dataloader())
        before = [next(iterator) for _ in range(3)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        resumed = mixed()
        resumed.load_state_dict(state)
        after = list(resumed.train_dataloader())
    assert texts(before + after) == texts(full)
    pictures = sum(int(batch["image"].sum()) for batch in full)
    assert 0 < pictures < len(texts(full))
    assert all(text.startswith("a picture") == bool(has) for batch in full
               for text, has in zip(batch["text"], batch["image"]))


def test_tars_feed_the_vision_language_collator_the_same_batches_at_any_worker_count(tmp_path):
    from demo.sample_data import build_tokenizer
    from task_spec import TaskSpec

    folder = write_tars(tmp_path / "wds", files=2, per_file=40)
    tokenizer = build_tokenizer()

    def batches(workers):
        dm = UniversalDataModule(shards(folder, tmp_path), task_spec=TaskSpec.vlm_tiny(), tokenizer=tokenizer,
                                 batch_size=8, val_split=0, seed=1, num_workers=workers,
                                 multiprocessing_context="fork")
        with no_hang(120):
            return list(dm.train_dataloader())

    first, again = batches(0), batches(2)
    assert first[0]["pixel_values"].shape == (8, 3, 32, 32) and first[0]["labels"].shape == first[0]["input_ids"].shape
    assert sorted(key for batch in first for key in batch["__key__"]) == [f"sample{doc:05d}" for doc in range(80)]
    for one, other in zip(first, again, strict=True):
        assert all(bool((one[key] == other[key]).all()) for key in ("input_ids", "labels", "pixel_values"))
