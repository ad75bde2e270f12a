"""Sharded corpora in object storage, read through the path a user's ``s3://`` URL takes from moto's S3 server on
127.0.0.1, through both clients: pyarrow's (plain options: credentials, endpoint, region) and s3fs (options only
s3fs takes); faults (5xx, throttling, a connection cut part-way, a slow answer) injected by a proxy in front of it
(tests/object_store.py)."""

import pickle

import pyarrow.parquet as pq
import pytest

from engine import Shards, UniversalDataModule
from engine.sources.adapt import as_source
from engine.sources.shards.object_stores import ArrowStore
from tests.engine.sources.shards.shard_corpus import SPEC, docs, write_corpus


@pytest.fixture(params=["pyarrow", "s3fs"])
def client(request):
    """Which S3 client reads the shards: the storage options choose it."""
    return request.param


def options_for(client, bucket_or_proxy):
    """The test store's s3fs options (which pyarrow's client cannot take), or the plain ones it can."""
    options = bucket_or_proxy.storage_options
    if client == "s3fs":
        return options
    return {"key": options["key"], "secret": options["secret"], "client_kwargs": options["client_kwargs"]}


@pytest.fixture()
def corpus(tmp_path, s3_bucket):
    rows = write_corpus(tmp_path / "corpus")
    s3_bucket.upload_folder(tmp_path / "corpus", "corpus/")
    return rows


def shards(bucket_or_proxy, bucket, tmp_path, client, **options):
    return Shards(bucket.url("corpus/"), storage_options=options_for(client, bucket_or_proxy),
                  cache_dir=str(tmp_path / "cache"), **{"shuffle_window": 64, "retry_wait": 0.01, **options})


def module(data, workers=0, **options):
    return UniversalDataModule(data, task_spec=SPEC, batch_size=8, val_split=0, seed=3, num_workers=workers,
                               **options)


def test_an_s3_corpus_serves_the_batches_of_the_same_files_on_disk(corpus, tmp_path, s3_bucket, client):
    local = docs(module(Shards(str(tmp_path / "corpus"), cache_dir=str(tmp_path / "local"),
                               shuffle_window=64)).train_dataloader())
    remote = module(shards(s3_bucket, s3_bucket, tmp_path, client), workers=2)
    assert docs(remote.train_dataloader()) == local
    assert sorted(local) == list(range(600))


def test_a_resumed_run_continues_exactly_and_fetches_nothing_cached(corpus, tmp_path, s3_bucket, client, faulty_s3):
    full = docs(module(shards(s3_bucket, s3_bucket, tmp_path, client)).train_dataloader())  # fills the cache
    first = module(shards(faulty_s3, s3_bucket, tmp_path, client))
    iterator = iter(first.train_dataloader())
    served = docs(next(iterator) for _ in range(40))
    state = pickle.loads(pickle.dumps(first.state_dict()))
    faulty_s3.reset()
    resumed = module(shards(faulty_s3, s3_bucket, tmp_path, client), workers=2)
    resumed.load_state_dict(state)
    assert served + docs(resumed.train_dataloader()) == full
    ranged = [request for request in faulty_s3.requests if request.method == "GET" and request.range]
    footers = 4  # the listing of the resumed module reads each shard's footer; no row group is fetched again
    assert len({request.path for request in ranged}) <= footers
    assert all(request.range and "-" in request.range for request in ranged)


@pytest.mark.parametrize(("fault", "options"), [("fail", {"status": 503}), ("fail", {"status": 500}),
                                                ("fail", {"status": 429}), ("cut", {"after_bytes": 100}),
                                                ("delay", {"seconds": 0.5})])
def test_a_transient_failure_is_retried_and_counted_and_nothing_is_lost(corpus, tmp_path, s3_bucket, client,
                                                                         faulty_s3, fault, options):
    source = as_source(shards(faulty_s3, s3_bucket, tmp_path, client))  # the listing reads the footers first
    faulty_s3.reset()
    plan = {"fail": faulty_s3.fail_next, "cut": faulty_s3.cut_next, "delay": faulty_s3.delay_next}[fault]
    plan(1, match="part-002", method="GET", **options)
    rows = source.__getitems__(list(range(300, 340)))
    assert [row["doc"] for row in rows] == list(range(300, 340))
    assert source.reader.stats["retries"] == (0 if fault == "delay" else 1)
    assert faulty_s3.pending == 0 and len(faulty_s3.faults) == 1


