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
