"""Sharded corpora streamed from object storage: the peers (LitData, Mosaic Streaming, HF datasets streaming).

Run in the peers' own virtualenv (their pins conflict with the project's; ``bash benchmarks/peers/setup.sh`` makes
it)::

    .venv-peers/bin/python -m benchmarks.bench_streaming_peers --rows 200000     # full
    .venv-peers/bin/python -m benchmarks.bench_streaming_peers --quick           # 20k rows

From a fresh clone (``git clone``; its compiled caches, Python's bytecode and numba's, are empty) the first run
measures every reader's cold start as a new install meets it; ``--ours-python`` names the project's venv and the
peers' venv may live elsewhere (``/path/to/.venv-peers/bin/python -m benchmarks.bench_streaming_peers``).

Method
------
* Corpus: ONE synthetic tokenized corpus, seeded numpy (``--seed``): ``--rows`` rows, each a token row of random
  length 16..512 (uniform) of int32 ids < 32000, plus an int64 ``id`` (the row's index, used to check resumes).
* The same rows are written three ways: (a) Parquet, 8 files, row groups of 2000 rows (pyarrow, ``id`` int64 +
  ``tokens`` list<int32>); (b) LitData's format with ``litdata.optimize`` (16 MB chunks, tokens as a numpy
  array); (c) Mosaic's MDS with ``MDSWriter`` (16 MB shards, ``id`` int64 + ``tokens`` ndarray:int32).
* Object storage: moto's standalone S3 server (``ThreadedMotoServer``) on 127.0.0.1, an ephemeral port; all three
  layouts are uploaded to one bucket. Every peer reaches it through the environment (AWS_ENDPOINT_URL,
  S3_ENDPOINT_URL for Mosaic, dummy credentials) and its own storage options (LitData ``storage_options``
  endpoint_url; fsspec/s3fs ``client_kwargs`` for HF). No other address is ever contacted (HF_HUB_OFFLINE=1).
* Runs: ``--runs`` (3) runs of every reader in storage order, then ``--shuffled-runs`` (1) in each reader's own
  shuffled order (its shuffle option with its defaults: LitData ``shuffle=True``, Mosaic ``shuffle=True``, HF
  ``IterableDataset.shuffle(seed=0)`` with its 1000-row buffer, ours ``shuffle=True``: row groups in a seeded
  order, rows shuffled within a window). The load average is recorded at each run's start.
* Readers, each in a fresh subprocess (so no peer's threads, shared memory or caches leak into the next), batch
  size 32, num_workers=2, one collate for all (pads each batch to its longest row with 0):
  - LitData: ``litdata.StreamingDataset`` + ``litdata.StreamingDataLoader``;
  - Mosaic: ``streaming.StreamingDataset`` (batch_size=32) + ``streaming.StreamingDataLoader`` (Mosaic's
    subclass of torch's DataLoader, which is what carries its state_dict);
  - HF: ``load_dataset("parquet", data_files="s3://...", streaming=True, storage_options=...)`` +
    ``torchdata.stateful_dataloader.StatefulDataLoader`` (torch's DataLoader with state_dict, the loader HF
    documents for resuming an IterableDataset with workers).
* Measures, per peer:
  - import: what the reader's script imports (``IMPORTS``), timed on its own and shown beside the first batch;
  - first batch (cold): from constructing the dataset, with an empty local cache, to the first batch (the
    reader's library is imported before the clock starts: a training script imports it anyway);
  - steady rows/s and tokens/s: after ``--warmup`` batches, over the batches up to 3/4 of the epoch (or fewer when
    ``--budget`` seconds run out; the table says how many); tokens are the real (unpadded) tokens;
  - resume: the peer's own ``state_dict()`` saved after batch ``--early`` (early) and at the end of the steady
    phase (late); later, a fresh process (a restarted node: the reader imported off the clock) builds a new
    dataset + loader over an empty cache, which gets ``load_state_dict``, and the time to its first batch is
    taken; "exact" when that batch's row ids are the ones the first run delivered right after the save;
  - worker USS: peak private memory (psutil USS) of the loader's worker processes (the child processes of the
    reader, sampled every 0.2 s from the cold start to the end of the steady phase; of those, the loader
    iterator's workers, so that a helper process of a reader's, such as a resource tracker, is not taken for
    one), the largest one;
  - ranks 2 -> 1: a loader as rank 0 of world size 2 (LitData: WORLD_SIZE/GLOBAL_RANK; Mosaic:
    WORLD_SIZE/RANK with one process per node; HF: ``split_dataset_by_node``) reads ``--early`` batches and saves
    its state; a loader at world size 1, in a fresh process, loads it and takes one batch: "yes" when that works
    (with how many of that batch's rows rank 0 had already delivered), "no (error ...)" when it raises. Ours keeps
    the global batch across world sizes (its loader refuses another), so at 1 rank its batch is 64 rows.
  Peer specifics: LitData fetches chunks with obstore, whose HTTP client refuses plain http unless told, so its
  client options get ``allow_http`` (the local S3 has no TLS); LitData also checks that a resumed loader's
  cache_dir is the one in its state, so its resumes use the same cache path, emptied. Mosaic initialises
  torch.distributed whenever WORLD_SIZE > 1: for "rank 0 of 2" a 1-process gloo group stands in.
* ``ours(...)`` is the project's own sharded source (``engine.Shards``) in a plain loop (``DataLoaderFactory``),
  measured the same way in a subprocess of the project's own .venv (``--ours-python``).

Results: markdown tables (every run's cold first batch with its import, then each run's measures), printed and
written to benchmarks/results/streaming_peers.md (``--out``) after every run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

BUCKET = "peers-bench"
BATCH = 32
WORKERS = 2
N_PARQUET_FILES = 8
ROW_GROUP = 2000
CHUNK_BYTES = 1 << 24
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "streaming_peers.md"
PEERS = ("litdata", "mosaic", "hf")


# ----------------------------------------------------------------------------------------------- the corpus
def make_corpus(rows: int, seed: int, work: Path) -> tuple[Path, Path, int]:
    """Writes flat tokens and row offsets as .npy files; returns their paths and the token count."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 513, size=rows)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = rng.integers(0, 32000, size=int(offsets[-1]), dtype=np.int32)
    np.save(work / "flat.npy", flat)
    np.save(work / "offsets.npy", offsets)
    return work / "flat.npy", work / "offsets.npy", int(offsets[-1])