def test_a_persistent_failure_names_the_shard_and_the_attempts(corpus, tmp_path, s3_bucket, client, faulty_s3):
    source = as_source(shards(faulty_s3, s3_bucket, tmp_path, client, retries=2))
    faulty_s3.reset()
    faulty_s3.fail_next(50, status=503, match="part-001", method="GET")
    with pytest.raises(OSError, match=r"row group 0 of shard 's3://.*/corpus/part-001.parquet' failed 3 times "
                                      r"\(retries=2\)"):
        source.__getitems__([150])
    assert source.reader.stats["retries"] == 2


def test_a_shard_replaced_or_deleted_in_the_store_is_named(corpus, tmp_path, s3_bucket, client):
    source = as_source(shards(s3_bucket, s3_bucket, tmp_path, client))
    s3_bucket.replace("corpus/part-003.parquet", (tmp_path / "corpus" / "part-000.parquet").read_bytes())
    with pytest.raises(ValueError, match=r"shard 's3://.*/corpus/part-003.parquet' changed since it was listed"):
        source.__getitems__([500])
    s3_bucket.delete("corpus/part-002.parquet")
    with pytest.raises(FileNotFoundError, match=r"part-002.parquet' was listed but no longer exists"):
        source.__getitems__([300])


def test_a_bare_s3_url_is_read_as_shards(corpus, tmp_path, s3_bucket, monkeypatch):
    """A URL given as data needs no wrapper; its store's options come from the environment, as botocore reads
    them (here: the test server's endpoint), and pyarrow's client reads it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_bucket.storage_options["client_kwargs"]["endpoint_url"])
    source = as_source(s3_bucket.url("corpus/"))
    assert isinstance(source.reader.system, ArrowStore)
    assert len(source) == 600
    assert pq.read_schema(tmp_path / "corpus" / "part-000.parquet").names == source.column_names


@pytest.mark.parametrize("workers", [0, 2])
def test_the_report_shows_the_retries_of_a_faulty_store(corpus, tmp_path, s3_bucket, client, faulty_s3, workers):
    """The reader's counts reach ``dm.report()``: this process's, and those loader workers send back."""
    dm = module(shards(faulty_s3, s3_bucket, tmp_path, client), workers=workers)  # the listing reads the footers
    faulty_s3.reset()
    faulty_s3.fail_next(2, status=503, match="part-001", method="GET")
    assert sorted(docs(dm.train_dataloader())) == list(range(600))
    assert faulty_s3.pending == 0
    report = dm.report()
    reads = report.numbers["shards"]["train"]
    assert (reads["shards"], reads["row_groups"], reads["rows"]) == (4, 16, 600)
    here, there = ("process", "workers") if workers == 0 else ("workers", "process")
    assert reads[here]["retries"] == 2 and reads[there]["retries"] == 0
    assert reads[here]["fetched"] + reads[here]["cache_hits"] >= 16 and reads[here]["bytes_fetched"] > 0
    line = next(line for line in str(report).splitlines() if "shards train" in line)
    assert "shards train: 4 shards, 16 row groups, 600 rows" in line
    own, theirs = line.split("of its loader workers")
    assert ("retries=2" in own, "retries=2" in theirs) == (workers == 0, workers == 2)
    assert "retries=2" in report._repr_html_()


def test_a_readers_s3fs_client_reuses_the_service_models_the_listing_parsed(corpus, tmp_path, s3_bucket):
    """Each process's reader (the loader workers' included) makes its own s3fs filesystem; its session takes
    botocore's parsed service models from the listing's rather than parsing them again before its first fetch."""
    from engine.sources.shards.filesystems import filesystem
    from engine.sources.shards.listing import list_shards

    listing = list_shards(shards(s3_bucket, s3_bucket, tmp_path, "s3fs"))
    listed, _ = filesystem(listing.shards)
    reader, _ = filesystem(listing.shards, own_retries=True)
    assert reader is not listed
    assert reader.session.get_component("data_loader") is listed.session.get_component("data_loader")
    assert reader.info(listing.files[0])["size"] == listing.sizes[0]  # the session it was given connects


def test_the_storage_options_choose_the_client(corpus, tmp_path, s3_bucket, client):
    """Options pyarrow's client can take (credentials, endpoint, region) read through it; an option only s3fs
    has (here ``use_listings_cache`` with ``config_kwargs={"user_agent_extra": ...}``) reads through s3fs."""
    import s3fs

    source = as_source(shards(s3_bucket, s3_bucket, tmp_path, client))
    assert isinstance(source.reader.system, ArrowStore if client == "pyarrow" else s3fs.S3FileSystem)
    assert source.__getitems__([599])[0]["doc"] == 599


def test_a_403_on_a_fetch_names_the_shard_and_the_fix(corpus, tmp_path, s3_bucket, client, faulty_s3):
    source = as_source(shards(faulty_s3, s3_bucket, tmp_path, client))
    faulty_s3.reset()
    faulty_s3.fail_next(5, status=403, match="part-001", method="GET")
    with pytest.raises(OSError, match=r"(?s)row group 0 of shard 's3://.*/corpus/part-001.parquet' failed, and "
                                      r"another attempt cannot change it: check the store's credentials and "
                                      r"permissions \(HTTP 403\)"):
        source.__getitems__([150])
    assert source.reader.stats["retries"] == 0


def test_a_listing_that_fails_names_the_url_and_the_fix(corpus, tmp_path, s3_bucket, client, faulty_s3):
    faulty_s3.fail_next(20, status=403, method="GET")
    with pytest.raises(OSError, match=r"(?s)listing \['s3://.*/corpus/'\] failed: check the URL, the store's "
                                      r"credentials"):
        as_source(shards(faulty_s3, s3_bucket, tmp_path, client))


def test_an_endpoint_that_never_answers_fails_in_bounded_time(tmp_path, client, monkeypatch):
    """It accepts connections and sends nothing: botocore's timeouts (60 s each, retried by botocore and s3fs)
    held s3fs's listing for minutes; the reader's s3fs client now has its own, and pyarrow's client its SDK's."""
    import socket
    import threading
    import time

    monkeypatch.setattr("engine.sources.shards.filesystems.S3FS_TIMEOUTS", {"connect_timeout": 1, "read_timeout": 1},
                        raising=False)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    held = []
    threading.Thread(target=lambda: [held.append(silent.accept()) for _ in iter(int, 1)], daemon=True).start()
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{silent.getsockname()[1]}",
                                 "region_name": "us-east-1"}}
    if client == "s3fs":
        options["config_kwargs"] = {"user_agent_extra": "silent"}  # an option only s3fs takes
    outcome = []

    def listing():
        try:
            as_source(Shards("s3://bucket/corpus/", storage_options=options, cache_dir=str(tmp_path / "cache")))
        except Exception as error:
            outcome.append(error)

    started = time.monotonic()
    thread = threading.Thread(target=listing, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the listing of an endpoint that never answers did not end within 60 s"
    assert time.monotonic() - started < 60
    assert outcome and "listing ['s3://bucket/corpus/'] failed" in str(outcome[0])
    silent.close()


def test_the_retries_of_config_kwargs_work_on_the_pyarrow_path(corpus, tmp_path, s3_bucket):
    options = {**options_for("pyarrow", s3_bucket), "config_kwargs": {"retries": {"max_attempts": 3}}}
    source = as_source(Shards(s3_bucket.url("corpus/"), storage_options=options, cache_dir=str(tmp_path / "c")))
    assert isinstance(source.reader.system, ArrowStore)
    assert source.__getitems__([599])[0]["doc"] == 599


def test_the_s3fs_readers_botocore_retries_are_off_so_every_retry_is_counted(corpus, tmp_path, s3_bucket,
                                                                              faulty_s3):
    options = dict(faulty_s3.storage_options)
    options["config_kwargs"] = {key: value for key, value in options["config_kwargs"].items() if key != "retries"}
    source = as_source(Shards(s3_bucket.url("corpus/"), storage_options=options, cache_dir=str(tmp_path / "c"),
                              retry_wait=0.01))
    faulty_s3.reset()
    faulty_s3.fail_next(1, status=500, match="part-002", method="GET")
    assert source.__getitems__([300])[0]["doc"] == 300
    assert source.reader.stats["retries"] == 1
    assert len([request for request in faulty_s3.requests if "part-002" in request.path and
                request.method == "GET"]) == 2


@pytest.mark.parametrize("kind", ["arrow", "stream"])
def test_arrow_ipc_shards_in_the_store_are_listed_from_metadata_and_read_by_offset(tmp_path, s3_bucket, client,
                                                                                   faulty_s3, kind):
    rows = write_corpus(tmp_path / "ipc", kind=kind)
    s3_bucket.upload_folder(tmp_path / "ipc", "ipc/")
    faulty_s3.reset()
    source = as_source(Shards(s3_bucket.url("ipc/"), storage_options=options_for(client, faulty_s3),
                              cache_dir=str(tmp_path / "cache")))
    size = sum(path.stat().st_size for path in (tmp_path / "ipc").iterdir())
    ranges = [request.range for request in faulty_s3.requests if request.method == "GET" and request.range]
    read = sum(int(end) - int(start) + 1 for start, end in (r.split("=")[1].split("-") for r in ranges))
    if client == "pyarrow" and kind == "arrow":  # ranged reads of exactly what is asked: no batch's body
        assert read < size / 3
    picked = [599, 0, 41, 40, 333, 150, 130]
    assert [row["input_ids"] for row in source.__getitems__(picked)] == [rows[i] for i in picked]
