"""Tokenization of a corpus on a Ray cluster, for data one machine cannot tokenize in time.

The same tokenize step as on one machine (:class:`~engine.sources.tokenizing.preprocess.TokenizeBatch`, which
:func:`~engine.sources.tokenizing.preprocess.tokenize_dataset` runs with ``datasets.map``) runs in Ray Data's
``map_batches`` over Parquet, JSON Lines or CSV files, local or in object storage, and writes a folder of Parquet
shards.

The shards: ``part-00000-0000.parquet``, ``part-00000-0001.parquet``, ... (write task, then file of that task)
whose names sort in the corpus order, each with the same token columns (``input_ids`` and ``labels`` as
``list<int32>``, ``attention_mask`` as ``list<int8>`` as ``datasets.map`` gives it), the input's other columns
before them, and row groups of ``row_group_rows`` rows. Rows are whole (no truncation, as in the module's token
cache; target text is cut to ``max_target_len``), and the same input gives the same files with the same rows in the
same order: Ray runs with ``preserve_order``, and each write task writes its rows in order into files named by its
task index.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from engine.sources.inputs import text_fields
from engine.sources.tokenizing.preprocess import TokenizeBatch
from task_spec import TaskSpec

READERS = {".parquet": "read_parquet", ".jsonl": "read_json", ".json": "read_json", ".csv": "read_csv"}
TASK_ROWS = 4096  # rows per tokenize task
WRITE_CPUS = 0.5  # per write task, which mostly waits on storage
SHARD_NAME = "part-{:05d}-{:04d}.parquet"  # write task, then file of the task
TOKEN_TYPES = {"input_ids": pa.list_(pa.int32()), "attention_mask": pa.list_(pa.int8())}
# The tokenize step is shipped to the workers by value: a worker then imports transformers and pyarrow to run it,
# not this package (whose import brings torch and lightning into every worker).
BY_VALUE = ("engine.sources.tokenizing.preprocess", "engine.sources.tokenizing.ray_tokenize")
INSTALL_HINT = "pip install 'universal-datamodule[ray]'"


class _ArrowTokenize:
    """:class:`TokenizeBatch` on a ``pyarrow.Table``: the text columns are replaced by typed token columns and the
    other columns are kept, before them, in the order ``datasets.map`` gives."""

    def __init__(self, step: TokenizeBatch) -> None:
        self.step = step

    def __call__(self, table: pa.Table) -> pa.Table:
        consumed = [c for c in (self.step.text_field, self.step.target_field) if c is not None]
        for column in consumed:
            if table.column(column).null_count:
                raise ValueError(f"{column!r} should be a string in every row, but {table.column(column).null_count} "
                                 f"rows of a batch hold null; the tokenizer needs text in each row: filter those "
                                 f"rows out or fill them before tokenize_on_ray")
        encoded = self.step({column: table.column(column).to_pylist() for column in consumed})
        out = table.drop_columns(consumed)
        for key, values in encoded.items():
            out = out.append_column(key, pa.array(values, type=TOKEN_TYPES.get(key, pa.list_(pa.int32()))))
        return out


def tokenize_on_ray(
    input: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    *,
    task_spec: TaskSpec,
    tokenizer: Any,
    storage_options: dict[str, Any] | None = None,
    rows_per_file: int | None = 100_000,
    row_group_rows: int = 10_000,
    concurrency: int | None = None,
) -> list[str]:
    """Tokenize the raw text of ``input`` on Ray and write it to ``output_dir`` as Parquet shards.

    Args:
        input: A file, a folder (its ``*.parquet``, ``*.jsonl``/``*.json`` or ``*.csv`` files, in name order), a
            glob or a list of files; local or any fsspec URL (``s3://bucket/corpus/``). One format per call: the
            suffix picks the reader.
        output_dir: The folder the shards are written to, local or an fsspec URL; it must hold no Parquet files.
        task_spec: The task whose text fields are tokenized (``preprocessing_config["text_field"]``, and the
            target text of a seq2seq task), as the module does on one machine.
        tokenizer: A transformers tokenizer; it is pickled to the Ray workers.
        storage_options: fsspec options of ``input`` and ``output_dir`` (``{"key": ..., "secret": ...}``,
            ``{"client_kwargs": {"endpoint_url": ...}}``).
        rows_per_file: Rows per shard: each write task takes at least this many rows and writes them in shards of
            this many, its last shard holding the rest. None: one shard per tokenize task (about 4,096 rows).
        row_group_rows: Rows per Parquet row group.
        concurrency: How many tokenize tasks run at once; None lets Ray choose.

    Returns:
        The paths of the shards written, in corpus order (URLs with their protocol for object storage).

    Raises:
        ImportError: Ray Data is not installed.
        ValueError: An argument is out of range, ``input`` has no files of a known format or mixes formats, the
            text column is missing or is not text, or ``output_dir`` already holds shards.
    """
    try:
        import ray
        import ray.data
    except ImportError as error:
        raise ImportError(f"tokenize_on_ray needs Ray Data, which is not installed: {INSTALL_HINT}") from error
    import fsspec

    _check_options(task_spec, tokenizer, rows_per_file, row_group_rows, concurrency)
    options = dict(storage_options or {})
    in_fs, files = _expand(input, options)
    suffix = _one_format(files)
    out_fs, out_path = fsspec.core.url_to_fs(os.fspath(output_dir), **options)
    existing = out_fs.glob(f"{out_path.rstrip('/')}/*.parquet") if out_fs.exists(out_path) else []
    if existing:
        raise ValueError(f"output_dir {os.fspath(output_dir)!r} already holds {len(existing)} Parquet files (e.g. "
                         f"{existing[0]!r}); give a new or empty folder, so the shards are this corpus alone")

    context = ray.data.DataContext.get_current()
    preserve_order = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    by_value = [m for m in BY_VALUE if m not in ray.cloudpickle.list_registry_pickle_by_value()]
    for module in by_value:
        ray.cloudpickle.register_pickle_by_value(sys.modules[module])
    scratch = f"{out_path.rstrip('/')}/_temporary-{uuid.uuid4().hex}"  # skipped by Shards and pyarrow.dataset
    step = None
    try:
        filesystem = _arrow_filesystem(in_fs, options)
        dataset = getattr(ray.data, READERS[suffix])(files, filesystem=filesystem)
        columns = dataset.schema().names
        step = _tokenize_step(task_spec, tokenizer, columns, dataset.schema())
        # Ray reads small files into one large block; blocks of TASK_ROWS rows spread the work over the workers.
        blocks = dataset.repartition(target_num_rows_per_block=min(TASK_ROWS, rows_per_file or TASK_ROWS))
        tokens = blocks.map_batches(_ArrowTokenize(step), batch_format="pyarrow", batch_size=1000,
                                    concurrency=concurrency, zero_copy_batch=True)
        out_fs.makedirs(scratch, exist_ok=True)
        # Writing asks for less CPU than tokenizing, so Ray keeps the two apart: tokenize tasks of TASK_ROWS rows
        # run in parallel, and each write task gathers their output up to rows_per_file rows. The shards are
        # written to a scratch folder and moved into output_dir once all are written: a run that fails leaves no
        # shard there that would look like a whole corpus.
        tokens.write_datasink(_shard_sink(ray, out_fs, scratch, rows_per_file, row_group_rows),
                              ray_remote_args={"num_cpus": WRITE_CPUS})
        out_fs.invalidate_cache(scratch)
        for path in sorted(out_fs.glob(f"{scratch}/*.parquet")):
            out_fs.mv(path, f"{out_path.rstrip('/')}/{path.rsplit('/', 1)[-1]}")
    except Exception as error:
        bad = _first_bad_row(in_fs, files, suffix, step) if step is not None else None
        if bad is None:
            raise
        raise ValueError(f"tokenize_on_ray failed and wrote nothing to {os.fspath(output_dir)!r}: {bad}; filter "
                         f"the rows without text out of the input, or fill them, and run again") from error
    finally:
        with contextlib.suppress(Exception):
            out_fs.rm(scratch, recursive=True)
        context.execution_options.preserve_order = preserve_order
        for module in by_value:
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[module])
    out_fs.invalidate_cache(out_path)  # object stores cache listings; the workers wrote behind this one's back
    written = sorted(out_fs.glob(f"{out_path.rstrip('/')}/*.parquet"))
    return written if _is_local(out_fs) else [out_fs.unstrip_protocol(path) for path in written]


def _first_bad_row(fs: Any, files: list[str], suffix: str, step: TokenizeBatch) -> str | None:
    """After a failed run: the first row of ``files`` (in corpus order) whose text is null, as ``row <i> of <file>
    holds no text in <column>``, reading only the text columns; None when every row holds text."""
    import pyarrow.compute as pc

    columns = [column for column in (step.text_field, step.target_field) if column is not None]
    for path in files:
        with fs.open(path, "rb") as handle:
            if suffix == ".parquet":
                import pyarrow.parquet as pq

                table = pq.read_table(handle, columns=columns)
            elif suffix == ".csv":
                import pyarrow.csv as pcsv

                table = pcsv.read_csv(handle)
            else:
                import pyarrow.json as pjson

                table = pjson.read_json(handle)
        for column in columns:
            values = table.column(column) if column in table.column_names else None
            if values is not None and values.null_count:
                row = pc.index(pc.is_null(values), True).as_py()
                name = path if _is_local(fs) else fs.unstrip_protocol(path)
                return f"row {row} of {name!r} holds no text in {column!r} (null)"
    return None


def _check_options(spec: TaskSpec, tokenizer: Any, rows_per_file: int | None, row_group_rows: int,
                   concurrency: int | None) -> None:
    if not isinstance(spec, TaskSpec):
        raise ValueError(f"task_spec should be a TaskSpec (e.g. TaskSpec.lm_tiny()), but got {type(spec).__name__}")
    if spec.modality not in ("text", "multimodal"):
        raise ValueError(f"tokenize_on_ray tokenizes raw text, but the task {spec.name!r} has modality "
                         f"{spec.modality!r}; give a text task (e.g. TaskSpec.lm_tiny())")
    if tokenizer is None or not callable(tokenizer):
        raise ValueError(f"tokenizer should be a transformers tokenizer (callable on a list of texts), but got "
                         f"{tokenizer!r}")
    for name, value in (("rows_per_file", rows_per_file), ("concurrency", concurrency)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} should be None or an int >= 1, but got {value!r}")
    if isinstance(row_group_rows, bool) or not isinstance(row_group_rows, int) or row_group_rows < 1:
        raise ValueError(f"row_group_rows should be an int >= 1, but got {row_group_rows!r}")


def _expand(input: Any, options: dict[str, Any]) -> tuple[Any, list[str]]:
    """The fsspec filesystem of ``input`` and its files, a folder's files sorted by name."""
    import fsspec

    given = [input] if isinstance(input, (str, os.PathLike)) else list(input) if isinstance(input, Iterable) else []
    if not given or not all(isinstance(item, (str, os.PathLike)) for item in given):
        raise ValueError(f"input should be a path, a URL or a list of them, but got {input!r}")
    filesystem, files = None, []
    for item in given:
        fs, path = fsspec.core.url_to_fs(os.fspath(item), **options)
        if filesystem is not None and fs.protocol != filesystem.protocol:
            raise ValueError(f"input mixes filesystems ({filesystem.protocol} and {fs.protocol}); give files of "
                             f"one filesystem")
        filesystem = fs
        if fs.isdir(path):
            found = sorted(p for p in fs.find(path) if _suffix(p) in READERS)
            if not found:
                raise ValueError(f"input folder {os.fspath(item)!r} holds no Parquet, JSON Lines or CSV files "
                                 f"(suffixes {sorted(READERS)})")
            files += found
        elif fs.exists(path):
            files.append(path)
        elif any(char in path for char in "*?["):
            found = sorted(fs.glob(path))
            if not found:
                raise ValueError(f"input pattern {os.fspath(item)!r} matches no files")
            files += found
        else:
            raise ValueError(f"input {os.fspath(item)!r} does not exist; give a file, a folder or a glob of "
                             f"Parquet, JSON Lines or CSV files")
    return filesystem, files


def _suffix(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _one_format(files: list[str]) -> str:
    suffixes = sorted({_suffix(path) for path in files})
    unknown = [s for s in suffixes if s not in READERS]
    if unknown:
        raise ValueError(f"input has files of an unknown format ({unknown}); tokenize_on_ray reads "
                         f"{sorted(READERS)} files")
    if len({READERS[s] for s in suffixes}) > 1:
        raise ValueError(f"input mixes formats {suffixes}; give files of one format per call")
    return suffixes[0]


def _is_local(fs: Any) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _arrow_filesystem(fs: Any, options: dict[str, Any]) -> Any:
    """None (Ray's own local reader) for local files without options; else ``fs`` seen through pyarrow."""
    if _is_local(fs) and not options:
        return None
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    return PyFileSystem(FSSpecHandler(fs))


def _tokenize_step(spec: TaskSpec, tokenizer: Any, columns: list[str], schema: Any) -> TokenizeBatch:
    """The step ``tokenize_dataset(..., truncate=False)`` would run on these columns, after checking them."""
    text_field, target_text = text_fields(spec)
    if text_field not in columns:
        raise ValueError(f"input has no text column {text_field!r} for the task {spec.name!r}; available columns: "
                         f"{columns}; rename the column or set preprocessing_config={{'text_field': ...}}")
    if target_text is not None and target_text not in columns:
        target_text = None  # inputs without targets (prediction data) are tokenized alone, as on one machine
    for column in (text_field, target_text):
        if column is None:
            continue
        kind = schema.types[columns.index(column)]
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ValueError(f"text column {column!r} should hold strings, but its type is {kind}; give raw text "
                             f"(token ids need no tokenization)")
    return TokenizeBatch(tokenizer, text_field, target_text, spec.target_field or "labels", None,
                         spec.additional_config.get("max_target_len"))


def _shard_sink(ray: Any, fs: Any, folder: str, rows_per_file: int | None, row_group_rows: int) -> Any:
    """A Ray ``Datasink``: each write task takes at least ``rows_per_file`` rows and writes them, in order, to
    ``part-<task index>-<j>.parquet``, ``rows_per_file`` rows a file (the last of a task holds the rest).

    ``write_parquet`` is not used: its ``pyarrow.dataset.write_dataset`` runs threaded without ``preserve_order``,
    which may reorder rows within a file, and it names files by a random write id."""

    class ShardSink(ray.data.Datasink):
        @property
        def min_rows_per_write(self) -> int | None:
            return rows_per_file

        def write(self, blocks: Iterable[Any], ctx: Any) -> list[str]:
            import pyarrow.parquet as pq

            tables = [block if isinstance(block, pa.Table) else pa.Table.from_pandas(block) for block in blocks]
            tables = [table for table in tables if table.num_rows]
            if not tables:
                return []
            table = pa.concat_tables(tables, promote_options="permissive")
            step = rows_per_file or table.num_rows
            paths = []
            for j, start in enumerate(range(0, table.num_rows, step)):
                path = f"{folder.rstrip('/')}/{SHARD_NAME.format(ctx.task_idx, j)}"
                with fs.open(path, "wb") as file:
                    pq.write_table(table.slice(start, step), file, row_group_size=row_group_rows)
                paths.append(path)
            return paths

        def get_name(self) -> str:
            return "TokenShards"

    return ShardSink()
