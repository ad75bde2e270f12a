"""Shards in object storage read through pyarrow's own clients: ``s3://`` through its S3 client (the AWS C++
SDK), ``gs://`` through its GCS client (google-cloud-cpp) and ``az://`` through its Azure client, with the few calls
of an fsspec filesystem that listing and reading shards make (:class:`ArrowStore`).

pyarrow is loaded already and its clients start in milliseconds, where s3fs first imports aiobotocore, botocore
and aiohttp (0.3 s) and connects through them: on the way to a corpus's first batch that was most of the time spent
before any row was read. gcsfs, for its part, has no release that matches the pinned fsspec. :func:`arrow_options`,
:func:`gcs_options` and :func:`azure_options` translate the ``storage_options`` a user writes for s3fs, gcsfs or
adlfs; options that have no equivalent leave the URL to those packages through fsspec (``docs/sharded_data.md``
lists them).

A file's version is its ETag (S3, Azure) or generation (GCS), read from the metadata request that opening it makes;
a missing key raises ``FileNotFoundError``. A listing's S3 client retries as the options say (twice by default); a
shard reader's S3 client retries nothing, so that the reader retries and counts every attempt itself. The GCS
client retries for at most 1 s (the least it allows: with less it makes no attempt); the Azure client as its SDK
does by default.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import urlsplit

TOP_LEVEL = {"key", "secret", "token", "anon", "endpoint_url", "use_ssl", "client_kwargs", "config_kwargs",
             "use_listings_cache"}
"""s3fs's options that have an equivalent in pyarrow's client (``use_listings_cache``: pyarrow caches no
listing, so either value holds)."""

CLIENT_KWARGS = {"endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
CONFIG_KWARGS = {"connect_timeout", "read_timeout", "retries", "s3"}


def s3fs_only(storage_options: dict[str, Any] | None) -> list[str]:
    """The ``storage_options`` (dotted for nested ones) that pyarrow's S3 client has no equivalent of."""
    options = dict(storage_options or {})
    client, config = options.get("client_kwargs") or {}, options.get("config_kwargs") or {}
    others = sorted(set(options) - TOP_LEVEL)
    for name, given, known in (("client_kwargs", client, CLIENT_KWARGS), ("config_kwargs", config, CONFIG_KWARGS),
                               ("config_kwargs.s3", config.get("s3") or {}, {"addressing_style"}),
                               ("config_kwargs.retries", config.get("retries") or {},
                                {"max_attempts", "total_max_attempts", "mode"})):
        if not isinstance(given, dict):
            others.append(name)
        else:
            others.extend(f"{name}.{key}" for key in sorted(set(given) - known))
    return others


