"""The object-store fixtures work through s3fs/fsspec as a user's ``s3://`` URL would, and each fault of the proxy
does what tests/object_store.py says: which layer retries what, and which exception reaches the caller."""

from __future__ import annotations

import errno
import io
import os
import socket

import pytest

fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import aiohttp  # noqa: E402
from aiobotocore.response import AioReadTimeoutError  # noqa: E402
from botocore.exceptions import ClientError, ReadTimeoutError  # noqa: E402
from fsspec.exceptions import FSTimeoutError  # noqa: E402

from tests.object_store import ERROR_CODES, FaultProxy, Request, S3Server, s3_filesystem  # noqa: E402

ROWS, ROWS_PER_GROUP = 400, 100


def parquet_bytes(offset: int = 0) -> bytes:
    table = pa.table({"x": list(range(offset, offset + ROWS)), "s": [f"row {i}" for i in range(ROWS)]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=ROWS_PER_GROUP)
    return buffer.getvalue()


def read_group(fs, url: str, group: int = 2) -> list[int]:
    with fs.open(url, "rb") as f:
        return pq.ParquetFile(f).read_row_group(group).column("x").to_pylist()


def gets(proxy: FaultProxy, key: str) -> list[Request]:
    return [r for r in proxy.requests if r.method == "GET" and r.path.endswith(key)]


@pytest.fixture
def shard(s3_bucket, tmp_path):
    """A Parquet file of 4 row groups in a fresh bucket; returns its URL."""
    path = tmp_path / "part-0.parquet"
    path.write_bytes(parquet_bytes())
    return s3_bucket.upload(path, "shards/part-0.parquet")


class TestServer:
    def test_parquet_round_trip_through_fsspec(self, s3_bucket, shard):
        fs, path = fsspec.core.url_to_fs(shard, **s3_bucket.storage_options)
        assert type(fs).__name__ == "S3FileSystem" and path == f"{s3_bucket.name}/shards/part-0.parquet"
        with fs.open(path) as f:
            parquet = pq.ParquetFile(f)
            assert parquet.metadata.num_row_groups == ROWS // ROWS_PER_GROUP
            assert parquet.read_row_group(2).column("x").to_pylist() == list(range(200, 300))
        with fsspec.open(shard, "rb", **s3_bucket.storage_options) as f:
            assert pq.read_table(f).num_rows == ROWS

    def test_folder_replace_delete(self, s3_bucket, tmp_path):
        for i in range(3):
            (tmp_path / "data" / "sub").mkdir(parents=True, exist_ok=True)
            (tmp_path / "data" / ("sub" if i else "") / f"part-{i}.parquet").write_bytes(parquet_bytes(i))
        urls = s3_bucket.upload_folder(tmp_path / "data", "run/")
        assert urls == [s3_bucket.url(k) for k in
                        ["run/part-0.parquet", "run/sub/part-1.parquet", "run/sub/part-2.parquet"]]
        fs, _ = fsspec.core.url_to_fs(urls[0], **s3_bucket.storage_options)
        assert sorted(fs.glob(f"{s3_bucket.name}/run/**/*.parquet")) == [u.removeprefix("s3://") for u in urls]

        old = fs.info(urls[0])["ETag"]
        new = s3_bucket.replace("run/part-0.parquet", parquet_bytes(1000))
        assert new != old and fs.info(urls[0])["ETag"] == new  # no cached listing or stale size
        assert read_group(fs, urls[0], 0)[0] == 1000
        with pytest.raises(ValueError, match="did not change"):
            s3_bucket.replace("run/part-0.parquet", parquet_bytes(1000))

        s3_bucket.delete("run/sub/part-1.parquet")
        assert not fs.exists(urls[1])
        assert len(fs.ls(f"{s3_bucket.name}/run/sub")) == 1
        with pytest.raises(FileNotFoundError):
            fs.open(urls[1], "rb")

    def test_fresh_bucket_per_test_and_default_bucket(self, s3_server, s3_bucket):
        assert s3_bucket.keys() == [] and s3_bucket.name != s3_server.bucket.name
        s3_server.put("a/b.bin", b"payload")
        fs = s3_filesystem(s3_server.storage_options)
        assert fs.cat_file(s3_server.url("a/b.bin")) == b"payload"

    def test_host_environment_hidden_then_restored(self, monkeypatch):
        monkeypatch.setenv("AWS_PROFILE", "a-profile-of-the-host")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "HOSTKEY")
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
        with S3Server() as server:
            assert "AWS_PROFILE" not in os.environ and os.environ["AWS_ACCESS_KEY_ID"] == "testing"
            server.put("k", b"v")
            assert s3_filesystem(server.storage_options).cat_file(server.url("k")) == b"v"
        assert os.environ["AWS_PROFILE"] == "a-profile-of-the-host" and os.environ["AWS_ACCESS_KEY_ID"] == "HOSTKEY"
        assert "AWS_SESSION_TOKEN" not in os.environ and os.environ["HTTPS_PROXY"] == "http://127.0.0.1:9"


