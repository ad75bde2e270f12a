"""Keep the suite hermetic: raw text tokenized by the tests is cached in a temporary folder of this run, not in the
user's ``datasets`` cache (the module's default ``cache_dir``), also for the processes the tests start."""

import os

import datasets
import pytest


@pytest.fixture(autouse=True, scope="session")
def _datasets_cache_of_this_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_datasets_cache")
    saved_env, saved_config = os.environ.get("HF_DATASETS_CACHE"), datasets.config.HF_DATASETS_CACHE
    os.environ["HF_DATASETS_CACHE"], datasets.config.HF_DATASETS_CACHE = str(folder), folder
    yield
    datasets.config.HF_DATASETS_CACHE = saved_config
    if saved_env is None:
        os.environ.pop("HF_DATASETS_CACHE", None)
    else:
        os.environ["HF_DATASETS_CACHE"] = saved_env


# a real S3-compatible object store (moto's server on 127.0.0.1) and a fault-injecting proxy in front of it: see
# tests/object_store.py. moto and s3fs are imported only by the tests that use these fixtures.
@pytest.fixture(scope="session")
def s3_server():
    """The session's ``S3Server``: moto's S3 server with one bucket (``s3_server.bucket``)."""
    from tests.object_store import S3Server

    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh, empty ``S3Bucket`` of the session's server for this test; deleted with its objects afterwards."""
    bucket = s3_server.new_bucket()
    yield bucket
    bucket.drop()


@pytest.fixture(scope="session")
def gcs_server():
    """The session's ``GcsServer``: gcp-storage-emulator's GCS server on 127.0.0.1 (tests/arrow_stores.py)."""
    from tests.arrow_stores import GcsServer

    server = GcsServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azure_server():
    """The session's ``AzuriteServer``: Azurite's blob service on 127.0.0.1 (tests/arrow_stores.py)."""
    from tests.arrow_stores import AzuriteServer

    server = AzuriteServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["gs", "az"])
def store_bucket(request):
    """A fresh, empty bucket of the session's GCS server, then of its Azure server."""
    return request.getfixturevalue({"gs": "gcs_server", "az": "azure_server"}[request.param]).new_bucket()


@pytest.fixture
def faulty_s3(s3_server):
    """A ``FaultProxy`` in front of the session's server for this test; read through ``faulty_s3.storage_options``,
    write through the server (or a bucket) directly."""
    from tests.object_store import FaultProxy

    proxy = FaultProxy(s3_server.endpoint_url, server=s3_server).start()
    yield proxy
    proxy.stop()