def _load(work: Path) -> tuple[np.ndarray, np.ndarray]:
    return np.load(work / "flat.npy", mmap_mode="r"), np.load(work / "offsets.npy")


def write_parquet(work: Path, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat, offsets = _load(work)
    rows = len(offsets) - 1
    out.mkdir(parents=True)
    bounds = np.linspace(0, rows, N_PARQUET_FILES + 1).astype(np.int64)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        off = offsets[a:b + 1] - offsets[a]
        values = pa.array(np.asarray(flat[offsets[a]:offsets[b]]))
        tokens = pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), values)
        table = pa.table({"id": pa.array(np.arange(a, b, dtype=np.int64)), "input_ids": tokens})
        pq.write_table(table, out / f"part-{i:05d}.parquet", row_group_size=ROW_GROUP)


def _lit_rows(work: str, block: tuple[int, int]):
    """litdata.optimize's fn: one input is a block of row indices; yields its rows (reads the .npy files)."""
    flat, offsets = _load(Path(work))
    for i in range(block[0], block[1]):
        yield {"id": i, "tokens": np.array(flat[offsets[i]:offsets[i + 1]])}


def write_litdata(work: Path, out: Path) -> None:
    import litdata

    rows = len(np.load(work / "offsets.npy")) - 1
    blocks = [(a, min(a + 5000, rows)) for a in range(0, rows, 5000)]
    litdata.optimize(fn=functools.partial(_lit_rows, str(work)), inputs=blocks, output_dir=str(out),
                     chunk_bytes=CHUNK_BYTES, num_workers=1, verbose=False)


def write_mds(work: Path, out: Path) -> None:
    from streaming import MDSWriter

    flat, offsets = _load(work)
    with MDSWriter(out=str(out), columns={"id": "int64", "tokens": "ndarray:int32"}, size_limit=CHUNK_BYTES) as w:
        for i in range(len(offsets) - 1):
            w.write({"id": i, "tokens": np.asarray(flat[offsets[i]:offsets[i + 1]])})


# --------------------------------------------------------------------------------------------- local S3
def s3_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint, "S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
    }


