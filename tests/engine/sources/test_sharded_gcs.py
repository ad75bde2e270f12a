"""Sharded corpora in Google Cloud Storage, read through the path a user's ``gs://`` URL takes (pyarrow's GCS
client) from gcp-storage-emulator's server on 127.0.0.1 (tests/gcs_server.py)."""

import pickle

import pytest

from engine import Shards, UniversalDataModule
from engine.sources.adapt import as_source
from engine.sources.object_stores import ArrowStore, gcs_options, gcsfs_only
from tests.engine.sources.shard_corpus import SPEC, docs, write_corpus


@pytest.fixture()
def corpus(tmp_path, gcs_bucket):
    rows = write_corpus(tmp_path / "corpus")
    gcs_bucket.upload_folder(tmp_path / "corpus", "corpus/")
    return rows


def shards(bucket, tmp_path, **options):
    return Shards(bucket.url("corpus/"), storage_options=bucket.storage_options, cache_dir=str(tmp_path / "cache"),
                  **{"shuffle_window": 64, "retry_wait": 0.01, **options})


def module(data, workers=0):
    return UniversalDataModule(data, task_spec=SPEC, batch_size=8, val_split=0, seed=3, num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_gcs_corpus_serves_the_batches_of_the_same_files_on_disk(corpus, tmp_path, gcs_bucket, workers):
    local = docs(module(Shards(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "local"),
                               shuffle_window=64)).train_dataloader())
    remote = module(shards(gcs_bucket, tmp_path), workers=workers)
    assert isinstance(remote.train_dataloader().dataset.reader.system, ArrowStore)
    assert docs(remote.train_dataloader()) == local
    assert sorted(local) == list(range(600))


def test_a_resumed_run_continues_exactly_and_fetches_nothing_cached(corpus, tmp_path, gcs_bucket):
    full = docs(module(shards(gcs_bucket, tmp_path)).train_dataloader())  # fills the cache
    first = module(shards(gcs_bucket, tmp_path))
    iterator = iter(first.train_dataloader())
    served = docs(next(iterator) for _ in range(40))
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = module(shards(gcs_bucket, tmp_path))
    resumed.load_state_dict(state)
    loader = resumed.train_dataloader()
    assert served + docs(loader) == full
    stats = loader.dataset.reader.stats
    assert stats["fetched"] == 0 and stats["cache_hits"] > 0


def test_a_shard_replaced_or_deleted_in_the_bucket_is_named(corpus, tmp_path, gcs_bucket):
    source = as_source(shards(gcs_bucket, tmp_path))
    gcs_bucket.put("corpus/part-003.parquet", (tmp_path / "corpus" / "part-003.parquet").read_bytes())  # same bytes
    with pytest.raises(ValueError, match=r"shard 'gs://.*/corpus/part-003.parquet' changed since it was listed"):
        source.__getitems__([500])
    gcs_bucket.delete("corpus/part-002.parquet")
    with pytest.raises(FileNotFoundError, match=r"part-002.parquet' was listed but no longer exists"):
        source.__getitems__([300])


def test_gcsfs_options_are_translated(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert gcs_options({"token": "anon", "project": "p", "endpoint_url": "http://127.0.0.1:9023",
                        "default_location": "EU"}) == {
        "anonymous": True, "project_id": "p", "endpoint_override": "127.0.0.1:9023", "scheme": "http",
        "default_bucket_location": "EU"}
    assert gcs_options({}) == {} and gcs_options({"token": "google_default"}) == {}
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:1")  # gcsfs's variable, read the same way
    assert gcs_options({})["endpoint_override"] == "127.0.0.1:1"
    assert gcsfs_only({"token": "/path/to/key.json", "requester_pays": True}) == ["requester_pays", "token"]
    assert gcs_options({"token": {"client_email": "x"}}) is None
