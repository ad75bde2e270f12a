"""pyarrow's S3 client as the shards' store: which ``storage_options`` it takes and how, how its errors are sorted
into transient and lasting, and its listing calls against moto's S3 server, compared with s3fs's on the same
bucket."""

import importlib
import sys

import pytest

from engine import Shards
from engine.sources.shards.filesystems import filesystem
from engine.sources.shards.object_stores import ArrowStore, arrow_options, arrow_transient, s3_store, s3fs_only
from tests.object_store import s3_filesystem

ENDPOINT = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}}


@pytest.mark.parametrize(("given", "expected"), [
    ({}, {}),
    ({"key": "k", "secret": "s", "token": "t"}, {"access_key": "k", "secret_key": "s", "session_token": "t"}),
    ({"client_kwargs": {"aws_access_key_id": "k", "aws_secret_access_key": "s"}},
     {"access_key": "k", "secret_key": "s"}),
    ({"anon": True}, {"anonymous": True}),
    (ENDPOINT, {"endpoint_override": "127.0.0.1:9000", "scheme": "http", "region": "eu-west-1"}),
    ({"endpoint_url": "https://storage.example.com/"}, {"endpoint_override": "storage.example.com",
                                                       "scheme": "https"}),
    ({"endpoint_url": "storage.example.com:9000"}, {"endpoint_override": "storage.example.com:9000",
                                                   "scheme": "https"}),
    ({"config_kwargs": {"connect_timeout": 2, "read_timeout": 30, "s3": {"addressing_style": "path"}}},
     {"connect_timeout": 2.0, "request_timeout": 30.0, "force_virtual_addressing": False}),
    ({"config_kwargs": {"retries": {"total_max_attempts": 4}}}, {"retries": 3}),
    ({"config_kwargs": {"retries": {"max_attempts": 4, "mode": "standard"}}}, {"retries": 4}),
    ({"use_listings_cache": False}, {}),
])
def test_s3fs_options_are_translated(given, expected, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert arrow_options(given) == expected


@pytest.mark.parametrize("given", [
    {"profile": "dev"}, {"requester_pays": True}, {"client_kwargs": {"verify": False}},
    {"config_kwargs": {"user_agent_extra": "x"}}, {"config_kwargs": {"s3": {"use_accelerate_endpoint": True}}},
    {"config_kwargs": {"retries": {"max_attempts": 3, "adaptive": True}}}, {"default_block_size": 2**20},
])
def test_an_option_only_s3fs_has_leaves_the_url_to_s3fs(given):
    assert arrow_options(given) is None


def test_the_endpoint_comes_from_botocores_variables_when_not_given(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert arrow_options({})["endpoint_override"] == "127.0.0.1:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2")
    assert arrow_options({})["endpoint_override"] == "127.0.0.1:2"
    assert arrow_options(ENDPOINT)["endpoint_override"] == "127.0.0.1:9000"


@pytest.mark.parametrize(("text", "transient"), [
    ("AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.", True),
    ("AWS Error INTERNAL_FAILURE during GetObject operation: We encountered an internal error.", True),
    ("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 18, Transferred a partial file", True),
    ("AWS Error UNKNOWN (HTTP status 429) during GetObject operation: Unable to parse ExceptionName", True),
    ("When reading information for key 'k' in bucket 'b': AWS Error UNKNOWN (HTTP status 503) during HeadObject "
     "operation: No response body.", True),
    ("AWS Error UNKNOWN (HTTP status 400) during HeadObject operation: No response body.", False),
    ("AWS Error ACCESS_DENIED during GetObject operation: Access Denied", False),
    ("AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2 operation: The key does not exist", False),
    ("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation: The bucket does not exist", False),
    ("google::cloud::Status(UNAVAILABLE: Retry policy exhausted in ReadObjectNotWrapped: ...)", True),
    ("google::cloud::Status(RESOURCE_EXHAUSTED: Permanent error in GetObjectMetadata: rate limit)", True),
    ("google::cloud::Status(PERMISSION_DENIED: Permanent error in GetObjectMetadata: ...)", False),
    ("google::cloud::Status(NOT_FOUND: Permanent error in ListObjects: bucket not found)", False),
])
def test_pyarrow_errors_are_sorted_by_the_aws_or_gcs_error_they_name(text, transient):
    assert arrow_transient(OSError(text)) is transient


def test_other_errors_are_not_pyarrows_to_sort():
    assert arrow_transient(OSError("Connection reset by peer")) is None


def test_listing_matches_s3fs_on_the_same_bucket(s3_bucket):
    for key in ("x/a.parquet", "x/y/b.parquet", "xz.parquet", "x/c.txt"):
        s3_bucket.put(key, b"0123456789")
    options = s3_bucket.storage_options
    arrow = s3_store(arrow_options({key: options[key] for key in ("key", "secret", "client_kwargs")}),
                     s3_bucket.name, retries=0)
    s3fs = s3_filesystem(options)
    base = s3_bucket.url("")[len("s3://"):]
    for path in ("x", "x/", "x/a.parquet", "xz.parquet", "nothing", "x/y"):
        assert arrow.find(base + path) == sorted(s3fs.find(base + path)), path
    for pattern in ("x/*.parquet", "x/**/*.parquet", "*.parquet", "x/*"):
        files = sorted(path for path in s3fs.glob(base + pattern) if s3fs.isfile(path))  # the files it matches
        assert arrow.glob(base + pattern) == files, pattern
    assert arrow.exists(base + "x/") and arrow.exists(base + "xz.parquet") and not arrow.exists(base + "nothing")
    info = arrow.info(base + "x/a.parquet")
    assert (info["size"], info["ETag"]) == (10, s3fs.info(base + "x/a.parquet")["ETag"])
    assert arrow.cat_file(base + "x/a.parquet", start=2, end=5) == b"234"
    with pytest.raises(FileNotFoundError):
        arrow.info(base + "nothing")


def test_the_options_pyarrow_cannot_take_are_named():
    assert s3fs_only({"key": "k", "profile": "dev", "client_kwargs": {"region_name": "r", "verify": False},
                      "config_kwargs": {"s3": {"addressing_style": "path", "payload_signing_enabled": False}}}) == [
        "profile", "client_kwargs.verify", "config_kwargs.s3.payload_signing_enabled"]


def test_without_s3fs_the_options_that_need_it_are_named(monkeypatch):
    registry = importlib.import_module("fsspec.registry")._registry  # the module, not fsspec's `registry` view
    monkeypatch.setitem(sys.modules, "s3fs", None)  # s3fs not installed
    monkeypatch.delitem(registry, "s3", raising=False)  # nor imported before
    with pytest.raises(ImportError, match=r"storage options \['profile'\] have no equivalent in pyarrow's S3 client, "
                                          r"so they need s3fs: pip install 'universal-datamodule\[s3\]'"):
        filesystem(Shards("s3://bucket/corpus/", storage_options={"profile": "dev"}))
    plain = Shards("s3://bucket/corpus/", storage_options={"anon": True, **ENDPOINT})
    assert isinstance(filesystem(plain)[0], ArrowStore)  # plain options need no s3fs