def upload(endpoint: str, roots: dict[str, Path]) -> int:
    import boto3
    from boto3.s3.transfer import TransferConfig

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    cfg = TransferConfig(multipart_threshold=1 << 30, use_threads=False)
    total = 0
    for prefix, root in roots.items():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(root).as_posix()}", Config=cfg)
            total += path.stat().st_size
    return total


# ----------------------------------------------------------------------------------------------- readers
def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The one collate of all peers: pads token rows to the batch's longest with 0."""
    import torch

    toks = [np.asarray(r["tokens"] if "tokens" in r else r["input_ids"], dtype=np.int32) for r in rows]
    lengths = np.fromiter((len(t) for t in toks), dtype=np.int64, count=len(toks))
    out = np.zeros((len(toks), int(lengths.max())), dtype=np.int32)
    for i, t in enumerate(toks):
        out[i, :len(t)] = t
    return {"input_ids": torch.from_numpy(out), "lengths": torch.from_numpy(lengths),
            "ids": torch.as_tensor([int(r["id"]) for r in rows], dtype=torch.int64)}


@contextlib.contextmanager
def env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _err(e: BaseException, width: int = 140) -> str:
    """An exception in a line: its type and the last line of its message (a worker's error ends with the cause)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {(lines[-1] if lines else '')[:width]}"


def rank_env(peer: str, world: int) -> dict[str, str]:
    if peer == "litdata":
        return {"WORLD_SIZE": str(world), "GLOBAL_RANK": "0", "NNODES": "1"}
    if peer == "mosaic":  # one process per node, so no node-local barrier waits for a rank that does not exist
        return {"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    return {}


def make_loader(peer: str, endpoint: str, cache: Path, world: int = 1, shuffle: bool = False, resumed_from: int = 1):
    """A fresh dataset + loader of ``peer`` (rank 0 of ``world``), reading from the local S3, in storage order or
    (``shuffle``) in the reader's own shuffled order with its default shuffle options. ``resumed_from``: the world
    size of the state it will load (ours keeps the global batch across world sizes, so its batch grows)."""
    if peer == "litdata":
        import litdata
        from litdata.streaming import downloader

        # LitData fetches chunks with obstore, whose HTTP client refuses a plain-http endpoint unless told: allow
        # it (the local S3 has no TLS); the code path is the one it takes against real S3.
        with contextlib.suppress(AttributeError, TypeError):
            downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
        ds = litdata.StreamingDataset(
            f"s3://{BUCKET}/litdata", cache_dir=str(cache), shuffle=shuffle, drop_last=False,
            storage_options={"endpoint_url": endpoint, "aws_access_key_id": "testing",
                             "aws_secret_access_key": "testing", "region_name": "us-east-1"})
        return litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate)
    if peer == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(remote=f"s3://{BUCKET}/mds", local=str(cache), shuffle=shuffle, batch_size=BATCH)
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate)
    if peer == "hf":
        from datasets import load_dataset
        from datasets.distributed import split_dataset_by_node
        from torchdata.stateful_dataloader import StatefulDataLoader

        ds = load_dataset("parquet", data_files={"train": f"s3://{BUCKET}/parquet/*.parquet"}, split="train",
                          streaming=True, storage_options={"key": "testing", "secret": "testing",
                                                           "client_kwargs": {"endpoint_url": endpoint,
                                                                             "region_name": "us-east-1"}})
        if shuffle:  # a buffer of 1000 rows (its default), filled from shards in a seeded order
            ds = ds.shuffle(seed=0)
        if world > 1:
            ds = split_dataset_by_node(ds, rank=0, world_size=world)
        return StatefulDataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate)
    if peer == "ours":
        return ours(endpoint, cache, world, shuffle, batch=BATCH * max(resumed_from // world, 1))
    raise ValueError(peer)


class NotAvailable(Exception):
    """The project's sharded source cannot be imported (yet)."""


def _ids(batch: Any) -> list[int] | None:
    for key in ("ids", "id"):  # the peers' collate, ours (the row's own column)
        if isinstance(batch, dict) and key in batch:
            return batch[key].tolist()
    return None


def _rows_tokens(batch: Any) -> tuple[int, int]:
    """Rows and real tokens of a batch: from the peers' collate, or a best guess for ours (mask, else ids)."""
    if isinstance(batch, dict) and "lengths" in batch:
        return len(batch["lengths"]), int(batch["lengths"].sum())
    if isinstance(batch, dict) and "attention_mask" in batch:
        return int(batch["attention_mask"].shape[0]), int(batch["attention_mask"].sum())
    first = batch["input_ids"] if isinstance(batch, dict) and "input_ids" in batch else (
        next(iter(batch.values())) if isinstance(batch, dict) else batch[0])
    return int(first.shape[0]), int(first.numel())


