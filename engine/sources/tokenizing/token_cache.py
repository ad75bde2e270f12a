"""Tokenized data cached on disk, so raw text is tokenized once per machine rather than once per rank.

The cache file is named by the data's ``datasets`` fingerprint, the tokenizer's hash and the tokenization options
(in-memory datasets have no cache files of their own, so the name is made here). It is written once, by the first
process (Lightning's ``prepare_data`` on each machine's local rank 0, or local rank 0 under :func:`machine_first`),
into a temporary folder renamed into place, and every process then memory-maps it with ``load_from_disk``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.checks import check_int

CACHE_VERSION = "1"
"""Part of every cache file's name: raised when the cached layout changes, so old files are not read."""


def default_cache_dir() -> Path:
    """``<HF_DATASETS_CACHE>/universal_datamodule/tokenized``: beside the ``datasets`` cache the user manages."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "universal_datamodule" / "tokenized"


@dataclass(frozen=True)
class TokenCache:
    """Where tokenized data is cached, and how many processes tokenize it."""

    cache_dir: str | None = None
    """Folder of the cache files; None: :func:`default_cache_dir`."""
    num_proc: int | None = None
    """Processes for ``Dataset.map``; None: this process."""

    @classmethod
    def resolve(cls, cache_dir: Any, num_proc: Any) -> TokenCache:
        """The checked arguments (``cache_dir`` a path or None, ``num_proc`` a positive int or None)."""
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir should be a folder path (str or os.PathLike) or None, but got "
                            f"cache_dir={cache_dir!r} ({type(cache_dir).__name__})")
        if num_proc is not None:
            num_proc = check_int("num_proc", num_proc, minimum=1)
        return cls(os.fspath(cache_dir) if cache_dir is not None else None, num_proc)

    @property
    def directory(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir is not None else default_cache_dir()

    def path_for(self, dataset: Any, tokenizer: Any, options: Any) -> Path:
        """The cache file of ``dataset`` tokenized by ``tokenizer`` with ``options``: equal inputs, equal path."""
        from datasets.fingerprint import Hasher

        fingerprint = getattr(dataset, "_fingerprint", None)
        if not fingerprint:
            raise ValueError(f"the dataset has no datasets fingerprint to name its tokenized cache by "
                             f"({type(dataset).__name__}); give a datasets.Dataset")
        digest = hashlib.blake2b(digest_size=16)
        for part in (CACHE_VERSION, fingerprint, Hasher.hash(tokenizer), repr(options)):
            digest.update(part.encode())
            digest.update(b"\0")
        return self.directory / f"tokenized-{digest.hexdigest()}"

    def load_or_build(self, path: Path, build: Callable[[Path], Any]) -> Any:
        """The dataset saved at ``path``, after ``build(scratch)``-ing and saving it there when it is not; the
        ``scratch`` folder (for files the build needs only while it runs) is removed afterwards."""
        import datasets

        if not is_complete(path):
            temporary = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex}")
            scratch = path.with_name(f"{path.name}.scratch-{uuid.uuid4().hex}")
            try:
                built = build(scratch)
                built.save_to_disk(str(temporary))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            try:
                os.replace(temporary, path)  # atomic: readers see the whole dataset or none
            except OSError:
                if is_complete(path):  # another machine sharing the folder was first: keep its file
                    shutil.rmtree(temporary, ignore_errors=True)
                else:  # what a writer that died left behind
                    shutil.rmtree(path, ignore_errors=True)
                    os.replace(temporary, path)
        return datasets.load_from_disk(str(path))


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a whole saved dataset."""
    return (path / "dataset_info.json").is_file() and (path / "state.json").is_file()


@contextlib.contextmanager
def machine_first() -> Iterator[None]:
    """Run the body on each machine's local rank 0 first and on the other ranks after it (torch.distributed, all
    ranks must enter); a no-op outside an initialized process group of more than one rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        yield
        return
    first = int(os.environ.get("LOCAL_RANK", dist.get_rank())) == 0
    if not first:
        dist.barrier()  # waits for local rank 0 to finish the body
        yield
        return
    try:
        yield
    finally:  # also when the body failed: the others then meet the error themselves rather than hang
        dist.barrier()