def arrow_options(storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """:func:`s3_store` options for s3fs-style ``storage_options`` (``pyarrow.fs.S3FileSystem``'s keyword arguments,
    and ``retries``: the client's own retries), or None when one of them has no equivalent there
    (:func:`s3fs_only`: the URL is then read through s3fs)."""
    if s3fs_only(storage_options):
        return None
    options = dict(storage_options or {})
    client, config = options.get("client_kwargs") or {}, options.get("config_kwargs") or {}
    addressing, retries = config.get("s3") or {}, config.get("retries") or {}
    arrow: dict[str, Any] = {}
    key = options.get("key", client.get("aws_access_key_id"))
    secret = options.get("secret", client.get("aws_secret_access_key"))
    token = options.get("token", client.get("aws_session_token"))
    if key is not None or secret is not None:
        arrow.update(access_key=key, secret_key=secret)
    if token is not None:
        arrow["session_token"] = token
    if options.get("anon"):
        arrow["anonymous"] = True
    endpoint = (options.get("endpoint_url", client.get("endpoint_url")) or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL"))  # botocore's variables, which s3fs would read
    if endpoint:
        arrow.update(_endpoint(endpoint, "https"))
    if options.get("use_ssl") is False:
        arrow["scheme"] = "http"
    if client.get("region_name"):
        arrow["region"] = client["region_name"]
    if "connect_timeout" in config:
        arrow["connect_timeout"] = float(config["connect_timeout"])
    if "read_timeout" in config:
        arrow["request_timeout"] = float(config["read_timeout"])
    if "addressing_style" in addressing:
        arrow["force_virtual_addressing"] = addressing["addressing_style"] == "virtual"
    attempts = retries.get("total_max_attempts", retries.get("max_attempts"))
    if attempts is not None:
        arrow["retries"] = max(0, int(attempts) - 1) if "total_max_attempts" in retries else int(attempts)
    return arrow


def _endpoint(url: str, default_scheme: str) -> dict[str, str]:
    """``endpoint_override`` and ``scheme`` of pyarrow's S3 and GCS clients for an endpoint URL (``host:port``
    alone takes ``default_scheme``)."""
    parts = urlsplit(url if "://" in url else f"{default_scheme}://{url}")
    return {"endpoint_override": parts.netloc + parts.path.rstrip("/"), "scheme": parts.scheme or default_scheme}


STATUS = re.compile(r"\(HTTP status (\d{3})\)")
AWS_ERROR = re.compile(r"AWS Error ([A-Z_]+)")

LASTING_ERRORS = {"ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "NO_SUCH_BUCKET", "NO_SUCH_KEY",
                  "RESOURCE_NOT_FOUND", "INVALID_PARAMETER_VALUE", "INVALID_PARAMETER_COMBINATION",
                  "MISSING_PARAMETER", "MISSING_AUTHENTICATION_TOKEN", "VALIDATION", "UNRECOGNIZED_CLIENT",
                  "INVALID_CLIENT_TOKEN_ID", "EXPIRED_TOKEN", "INCOMPLETE_SIGNATURE", "OPT_IN_REQUIRED"}
"""AWS SDK error kinds that another attempt cannot change (credentials, permissions, a wrong name)."""


GCS_STATUS = re.compile(r"google::cloud::Status\(([A-Z_]+)")
GCS_TRANSIENT = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL", "ABORTED", "UNKNOWN"}
"""google-cloud-cpp status codes that another attempt may pass (its own retry policy's transient ones)."""


def arrow_transient(error: BaseException) -> bool | None:
    """Whether an error of pyarrow's S3 or GCS client may pass on a retry, from its text ("AWS Error SLOW_DOWN during
    GetObject operation", "AWS Error UNKNOWN (HTTP status 429) ...", "google::cloud::Status(UNAVAILABLE: ...)"):
    None when it is not such an error."""
    text = str(error)
    status = GCS_STATUS.search(text)
    if status is not None:
        return status.group(1) in GCS_TRANSIENT
    kind = AWS_ERROR.search(text)
    if kind is None:
        return None
    status = STATUS.search(text)
    if status is not None and kind.group(1) == "UNKNOWN":
        code = int(status.group(1))
        return code >= 500 or code == 429
    return kind.group(1) not in LASTING_ERRORS


class ArrowStore:
    """A bucket store through a pyarrow filesystem, with the fsspec calls shard listing and reading make:
    ``find``, ``glob``, ``exists``, ``info`` (with the version), ``open`` (a random-access file) and ``cat_file``.
    Paths are ``bucket/key``, as fsspec gives them."""

    def __init__(self, client: Any, protocol: str, version: str) -> None:
        self.client, self.protocol, self.version = client, protocol, version
        """``version``: the key of the metadata an opened file carries that changes when the file is replaced."""

    def find(self, path: str) -> list[str]:
        """Every file under ``path`` (a prefix), or ``[path]`` for a file; [] when nothing is there."""
        from pyarrow import fs

        path = path.rstrip("/")
        selector = fs.FileSelector(path, recursive=True, allow_not_found=True)  # one listing request for a prefix
        found = sorted(item.path for item in self.client.get_file_info(selector) if item.type == fs.FileType.File)
        if not found and self.client.get_file_info(path).type == fs.FileType.File:
            return [path]
        return found

    def glob(self, pattern: str) -> list[str]:
        """The files matching ``pattern`` (fsspec's glob: ``*`` within a folder, ``**`` across folders; folders
        that match are left out, as they hold no rows of their own)."""
        from fsspec.utils import glob_translate

        fixed = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        base = fixed.rsplit("/", 1)[0] if "/" in fixed else fixed
        matcher = re.compile(glob_translate(pattern))
        return [path for path in self.find(base) if matcher.match(path)]

    def exists(self, path: str) -> bool:
        from pyarrow import fs

        return self.client.get_file_info(path.rstrip("/")).type != fs.FileType.NotFound

    def info(self, path: str) -> dict[str, Any]:
        """``{"name", "size", "type", <version>}`` of a file, from one metadata request."""
        with self.client.open_input_file(path) as handle:
            return self.opened_info(path, handle)

    def opened_info(self, path: str, handle: Any) -> dict[str, Any]:
        """:meth:`info` of ``path`` from ``handle``, a file :meth:`open` returned (the metadata its opening read)."""
        return {"name": path, "size": handle.size(), "type": "file",
                self.version: (handle.metadata().get(self.version) or b"").decode()}

    def open(self, path: str, mode: str = "rb", **_: Any) -> Any:
        """A random-access file (ranged GETs as it is read); fsspec's cache options do not apply."""
        if mode != "rb":
            raise ValueError(f"shards are opened for reading only, but got mode={mode!r}")
        return self.client.open_input_file(path)

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a file, in one ranged GET."""
        with self.client.open_input_file(path) as handle:
            return handle.read_at(end - start, start)


def s3_store(options: dict[str, Any], bucket: str, *, retries: int | None = None) -> ArrowStore:
    """``s3://`` through ``pyarrow.fs.S3FileSystem`` with :func:`arrow_options`' ``options``. ``retries``: the
    client's own retries (0 for a caller that retries and counts attempts itself); None: those of ``options``, else
    2."""
    from pyarrow import fs

    options = dict(options)
    given = options.pop("retries", 2)  # the options' retries: the listing's; a reader's are its own (0 here)
    attempts = given + 1 if retries is None else retries + 1
    if not ({"region", "endpoint_override"} & set(options) or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")):
        options["region"] = fs.resolve_s3_region(bucket)  # as s3fs finds a bucket's region
    client = fs.S3FileSystem(retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=attempts), **options)
    return ArrowStore(client, "s3", "ETag")


GCS_OPTIONS = {"token", "project", "endpoint_url", "default_location"}
"""gcsfs's options that have an equivalent in pyarrow's GCS client."""


def gcsfs_only(storage_options: dict[str, Any] | None) -> list[str]:
    """The ``storage_options`` that pyarrow's GCS client has no equivalent of (credentials other than anonymous or
    the environment's among them)."""
    options = dict(storage_options or {})
    others = sorted(set(options) - GCS_OPTIONS)
    if options.get("token") not in (None, "anon", "google_default", "cloud"):
        others.append("token")
    return others


def gcs_options(storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """``pyarrow.fs.GcsFileSystem`` keyword arguments for gcsfs-style ``storage_options``, or None when one of them
    has no equivalent there (:func:`gcsfs_only`). The endpoint may come from ``STORAGE_EMULATOR_HOST``, as gcsfs
    reads it."""
    if gcsfs_only(storage_options):
        return None
    options = dict(storage_options or {})
    arrow: dict[str, Any] = {}
    if options.get("token") == "anon":
        arrow["anonymous"] = True
    if options.get("project"):
        arrow["project_id"] = options["project"]
    if options.get("default_location"):
        arrow["default_bucket_location"] = options["default_location"]
    endpoint = options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    if endpoint:
        arrow.update(_endpoint(endpoint, "http"))  # STORAGE_EMULATOR_HOST may be host:port alone
    return arrow


def gcs_store(options: dict[str, Any]) -> ArrowStore:
    """``gs://`` through ``pyarrow.fs.GcsFileSystem`` with :func:`gcs_options`' ``options``; its own retries end
    after 1 s."""
    from datetime import timedelta

    from pyarrow import fs

    return ArrowStore(fs.GcsFileSystem(retry_time_limit=timedelta(seconds=1), **options), "gs", "generation")


AZURE_OPTIONS = {"account_name", "account_key", "sas_token", "client_id", "client_secret", "tenant_id",
                 "connection_string", "account_host"}
"""adlfs's options that have an equivalent in pyarrow's Azure client."""


def adlfs_only(storage_options: dict[str, Any] | None) -> list[str]:
    """The ``storage_options`` that pyarrow's Azure client has no equivalent of (``anon``, a ``credential`` object,
    ...)."""
    return sorted(set(storage_options or {}) - AZURE_OPTIONS)


def azure_options(storage_options: dict[str, Any] | None, account: str | None = None) -> dict[str, Any] | None:
    """``pyarrow.fs.AzureFileSystem`` keyword arguments for adlfs-style ``storage_options`` (and the account a URL
    names, ``container@account.dfs.core.windows.net``), or None when one of them has no equivalent there
    (:func:`adlfs_only`). As adlfs does, the account, key and connection string may come from
    ``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY`` and ``AZURE_STORAGE_CONNECTION_STRING``."""
    if adlfs_only(storage_options):
        return None
    options = dict(storage_options or {})
    connection = options.get("connection_string") or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    fields = dict(part.split("=", 1) for part in (connection or "").split(";") if "=" in part)
    arrow: dict[str, Any] = {
        "account_name": options.get("account_name") or account or fields.get("AccountName")
        or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")}
    if not arrow["account_name"]:
        return None  # adlfs names the missing account
    key = options.get("account_key") or fields.get("AccountKey") or (
        None if options.get("sas_token") else os.environ.get("AZURE_STORAGE_ACCOUNT_KEY"))
    if key:
        arrow["account_key"] = key
    for name in ("sas_token", "client_id", "client_secret", "tenant_id"):
        if options.get(name):
            arrow[name] = options[name]
    if fields.get("SharedAccessSignature") and "account_key" not in arrow:
        arrow["sas_token"] = fields["SharedAccessSignature"]
    endpoint = fields.get("BlobEndpoint") or options.get("account_host")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        host = parts.netloc
        # the account's own host (account.blob.core.windows.net) keeps its suffix; another host (an emulator
        # such as Azurite) is addressed by path, as pyarrow does for an authority without a leading dot
        authority = host[len(arrow["account_name"]):] if host.startswith(f"{arrow['account_name']}.") else host
        arrow.update(blob_storage_authority=authority, blob_storage_scheme=parts.scheme)
        if not authority.startswith("."):
            arrow.update(dfs_storage_authority=authority, dfs_storage_scheme=parts.scheme)
    return arrow


def azure_store(options: dict[str, Any]) -> ArrowStore:
    """``az://`` (``abfs://``) through ``pyarrow.fs.AzureFileSystem`` with :func:`azure_options`' ``options``."""
    from pyarrow import fs

    return ArrowStore(fs.AzureFileSystem(**options), "az", "ETag")


def _container_and_account(path: str) -> tuple[str, str | None]:
    """``container/key`` of an Azure URL's path, and the account when the URL names it
    (``container@account.dfs.core.windows.net/key``)."""
    first, _, rest = path.partition("/")
    if "@" not in first:
        return path, None
    container, host = first.split("@", 1)
    return f"{container}/{rest}" if rest else container, host.split(".", 1)[0]


AZURE_SCHEMES = ("az://", "abfs://", "abfss://")
"""The URL schemes of Azure Blob Storage."""


def arrow_store(urls: list[str], storage_options: dict[str, Any] | None, *,
                own_retries: bool = False) -> tuple[ArrowStore, list[str]] | None:
    """``(store, paths)`` of ``urls`` through pyarrow's own client when they are all ``s3://``, all ``gs://``
    (``gcs://``) or all ``az://`` (``abfs://``) and every storage option has an equivalent there; else None (fsspec
    reads them)."""
    schemes = {url.split("://", 1)[0].lower() for url in urls if "://" in url}
    if len(schemes) != 1 or not all("://" in url for url in urls):
        return None
    scheme, paths = schemes.pop(), [url.split("://", 1)[1] for url in urls]
    if scheme == "s3" and (options := arrow_options(storage_options)) is not None:
        return s3_store(options, paths[0].split("/", 1)[0], retries=0 if own_retries else None), paths
    if scheme in ("gs", "gcs") and (options := gcs_options(storage_options)) is not None:
        return gcs_store(options), paths
    if f"{scheme}://" in AZURE_SCHEMES:
        named = [_container_and_account(path) for path in paths]
        accounts = {account for _, account in named if account}
        if len(accounts) <= 1 and (options := azure_options(storage_options, next(iter(accounts), None))):
            return azure_store(options), [path for path, _ in named]
    return None
