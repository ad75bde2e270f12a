"""Sharded corpora in Google Cloud Storage and Azure Blob Storage, read through the path a user's ``gs://`` or
``az://`` URL takes (pyarrow's GCS and Azure clients) from gcp-storage-emulator's server and Azurite on 127.0.0.1
(tests/arrow_stores.py). S3 has its own file, with fault injection (test_sharded_s3.py)."""

import multiprocessing
import pickle

import pytest

from engine import Shards, UniversalDataModule
from engine.sources.adapt import as_source
from engine.sources.shards.object_stores import ArrowStore, adlfs_only, azure_options, gcs_options, gcsfs_only
from tests.engine.sources.shards.shard_corpus import SPEC, docs, write_corpus


@pytest.fixture()
def corpus(tmp_path, store_bucket):
    rows = write_corpus(tmp_path / "corpus")
    store_bucket.upload_folder(tmp_path / "corpus", "corpus/")
    return rows


def shards(bucket, tmp_path, **options):
    return Shards(bucket.url("corpus/"), storage_options=bucket.storage_options, cache_dir=str(tmp_path / "cache"),
                  **{"shuffle_window": 64, "retry_wait": 0.01, **options})


def module(data, workers=0):
    return UniversalDataModule(data, task_spec=SPEC, batch_size=8, val_split=0, seed=3, num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corpus_in_the_store_serves_the_batches_of_the_same_files_on_disk(corpus, tmp_path, store_bucket, workers):
    local = docs(module(Shards(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "local"),
                               shuffle_window=64)).train_dataloader())
    remote = module(shards(store_bucket, tmp_path), workers=workers)
    assert isinstance(remote.train_dataloader().dataset.reader.system, ArrowStore)
    assert docs(remote.train_dataloader()) == local
    assert sorted(local) == list(range(600))


def test_a_resumed_run_continues_exactly_and_fetches_nothing_cached(corpus, tmp_path, store_bucket):
    full = docs(module(shards(store_bucket, tmp_path)).train_dataloader())  # fills the cache
    first = module(shards(store_bucket, tmp_path))
    iterator = iter(first.train_dataloader())
    served = docs(next(iterator) for _ in range(40))
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = module(shards(store_bucket, tmp_path))
    resumed.load_state_dict(state)
    loader = resumed.train_dataloader()
    assert served + docs(loader) == full
    stats = loader.dataset.reader.stats
    assert stats["fetched"] == 0 and stats["cache_hits"] > 0


def test_a_shard_replaced_or_deleted_in_the_bucket_is_named(corpus, tmp_path, store_bucket):
    source = as_source(shards(store_bucket, tmp_path))
    store_bucket.put("corpus/part-003.parquet", (tmp_path / "corpus" / "part-003.parquet").read_bytes())  # same bytes
    with pytest.raises(ValueError, match=r"shard '(gs|az)://.*/corpus/part-003.parquet' changed since it was "
                                         r"listed"):
        source.__getitems__([500])
    store_bucket.delete("corpus/part-002.parquet")
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


def test_adlfs_options_are_translated(monkeypatch):
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"):
        monkeypatch.delenv(name, raising=False)
    emulator = "DefaultEndpointsProtocol=http;AccountName=dev;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/dev;"
    assert azure_options({"connection_string": emulator}) == {
        "account_name": "dev", "account_key": "a2V5", "blob_storage_authority": "127.0.0.1:1",
        "blob_storage_scheme": "http", "dfs_storage_authority": "127.0.0.1:1", "dfs_storage_scheme": "http"}
    cloud = "AccountName=acct;AccountKey=a2V5;BlobEndpoint=https://acct.blob.core.windows.net/"
    assert azure_options({"connection_string": cloud}) == {
        "account_name": "acct", "account_key": "a2V5", "blob_storage_authority": ".blob.core.windows.net",
        "blob_storage_scheme": "https"}
    assert azure_options({"account_name": "acct", "sas_token": "sv=1"}) == {"account_name": "acct",
                                                                          "sas_token": "sv=1"}
    assert azure_options({}, account="named") == {"account_name": "named"}  # container@named.dfs... in the URL
    assert azure_options({}) is None  # no account anywhere: adlfs names what is missing
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "env")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    assert azure_options({}) == {"account_name": "env", "account_key": "a2V5"}
    assert adlfs_only({"anon": True, "account_name": "a", "credential": object()}) == ["anon", "credential"]


def test_azure_loader_workers_start_with_forkserver_and_fork_is_refused(corpus, tmp_path, store_bucket):
    """pyarrow's Azure client keeps one pool of connections per process: workers forked after the parent listed the
    shards would share its sockets and read each other's responses. Its loaders start their workers with
    forkserver (same batches), and an explicit 'fork' is refused at construction; other stores keep fork."""
    azure = store_bucket.url("corpus/").startswith("az://")
    dm = module(shards(store_bucket, tmp_path), workers=2)
    loader = dm.train_dataloader()
    assert dm.datasets["train"].fork_safe is not azure
    started = loader.multiprocessing_context
    method = started.get_start_method() if started is not None else multiprocessing.get_start_method()
    assert method == ("forkserver" if azure else "fork")
    if azure:
        forked = UniversalDataModule(shards(store_bucket, tmp_path), task_spec=SPEC, batch_size=8, val_split=0,
                                     seed=3, num_workers=2, multiprocessing_context="fork")
        with pytest.raises(ValueError, match=r"multiprocessing_context='fork' cannot read \['ShardedSource'\]: its "
                                             r"store client keeps one pool of connections per process"):
            forked.train_dataloader()