class TestProxy:
    def test_passes_everything_through_and_logs(self, faulty_s3, shard, s3_bucket):
        fs = s3_filesystem(faulty_s3.storage_options)
        assert read_group(fs, shard) == list(range(200, 300))
        (get,) = gets(faulty_s3, "part-0.parquet")
        assert get.status == 206 and get.range.startswith("bytes=0-")  # s3fs reads a whole small file in one block
        assert fs.cat_file(shard, start=10, end=20) == parquet_bytes()[10:20]
        assert gets(faulty_s3, "part-0.parquet")[-1] == ("GET", get.path, "bytes=10-19", 206)
        with fs.open(s3_bucket.url("written/by-s3fs.bin"), "wb") as f:  # writes pass too
            f.write(b"w" * 10_000)
        assert s3_bucket.server.client.get_object(Bucket=s3_bucket.name, Key="written/by-s3fs.bin")["Body"].read() \
            == b"w" * 10_000
        assert ("PUT", f"/{s3_bucket.name}/written/by-s3fs.bin", None, 200) in faulty_s3.requests
        assert faulty_s3.faults == [] and faulty_s3.pending == 0
        faulty_s3.reset()
        assert faulty_s3.requests == []

    def test_binds_loopback_and_stops(self, s3_server):
        proxy = FaultProxy(s3_server.endpoint_url).start()
        host, port = proxy.endpoint_url.removeprefix("http://").split(":")
        assert host == "127.0.0.1" and proxy.storage_options["client_kwargs"]["endpoint_url"] == proxy.endpoint_url
        proxy.stop()
        with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
            pass

    def test_rules_are_bounded_ordered_and_matched(self, faulty_s3, shard, s3_bucket):
        s3_bucket.put("other.bin", b"other")
        fs = s3_filesystem(faulty_s3.storage_options, retries=1)
        faulty_s3.fail_next(1, 500, match="part-0", method="GET")
        faulty_s3.fail_next(2, 503, match="part-0")  # any method
        assert faulty_s3.pending == 3
        assert fs.cat_file(s3_bucket.url("other.bin")) == b"other"  # no match: untouched
        assert faulty_s3.pending == 3
        with pytest.raises(OSError) as first:
            fs.cat_file(shard, start=0, end=4)
        assert first.value.errno == errno.EREMOTEIO  # the first rule, 500, went first
        with pytest.raises(OSError) as second:
            fs.info(shard)  # a HEAD: the second rule applies to any method
        assert second.value.errno == errno.EBUSY
        with pytest.raises(OSError):
            fs.cat_file(shard, start=0, end=4)
        assert faulty_s3.pending == 0 and fs.cat_file(shard, start=0, end=4) == b"PAR1"
        assert [f.kind for f in faulty_s3.faults] == ["fail"] * 3


