"""The store behind a corpus's URLs: pyarrow's own S3, GCS and Azure clients where every storage option has an
equivalent there (:mod:`~engine.sources.shards.object_stores`), else fsspec's (s3fs with bounded timeouts and
retries, gcsfs, adlfs), one filesystem for all the shards of a corpus."""

from __future__ import annotations

from typing import Any

from engine.sources.shards.object_stores import adlfs_only, arrow_store, gcsfs_only, s3fs_only


def filesystem(shards: Any, *, own_retries: bool = False) -> tuple[Any, list[str]]:
    """``(filesystem, paths)`` of the URLs of ``shards`` (a :class:`~engine.sources.shards.listing.Shards`; one
    store for all of them): ``s3://``, ``gs://``, ``az://`` through pyarrow's own clients
    (:func:`~engine.sources.shards.object_stores.arrow_store`) when every storage option has an
    equivalent there, else through ``fsspec`` (s3fs, gcsfs, adlfs, ...).

    ``own_retries``: a filesystem of its own (not fsspec's shared instance) that makes each request once, for a
    caller that retries and counts attempts itself (the client would otherwise retry some errors unseen)."""
    import fsspec

    store = arrow_store(shards.url_list, shards.storage_options, own_retries=own_retries)
    if store is not None:
        return store
    s3 = all(url.lower().startswith(("s3://", "s3a://")) for url in shards.url_list)
    options = dict(shards.storage_options or {}, **({"skip_instance_cache": True} if own_retries or s3 else {}))
    if s3:
        options = s3fs_bounded(options, own_retries)
    systems, paths = [], []
    for url in shards.url_list:
        try:
            system, path = fsspec.core.url_to_fs(url, **options)
        except ImportError as error:
            scheme = url.split("://", 1)[0].lower()
            needs = {"s3": ("S3", s3fs_only, "s3fs: pip install 'universal-datamodule[s3]'"),
                     "gs": ("GCS", gcsfs_only, "gcsfs: pip install gcsfs"),
                     "gcs": ("GCS", gcsfs_only, "gcsfs: pip install gcsfs"),
                     "az": ("Azure", adlfs_only, "adlfs: pip install adlfs"),
                     "abfs": ("Azure", adlfs_only, "adlfs: pip install adlfs")}.get(scheme)
            raise ImportError(f"reading {url!r} needs fsspec's backend for its scheme ({error})" + (
                f": storage options {needs[1](shards.storage_options)} have no equivalent in pyarrow's {needs[0]} "
                f"client, so they need {needs[2]}, or leave them out" if needs else "")) from error
        systems.append(system)
        paths.append(path)
    if len({type(system) for system in systems}) > 1:
        raise ValueError(f"Shards' urls should all be in one store, but got {shards.url_list[:4]}")
    if (own_retries or s3) and isinstance(getattr(systems[0], "retries", None), int):
        systems[0].retries = 1  # s3fs counts attempts: one, no retry of its own (botocore's, if any, are bounded)
    _share_models(systems[0])
    return systems[0], paths


S3FS_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 20}
"""botocore's timeouts (seconds) for s3fs where the storage options set none (botocore's own are 60 s each, and
with its retries and s3fs's an endpoint that accepts connections and never answers held a listing for minutes)."""


LISTING_ATTEMPTS = 3
"""botocore's attempts per request of an s3fs listing where the options set none (its standard mode, which retries
5xx, throttling, timeouts and dropped connections); s3fs's own retries are off, so that they do not multiply."""


def s3fs_bounded(options: dict[str, Any], own_retries: bool) -> dict[str, Any]:
    """``options`` for s3fs with :data:`S3FS_TIMEOUTS` where none are given. A shard reader's client
    (``own_retries``) has botocore's retries off, one attempt per request (``total_max_attempts=1``;
    ``max_attempts=1`` would be one retry), so that its retries are all the reader's and counted; a listing's
    client makes :data:`LISTING_ATTEMPTS` through botocore unless the options set its retries. Either way s3fs's own
    retries are off (:func:`filesystem`), so a request that never answers ends after its attempts' timeouts."""
    config = dict(options.get("config_kwargs") or {})
    for name, seconds in S3FS_TIMEOUTS.items():
        config.setdefault(name, seconds)
    if own_retries:
        config["retries"] = {key: value for key, value in (config.get("retries") or {}).items()
                             if key != "max_attempts"}
        config["retries"]["total_max_attempts"] = 1
    elif "retries" not in config:
        config["retries"] = {"total_max_attempts": LISTING_ATTEMPTS, "mode": "standard"}
    return {**options, "config_kwargs": config}


_MODELS: dict[str, Any] = {}
"""``{"loader": botocore's data loader}`` of the first S3 client this process connected (inherited by the loader
workers it forks): the service models it parsed, which a new session would parse again."""


def _share_models(system: Any) -> None:
    """Give an s3fs filesystem that has no session yet one whose service models come from :data:`_MODELS`: each
    reader's filesystem (one per process, the loader workers' included) then connects without parsing them again,
    on the way to its first fetch. Other filesystems, or no models yet, are left as they are."""
    loader = _MODELS.get("loader")
    if loader is None or getattr(system, "session", False) is not None or not isinstance(
            getattr(system, "kwargs", None), dict):
        return
    from aiobotocore.session import AioSession

    session = AioSession(**system.kwargs)  # as s3fs makes its own
    session.register_component("data_loader", loader)
    system.session = session


def keep_models(system: Any) -> None:
    """Keep the data loader of ``system``'s session (an s3fs filesystem that has connected) in :data:`_MODELS`."""
    session = getattr(system, "session", None)
    if "loader" not in _MODELS and hasattr(session, "get_component"):
        _MODELS["loader"] = session.get_component("data_loader")
