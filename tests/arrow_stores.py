"""Real GCS- and Azure-compatible object stores for the tests, each in a process of its own, bound to 127.0.0.1 on a
free port, in memory:

- ``GcsServer``: gcp-storage-emulator's server (the JSON API that Google's clients speak), read with
  ``storage_options={"token": "anon", "endpoint_url": ...}``;
- ``AzuriteServer``: Azurite's blob service (Microsoft's emulator, from npm; ``make install-dev`` puts it in
  ``.venv/azurite``), with its well-known development account, read with the connection string Azurite documents.

Tests read them through the path a user's ``gs://`` or ``az://`` URL takes, and write them through pyarrow's
clients. Not threads of the test process: some calls of pyarrow's GCS files (``size()``, ``metadata()``) make their
request holding the interpreter lock, which a server in the same process would need to answer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's development account and its published key (not a secret)."""

AZURITE = Path(__file__).resolve().parents[1] / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"


class Bucket:
    """One bucket (a GCS bucket, an Azure container) of a server, written through the server's pyarrow client."""

    scheme = ""

    def __init__(self, server: GcsServer | AzuriteServer, name: str) -> None:
        self.server, self.name = server, name

    @property
    def storage_options(self) -> dict:
        return self.server.storage_options

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.name}/{key.lstrip('/')}"

    def put(self, key: str, data: bytes) -> None:
        with self.server.client.open_output_stream(f"{self.name}/{key.lstrip('/')}") as out:
            out.write(data)

    def upload_folder(self, folder: str | os.PathLike, prefix: str = "") -> list[str]:
        keys = []
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                keys.append(f"{prefix}{path.relative_to(folder).as_posix()}")
                self.put(keys[-1], path.read_bytes())
        return keys

    def delete(self, key: str) -> None:
        self.server.client.delete_file(f"{self.name}/{key.lstrip('/')}")


class GcsBucket(Bucket):
    scheme = "gs"

    def __init__(self, server: GcsServer, name: str) -> None:
        super().__init__(server, name)
        request = urllib.request.Request(f"{server.endpoint_url}/storage/v1/b?project=tests",
                                         data=json.dumps({"name": name}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200, response.status


class AzureContainer(Bucket):
    scheme = "az"

    def __init__(self, server: AzuriteServer, name: str) -> None:
        super().__init__(server, name)
        server.client.create_dir(name)


class _Server:
    """A server process on 127.0.0.1, started by :meth:`start` on a free port; ``stop()`` ends it."""

    def __init__(self) -> None:
        self.port = 0
        self.client = None
        self._process: subprocess.Popen | None = None

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        return True

    def start(self, timeout: float = 60):
        with socket.socket() as probe:  # a free port (neither server takes port 0)
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._process = subprocess.Popen(self._command(self.port), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._answers():
                    break
            except OSError:
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{type(self).__name__} did not start on port {self.port}")
            time.sleep(0.1)
        self.client = self._client()
        return self

    def _client(self):
        raise NotImplementedError

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # Azurite waits for its clients' idle connections: in memory, no loss
                self._process.kill()
                self._process.wait(timeout=10)
            self._process = None


class GcsServer(_Server):
    """gcp-storage-emulator, in memory."""

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict:
        return {"token": "anon", "endpoint_url": self.endpoint_url}

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port),
                "--in-memory"]

    def _answers(self) -> bool:
        with urllib.request.urlopen(f"{self.endpoint_url}/storage/v1/b?project=tests", timeout=1):
            return True

    def _client(self):
        from pyarrow import fs

        return fs.GcsFileSystem(anonymous=True, endpoint_override=f"127.0.0.1:{self.port}", scheme="http")

    def new_bucket(self) -> GcsBucket:
        return GcsBucket(self, f"bucket-{uuid.uuid4().hex[:16]}")


class AzuriteServer(_Server):
    """Azurite's blob service, in memory, with its development account."""

    @property
    def storage_options(self) -> dict:
        return {"connection_string": f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                                     f"BlobEndpoint=http://127.0.0.1:{self.port}/{ACCOUNT};"}

    def _command(self, port: int) -> list[str]:
        if not AZURITE.exists():
            raise RuntimeError(f"Azurite is not installed at {AZURITE}: run make install-dev (it installs it with npm)")
        return [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                "--skipApiVersionCheck", "--loose", "--silent"]

    def _client(self):
        from pyarrow import fs

        authority = f"127.0.0.1:{self.port}"
        return fs.AzureFileSystem(ACCOUNT, account_key=KEY, blob_storage_authority=authority,
                                  blob_storage_scheme="http", dfs_storage_authority=authority,
                                  dfs_storage_scheme="http")

    def new_bucket(self) -> AzureContainer:
        return AzureContainer(self, f"container-{uuid.uuid4().hex[:16]}")
