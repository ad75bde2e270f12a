"""A small tokenized corpus written as Parquet shards, for the sharded-source tests: each row holds its corpus
index in ``doc``, so a test can tell exactly which rows a loader served."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from task_spec import TaskSpec

SPEC = TaskSpec.lm_tiny()


def corpus_rows(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, 500, size=int(rng.integers(3, 40))).tolist() for _ in range(count)]


def write_corpus(folder: Path, files: int = 4, rows_per_file: int = 150, row_group_rows: int = 40,
                 kind: str = "parquet", seed: int = 0) -> list[list[int]]:
    """``files`` shards of ``rows_per_file`` rows in ``folder`` (row groups of ``row_group_rows``); the rows."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = corpus_rows(files * rows_per_file, seed)
    for number in range(files):
        part = slice(number * rows_per_file, (number + 1) * rows_per_file)
        table = pa.table({"input_ids": pa.array(rows[part], pa.list_(pa.int32())),
                          "doc": pa.array(range(part.start, part.stop), pa.int64())})
        if kind == "parquet":
            pq.write_table(table, folder / f"part-{number:03d}.parquet", row_group_size=row_group_rows)
        else:  # "arrow": the IPC file format; "stream": the IPC stream format (what datasets writes)
            new = pa.ipc.new_file if kind == "arrow" else pa.ipc.new_stream
            with pa.OSFile(str(folder / f"part-{number:03d}.arrow"), "wb") as sink, new(sink, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=row_group_rows):
                    writer.write_batch(batch)
    return rows


def docs(batches) -> list[int]:
    """The corpus indices a loader's batches served, in order."""
    return [int(doc) for batch in batches for doc in batch["doc"]]