class UssSampler:
    """Peak USS of each child process of this one (the loader's workers), sampled in a thread."""

    def __init__(self, every: float = 0.2):
        import psutil

        self._me = psutil.Process()
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for child in self._me.children(recursive=True):
                with contextlib.suppress(Exception):
                    uss = child.memory_full_info().uss
                    self.peak[child.pid] = max(self.peak.get(child.pid, 0), uss)
            self._stop.wait(self._every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self) -> None:
        """Stop sampling (before the resumes, whose fresh processes are children too)."""
        self._stop.set()
        self._thread.join()


def cache_dir(peer: str, caches: Path, phase: str) -> Path:
    """An empty cache for ``phase``. LitData checks a resumed loader's cache_dir against the one in the state, so
    for it every phase gets the same path, emptied (a node restarted with its cache wiped); the others get one each."""
    path = caches / ("litdata-cache" if peer == "litdata" else phase)
    shutil.rmtree(path, ignore_errors=True)
    return path


def _close(loader) -> None:
    it = getattr(loader, "_bench_it", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        with contextlib.suppress(Exception):
            it._shutdown_workers()
    gc.collect()


def _first(loader):
    it = iter(loader)
    loader._bench_it = it
    return it, next(it)


IMPORTS = {
    "litdata": "import litdata",
    "mosaic": "import streaming",
    "hf": "import datasets\nfrom torchdata.stateful_dataloader import StatefulDataLoader",
    "ours": "from collators import CollatorRegistry\nfrom engine import DataLoaderConfig, DataLoaderFactory, Shards\n"
            "from task_spec import TaskSpec",
}
"""What each reader's script imports, timed before the first batch's clock starts (shown beside it)."""


def run_peer(peer: str, endpoint: str, rows: int, tokens_total: int, args) -> dict[str, Any]:
    """All measurements of one peer (called in a subprocess of its own)."""
    import torch

    torch.set_num_threads(1)
    caches = Path(tempfile.mkdtemp(prefix=f"peer-{peer}-"))
    out: dict[str, Any] = {"peer": peer}
    started = time.perf_counter()
    with contextlib.suppress(ImportError):  # a missing library is reported by its loader below
        exec(IMPORTS[peer], {})  # the library's import is not the data's first batch: timed on its own
    out["import_s"] = time.perf_counter() - started
    total_batches = -(-rows // BATCH)
    late_target = max(args.warmup + 2, int(total_batches * 0.75))
    try:
        return _measure(peer, endpoint, rows, args, caches, out, total_batches, late_target)
    except NotAvailable as e:
        return {"peer": peer, "error": f"not available ({e})"}
    finally:
        shutil.rmtree(caches, ignore_errors=True)


def _measure(peer, endpoint, rows, args, caches, out, total_batches, late_target) -> dict[str, Any]:
    with UssSampler() as uss:
        # cold start + steady throughput + states at an early and a late position
        t0 = time.perf_counter()
        loader = make_loader(peer, endpoint, cache_dir(peer, caches, "cold"), shuffle=args.shuffle)
        it, batch = _first(loader)
        out["first_batch_s"] = time.perf_counter() - t0
        workers = {process.pid for process in getattr(it, "_workers", [])}
        seen, states, next_ids = 1, {}, {}
        want_next: str | None = None
        t_start = n_rows = n_tok = None
        deadline = None
        while True:
            if want_next is not None:
                next_ids[want_next] = _ids(batch)
                want_next = None
            if seen == args.warmup:
                t_start, n_rows, n_tok = time.perf_counter(), 0, 0
                deadline = t_start + args.budget
            elif t_start is not None:
                r, k = _rows_tokens(batch)
                n_rows += r
                n_tok += k
            if seen == args.early and hasattr(loader, "state_dict"):
                states["early"] = (seen, copy.deepcopy(loader.state_dict()))
                want_next = "early"
            if t_start is not None and (seen >= late_target or time.perf_counter() > deadline):
                steady_s = time.perf_counter() - t_start
                if hasattr(loader, "state_dict"):
                    states["late"] = (seen, copy.deepcopy(loader.state_dict()))
                    want_next = "late"
                batch = next(it)
                if want_next:
                    next_ids["late"] = _ids(batch)
                break
            batch = next(it)
            seen += 1
        out["steady_batches"] = seen - args.warmup
        out["rows_per_s"] = n_rows / steady_s
        out["tokens_per_s"] = n_tok / steady_s
        out["late_batch"] = seen
        del it
        _close(loader)
        del loader
        gc.collect()
        # resumes, each in a fresh process from an empty cache
        uss.stop()
        for name, (at, state) in states.items():
            try:
                seconds, ids = resume_in_fresh_process(peer, endpoint, cache_dir(peer, caches, f"resume-{name}"),
                                                       state, args)
                out[f"resume_{name}_s"] = seconds
                out[f"resume_{name}_exact"] = None if ids is None else ids == next_ids[name]
                out[f"resume_{name}_at"] = at
            except Exception as e:  # noqa: BLE001 - a peer's failure is a result
                out[f"resume_{name}_error"] = _err(e)
            gc.collect()
    peaks = [peak for pid, peak in uss.peak.items() if pid in workers] if workers else list(uss.peak.values())
    out["worker_uss_mib"] = max(peaks, default=0) / 2**20
    out["n_children"] = len(uss.peak)
    out["n_workers"] = len(workers)
    out["ranks"] = ranks_2_to_1(peer, endpoint, caches, args)
    return out


def resume_in_fresh_process(peer: str, endpoint: str, cache: Path, state: Any, args,
                            resumed_from: int = 1) -> tuple[float, list[int] | None]:
    """A new process (as a restarted node) imports the reader (off the clock), builds a new dataset and loader
    over ``cache``, loads ``state`` and takes its first batch: the seconds from the loader's construction to that
    batch, and its row ids. Raises what the new process raised."""
    import torch

    with tempfile.TemporaryDirectory(prefix="peer-state-") as folder:
        saved = Path(folder) / "state.pt"
        torch.save(state, saved)
        cmd = [sys.executable, "-m", "benchmarks.bench_streaming_peers", "--_peer", peer, "--_endpoint", endpoint,
               "--_resume", str(saved), "--_cache", str(cache), "--_resumed-from", str(resumed_from),
               *(["--shuffle"] if args.shuffle else [])]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.peer_timeout, cwd=ROOT)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not line:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the resumed process failed (rc {done.returncode}): {tail[:200]}")
    result = json.loads(line[-1][7:])
    if "error" in result:
        raise RuntimeError(result["error"])
    return result["seconds"], result["ids"]


def resume_here(peer: str, endpoint: str, saved: Path, cache: Path, resumed_from: int, shuffle: bool
                ) -> dict[str, Any]:
    """The new process of :func:`resume_in_fresh_process`."""
    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(ImportError):
        exec(IMPORTS[peer], {})
    state = torch.load(saved, weights_only=False)
    try:
        t0 = time.perf_counter()
        loader = make_loader(peer, endpoint, cache, world=1, shuffle=shuffle, resumed_from=resumed_from)
        loader.load_state_dict(state)
        it, batch = _first(loader)
        seconds = time.perf_counter() - t0
        ids = _ids(batch)
        del it
        _close(loader)
        return {"seconds": seconds, "ids": ids}
    except Exception as e:  # noqa: BLE001 - a reader's failure is a result
        return {"error": _err(e)}


def ranks_2_to_1(peer: str, endpoint: str, caches: Path, args) -> str:
    import torch.distributed as dist

    try:
        with env(**rank_env(peer, 2)):
            if peer == "mosaic":  # Mosaic wants a process group when WORLD_SIZE > 1: a 1-process one stands in
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            loader = make_loader(peer, endpoint, cache_dir(peer, caches, "w2"), world=2, shuffle=args.shuffle)
            it, batch = _first(loader)
            seen_ids = set(_ids(batch))
            for _ in range(args.early - 1):
                seen_ids.update(_ids(next(it)))
            state = copy.deepcopy(loader.state_dict())
            del it
            _close(loader)
            del loader
        gc.collect()
    except Exception as e:  # noqa: BLE001
        return f"not measured (rank 0 of 2 did not run here: {_err(e)})"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    try:
        with env(**rank_env(peer, 1)):
            _, ids = resume_in_fresh_process(peer, endpoint, cache_dir(peer, caches, "w1"), state, args,
                                             resumed_from=2)
        again = sum(i in seen_ids for i in ids)
        return f"yes (first batch rows {ids[0]}..; {again}/{len(ids)} already seen by rank 0)"
    except Exception as e:  # noqa: BLE001
        return f"no (error {_err(e)})"


# ------------------------------------------------------------------------------------- the project's slot
def ours(endpoint: str, cache: Path, world: int = 1, shuffle: bool = False, batch: int = BATCH):
    """The project's own sharded source (``engine.Shards``) in a plain loop (``DataLoaderFactory`` with the
    registry's text collator, as docs/quickstart.md's plain loop builds it; no Lightning), over the same Parquet
    shards, measured by ``run_peer`` exactly as the peers are. It runs in the project's .venv (``--ours-python``),
    not the peers'. Until ``engine.Shards`` imports, the row says "not available".

    The batch size, workers and S3 options are the peers'; the spec keeps rows up to 512 tokens (the corpus's
    longest), as the peers' collate does; the order is storage order, or with ``shuffle`` the source's own (row
    groups in a seeded order, rows shuffled within its window); rank 0 of ``world`` reads its share. A state saved at
    another world size resumes with the same global batch (``batch``: 64 rows at 1 rank for 2 ranks of 32), as the
    loader requires: the rest of the epoch is then the same steps."""
    try:
        from collators import CollatorRegistry
        from engine import DataLoaderConfig, DataLoaderFactory, Shards
        from task_spec import TaskSpec
    except ImportError as e:  # the only failure that means "not there yet"
        raise NotAvailable(str(e)) from e
    shards = Shards(f"s3://{BUCKET}/parquet", cache_dir=str(cache),
                    storage_options={"key": "testing", "secret": "testing",
                                     "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}})
    spec = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 512})
    collator = CollatorRegistry.get_instance().get_collator(spec, pad_token_id=0)
    config = DataLoaderConfig(batch_size=batch, shuffle=shuffle, seed=0, num_workers=WORKERS, collate_fn=collator)
    return DataLoaderFactory().create_dataloader(shards, config, rank=0, num_replicas=world)


# --------------------------------------------------------------------------------------------- the table
NAMES = {"litdata": "LitData", "mosaic": "Mosaic Streaming", "hf": "HF datasets (streaming)", "ours": "ours (Shards)"}


def _fmt(r: dict[str, Any], key: str, fmt: str) -> str:
    return fmt.format(r[key]) if key in r else "-"


def _resume(r: dict[str, Any], name: str) -> str:
    if f"resume_{name}_error" in r:
        return f"error: {r[f'resume_{name}_error']}"
    if f"resume_{name}_s" not in r:
        return "-"
    exact = {True: "exact", False: "NOT exact", None: "not checked"}[r[f"resume_{name}_exact"]]
    return f"{r[f'resume_{name}_s']:.2f} s (batch {r[f'resume_{name}_at']}, {exact})"


def run_table(results: list[dict[str, Any]]) -> list[str]:
    """The lines of one run's table: every measure of every reader."""
    lines = [
        "| reader | import | first batch (cold) | steady rows/s | steady tokens/s | batches timed | resume early | "
        "resume late | worker USS peak | resume on other ranks (2 -> 1) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |",
    ]
    for r in results:
        name = NAMES.get(r["peer"], r["peer"])
        if "error" in r:
            lines.append(f"| {name} | | {r['error']} | | | | | | | |")
            continue
        lines.append(
            f"| {name} | {_fmt(r, 'import_s', '{:.2f} s')} | {_fmt(r, 'first_batch_s', '{:.2f} s')} | "
            f"{_fmt(r, 'rows_per_s', '{:,.0f}')} | {_fmt(r, 'tokens_per_s', '{:,.0f}')} | "
            f"{r.get('steady_batches', '-')} | {_resume(r, 'early')} | {_resume(r, 'late')} | "
            f"{_fmt(r, 'worker_uss_mib', '{:.0f} MiB')} | {r.get('ranks', '-')} |")
    return lines


def cold_table(runs: list[dict[str, Any]]) -> list[str]:
    """The cold first batch of every reader in every run, its import beside it, and which reader was first."""
    titles = [f"{run['name']} (load {run['load']})" for run in runs]
    lines = ["| reader | " + " | ".join(titles) + " |", "| --- |" + " ---: |" * len(runs)]
    for peer in [r["peer"] for r in runs[0]["results"]]:
        cells = []
        for run in runs:
            r = next(r for r in run["results"] if r["peer"] == peer)
            cells.append(f"{r['first_batch_s']:.2f} s (import {r['import_s']:.2f} s)" if "first_batch_s" in r else
                         r.get("error", "-"))
        lines.append(f"| {NAMES.get(peer, peer)} | " + " | ".join(cells) + " |")
    firsts = []
    for run in runs:
        timed = [r for r in run["results"] if "first_batch_s" in r]
        firsts.append(NAMES.get(min(timed, key=lambda r: r["first_batch_s"])["peer"], "?") if timed else "-")
    lines.append("| first | " + " | ".join(firsts) + " |")
    return lines


def table(runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Sharded corpora streamed from object storage: the peers",
        "",
        f"Corpus: {meta['rows']} rows, {meta['tokens'] / 1e6:.1f} M tokens (lengths 16..512, int32 ids < 32000), "
        f"seed {meta['seed']}; {meta['uploaded_mib']:.0f} MiB uploaded in all to moto's S3 server on 127.0.0.1. "
        f"Batch {BATCH}, num_workers={WORKERS}, padded to the batch max. "
        f"Setup (writing the three layouts, upload): {meta['setup_s']:.0f} s. "
        f"Machine: {meta['machine']}, shared with other work (load averages over 1, 5 and 15 minutes at each run's "
        f"start; timings are one run each, noisy). Code: {meta['code']}.",
        "",
        "Method: docstring of benchmarks/bench_streaming_peers.py. Each run starts every reader in a fresh process; "
        "the first runs where this checkout's compiled caches (Python's and numba's) are "
        f"{meta['caches']}. Resumes load each reader's own state_dict into a new loader in a fresh process's "
        "place (a new dataset and loader over an empty cache); 'exact' = its first batch is the one the first run "
        "delivered after the save.",
        "",
        "## Cold first batch in every run",
        "",
        *cold_table(runs),
    ]
    for run in runs:
        lines += ["", f"## {run['name']}: {run['order']}", "", *run_table(run["results"])]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- main
def run_subprocess(peer: str, endpoint: str, tokens: int, args, python: str | None = None) -> dict[str, Any]:
    """``run_peer`` for one peer in a fresh interpreter (``python``, default this one); its result or its error."""
    python = python or sys.executable
    if not Path(python).exists():
        return {"peer": peer, "error": f"not available (no interpreter {python})"}
    t = time.perf_counter()
    cmd = [python, "-m", "benchmarks.bench_streaming_peers", "--_peer", peer, "--_endpoint", endpoint,
           "--_tokens", str(tokens), "--rows", str(args.rows), "--warmup", str(args.warmup),
           "--early", str(args.early), "--budget", str(args.budget), *(["--shuffle"] if args.shuffle else [])]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.peer_timeout, cwd=ROOT)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if line:
            res = json.loads(line[-1][7:])
        else:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            res = {"peer": peer, "error": f"failed (rc {proc.returncode}): {tail[:200]}"}
            print(proc.stderr[-3000:], file=sys.stderr)
    except subprocess.TimeoutExpired:
        res = {"peer": peer, "error": f"timed out after {args.peer_timeout:.0f} s"}
    print(f"{peer}: {time.perf_counter() - t:.1f} s {json.dumps(res)}", file=sys.stderr, flush=True)
    return res