class TestFaultsThroughS3fs:
    """What s3fs 2026.9 does with each fault, with the fixture's storage_options (botocore never retries)."""

    def test_one_503_is_retried_by_s3fs_itself(self, faulty_s3, shard):
        fs = s3_filesystem(faulty_s3.storage_options)  # s3fs's default: 5 attempts
        faulty_s3.fail_next(1, 503, match="part-0.parquet", method="GET")
        assert read_group(fs, shard) == list(range(200, 300))
        assert [r.status for r in gets(faulty_s3, "part-0.parquet")] == [503, 206]

    def test_503_without_s3fs_retries_raises_oserror_ebusy(self, faulty_s3, shard):
        fs = s3_filesystem(faulty_s3.storage_options, retries=1)
        faulty_s3.fail_next(1, 503, match="part-0.parquet", method="GET")
        with pytest.raises(OSError) as raised:
            read_group(fs, shard)
        assert raised.value.errno == errno.EBUSY and "reduce your request rate" in str(raised.value)
        assert isinstance(raised.value.__cause__, ClientError)
        assert raised.value.__cause__.response["Error"]["Code"] == "SlowDown"
        assert [r.status for r in gets(faulty_s3, "part-0.parquet")] == [503]  # one request per attempt
        assert read_group(fs, shard) == list(range(200, 300))  # the caller can retry

    def test_persistent_503_exhausts_s3fs_retries(self, faulty_s3, shard):
        fs = s3_filesystem(faulty_s3.storage_options, retries=3)
        faulty_s3.fail_next(10, 503, match="part-0.parquet", method="GET")
        with pytest.raises(OSError) as raised:
            fs.cat_file(shard)
        assert raised.value.errno == errno.EBUSY
        assert [r.status for r in gets(faulty_s3, "part-0.parquet")] == [503] * 3
        assert faulty_s3.pending == 7

    @pytest.mark.parametrize(("status", "code", "error"), [(500, "InternalError", errno.EREMOTEIO),
                                                           (429, "TooManyRequests", errno.EIO)])
    def test_500_and_429_are_not_retried_by_s3fs(self, faulty_s3, shard, status, code, error):
        assert ERROR_CODES[status] == code
        fs = s3_filesystem(faulty_s3.storage_options)  # even with s3fs's 5 attempts
        faulty_s3.fail_next(1, status, match="part-0.parquet", method="GET")
        with pytest.raises(OSError) as raised:
            fs.cat_file(shard)
        assert raised.value.errno == error and raised.value.__cause__.response["Error"]["Code"] == code
        assert [r.status for r in gets(faulty_s3, "part-0.parquet")] == [status]

    def test_a_heads_503_is_not_retried(self, faulty_s3, shard):
        fs = s3_filesystem(faulty_s3.storage_options)
        faulty_s3.fail_next(1, 503, match="part-0.parquet", method="HEAD")
        with pytest.raises(OSError) as raised:  # no body, so no "SlowDown" for s3fs to see
            fs.open(shard, "rb")
        assert raised.value.errno == errno.EBUSY
        assert [r.status for r in faulty_s3.requests] == [503]

    def test_slow_responses_still_succeed(self, faulty_s3, shard):
        fs = s3_filesystem(faulty_s3.storage_options, retries=1)
        faulty_s3.delay_next(1, 0.3, match="part-0.parquet", method="GET")
        assert read_group(fs, shard) == list(range(200, 300))
        faulty_s3.delay_next(1, 0.3, match="part-0.parquet", method="GET", after_bytes=100)
        assert fs.cat_file(shard) == parquet_bytes()
        assert [f.kind for f in faulty_s3.faults] == ["delay", "delay"]

    @pytest.mark.parametrize(("after_bytes", "raised_type", "cause_type"), [
        (100, FSTimeoutError, AioReadTimeoutError),  # a stall mid-body: aiobotocore's timeout, an asyncio one
        (None, ReadTimeoutError, type(None)),  # no status line in time: botocore's own, passed on as it is
    ])
    def test_a_stall_past_read_timeout_raises_a_timeout_oserror(self, faulty_s3, shard, after_bytes, raised_type,
                                                                cause_type):
        options = dict(faulty_s3.storage_options)
        options["config_kwargs"] = {**options["config_kwargs"], "read_timeout": 0.3}
        fs = s3_filesystem(options, retries=1)
        faulty_s3.delay_next(1, 2, match="part-0.parquet", method="GET", after_bytes=after_bytes)
        with pytest.raises(raised_type) as raised:
            fs.cat_file(shard, start=0, end=1000)
        assert isinstance(raised.value, OSError) and type(raised.value.__cause__) is cause_type
        assert len(gets(faulty_s3, "part-0.parquet")) == 1
        assert fs.cat_file(shard, start=0, end=4) == b"PAR1"

    def test_a_cut_mid_body_is_retried_by_s3fs(self, faulty_s3, shard):
        fs = s3_filesystem(faulty_s3.storage_options)
        faulty_s3.cut_next(1, after_bytes=100, match="part-0.parquet", method="GET")
        assert read_group(fs, shard) == list(range(200, 300))
        assert [r.status for r in gets(faulty_s3, "part-0.parquet")] == [206, 206]
        assert [f.kind for f in faulty_s3.faults] == ["cut"]

    def test_a_cut_without_s3fs_retries_raises_aiohttp_payload_error(self, faulty_s3, shard):
        fs = s3_filesystem(faulty_s3.storage_options, retries=1)
        faulty_s3.cut_next(1, after_bytes=100, match="part-0.parquet", method="GET")
        with pytest.raises(aiohttp.ClientPayloadError) as raised:  # not an OSError: s3fs passes it on as it is
            read_group(fs, shard)
        assert not isinstance(raised.value, OSError)
        assert len(gets(faulty_s3, "part-0.parquet")) == 1
        assert read_group(fs, shard) == list(range(200, 300))
