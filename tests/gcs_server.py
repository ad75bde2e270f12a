"""A real GCS-compatible object store for the tests: gcp-storage-emulator's server (the JSON API that Google's
clients speak) in a process of its own, bound to 127.0.0.1 on a free port, in memory. Tests read it through the
path a user's ``gs://`` URL takes, with ``storage_options={"token": "anon", "endpoint_url": ...}``, and write it
through pyarrow's GCS client.

Not a thread of the test process: some calls of pyarrow's GCS files (``size()``, ``metadata()``) make their request
holding the interpreter lock, which a server in the same process would need to answer."""

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


class GcsBucket:
    """One bucket of a :class:`GcsServer`, created empty."""

    def __init__(self, server: GcsServer, name: str) -> None:
        self.server, self.name = server, name
        request = urllib.request.Request(f"{server.endpoint_url}/storage/v1/b?project=tests",
                                         data=json.dumps({"name": name}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200, response.status

    @property
    def storage_options(self) -> dict:
        return {"token": "anon", "endpoint_url": self.server.endpoint_url}

    def url(self, key: str) -> str:
        return f"gs://{self.name}/{key.lstrip('/')}"

    def put(self, key: str, data: bytes) -> None:
        with self.server.client.open_output_stream(f"{self.name}/{key.lstrip('/')}") as out:
            out.write(data)

    def upload_folder(self, folder: str | os.PathLike, prefix: str = "") -> list[str]:
        keys = []
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                key = f"{prefix}{path.relative_to(folder).as_posix()}"
                self.put(key, path.read_bytes())
                keys.append(key)
        return keys

    def delete(self, key: str) -> None:
        self.server.client.delete_file(f"{self.name}/{key.lstrip('/')}")


class GcsServer:
    """gcp-storage-emulator on 127.0.0.1 (a free port), in memory, in a subprocess; ``stop()`` ends it."""

    def __init__(self) -> None:
        self.endpoint_url = ""
        self.client = None
        self._process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> GcsServer:
        from pyarrow import fs

        with socket.socket() as probe:  # a free port (the emulator takes no port 0)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self._process = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port),
             "--in-memory"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/storage/v1/b?project=tests", timeout=1):
                    break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"gcp-storage-emulator did not start on port {port}") from None
                time.sleep(0.1)
        self.client = fs.GcsFileSystem(anonymous=True, endpoint_override=f"127.0.0.1:{port}", scheme="http")
        return self

    def new_bucket(self) -> GcsBucket:
        return GcsBucket(self, f"bucket-{uuid.uuid4().hex[:16]}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None