def compiled_caches() -> list[Path]:
    """This checkout's compiled files: Python's bytecode and numba's cache (both in ``__pycache__`` folders)."""
    return [path for folder in ("collators", "engine", "task_spec") for path in (ROOT / folder).rglob("__pycache__")
            if any(path.iterdir())]


def code_version() -> str:
    """The checkout's commit (and whether its tracked files differ from it)."""
    def git(*arguments: str) -> str:
        return subprocess.run(["git", *arguments], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" with changes" if git("status", "--porcelain", "-uno") else "")


def run(quick: bool = False) -> list[dict[str, Any]]:
    """``python -m benchmarks`` (the project's .venv) runs every bench module: this one needs the peers' own
    virtualenv, so there it adds no rows; run it with ``.venv-peers/bin/python -m benchmarks.bench_streaming_peers``."""
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--quick", action="store_true", help="20k rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=10, help="batches before the steady phase")
    p.add_argument("--early", type=int, default=5, help="batch after which the early state is saved")
    p.add_argument("--budget", type=float, default=20.0, help="seconds at most of steady phase per peer")
    p.add_argument("--peer-timeout", type=float, default=180.0)
    p.add_argument("--runs", type=int, default=3, help="runs of every reader in storage order (the first with "
                   "the compiled caches of a fresh clone, when run from one)")
    p.add_argument("--shuffle", action="store_true", help="one reader: read in its own shuffled order")
    p.add_argument("--shuffled-runs", type=int, default=1, help="runs of every reader in its own shuffled order, "
                   "after the runs in storage order")
    p.add_argument("--peers", default=",".join(PEERS), help="peers to run beside ours; '' for ours alone (the "
                   "project's .venv, which has moto, can then run the whole bench: --ours-python <its python>)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--ours-python", default=str(ROOT / ".venv" / "bin" / "python"),
                   help="interpreter of the project's venv, for ours() (engine.Shards)")
    # internal: one peer in a subprocess
    p.add_argument("--_peer", help=argparse.SUPPRESS)
    p.add_argument("--_endpoint", help=argparse.SUPPRESS)
    p.add_argument("--_tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_resume", help=argparse.SUPPRESS)  # a saved state: resume it in this (fresh) process
    p.add_argument("--_cache", help=argparse.SUPPRESS)
    p.add_argument("--_resumed-from", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rows = 20_000
    if args._resume:
        res = resume_here(args._peer, args._endpoint, Path(args._resume), Path(args._cache), args._resumed_from,
                          args.shuffle)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    if args._peer:
        res = run_peer(args._peer, args._endpoint, args.rows, args._tokens, args)
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per S3 request

    work = Path(tempfile.mkdtemp(prefix="peers-bench-"))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        _, port = server.get_host_and_port()
        endpoint = f"http://127.0.0.1:{port}"
        os.environ.update(s3_env(endpoint))
        t0 = time.perf_counter()
        _, _, tokens = make_corpus(args.rows, args.seed, work)
        layout = {"hf": "parquet", "litdata": "litdata", "mosaic": "mds"}  # each peer's layout (only those run)
        peers = [peer for peer in args.peers.split(",") if peer]
        wanted = {layout[p] for p in peers} | {"parquet"}  # ours reads the Parquet shards
        roots = {name: work / name for name in ("parquet", "litdata", "mds") if name in wanted}
        writers = {"parquet": write_parquet, "litdata": write_litdata, "mds": write_mds}
        side = None
        if "mds" in roots:  # MDS is written in a process of its own meanwhile (the writers are single-threaded)
            import multiprocessing as mp

            side = mp.get_context("fork").Process(target=write_mds, args=(work, roots["mds"]))
            side.start()
        for name in roots:
            if name == "mds":
                continue
            t = time.perf_counter()
            writers[name](work, roots[name])
            print(f"wrote {name} in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        if side is not None:
            side.join()
            if side.exitcode != 0:
                raise RuntimeError(f"writing MDS failed (exit code {side.exitcode})")
            print(f"wrote mds (alongside) by {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        t = time.perf_counter()
        uploaded = upload(endpoint, roots)
        print(f"uploaded {uploaded / 2**20:.0f} MiB in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        setup_s = time.perf_counter() - t0
        caches = "empty" if not compiled_caches() else "filled (not a fresh clone)"
        code = code_version()  # before the first table is written: this file is tracked
        runs = []
        for index in range(args.runs + args.shuffled_runs):
            args.shuffle = index >= args.runs
            load = " ".join(f"{value:.1f}" for value in os.getloadavg())
            results = [run_subprocess(peer, endpoint, tokens, args) for peer in peers]
            results.append(run_subprocess("ours", endpoint, tokens, args, python=args.ours_python))
            name = f"run {index + 1}" + (", compiled caches " + caches if index == 0 else "")
            runs.append({"name": name, "load": load, "results": results,
                         "order": "each reader's own shuffle" if args.shuffle else "storage order (no shuffle)"})
            meta = {"rows": args.rows, "tokens": tokens, "seed": args.seed, "uploaded_mib": uploaded / 2**20,
                    "setup_s": setup_s, "caches": caches, "code": code,
                    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"}
            text = table(runs, meta)  # written after every run: a long benchmark cut short keeps its runs
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
