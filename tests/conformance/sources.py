"""The conformance suite's sources: one maker per kind of data the engine takes, each building the same known rows.

Every kind serves :data:`ROWS` rows whose contents are known here (:func:`known_rows`), so a test can tell which row
each batch served from the batch alone (:func:`served_rows`): token rows are told apart by their ids, images by
their colour. A maker returns the ``train_data`` (and, for a mixture, the ``mix=`` option); a row can be changed
(``changed=``) to check that the data fingerprint catches it, and one row can be made unreadable (``bad=``) where
the kind can hold such a row.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from task_spec import TaskSpec

ROWS = 40
"""Rows of every source: 10 batches of 4 per epoch under plain batching."""
BAD_ROW = 13
"""The row a ``bad=True`` maker makes unreadable (or a raising transform refuses)."""
CHANGED_ROW = 1
"""The row a ``changed=True`` maker changes: one that no sampling of evenly spaced rows reads."""
SPEC = TaskSpec.lm_tiny()
IMAGE_SPEC = TaskSpec.vision_tiny().replace(input_fields=("image",), target_field="label",
                                            additional_config={"num_classes": 2, "image_size": [3, 4, 6]})
WORDS = ("fox", "bird", "owl", "deer", "rabbit", "wolf", "heron", "bear", "squirrel", "horse", "swan", "trees",
         "hill", "lake", "fog", "river", "forest", "rocks", "meadow", "moon", "mountain", "pond", "rain", "sun",
         "winter", "snow", "night", "spring", "stars")


def token_row(doc: int, changed: bool = False) -> list[int]:
    """Row ``doc``'s token ids: 3 to 13 of them, the first one ``10 + doc`` so that no two rows are equal."""
    length = 3 + (doc * 5) % 11
    ids = [10 + doc] + [50 + (doc * 7 + j * 3) % 300 for j in range(length - 1)]
    return [ids[0], 999, *ids[2:]] if changed and doc == CHANGED_ROW else ids


def text_row(doc: int, changed: bool = False) -> str:
    """Row ``doc``'s text: 2 to 9 words, the first two naming the row."""
    words = [WORDS[doc % len(WORDS)], WORDS[(doc // len(WORDS) + 3) % len(WORDS)]]
    words += [WORDS[(doc * 3 + j) % len(WORDS)] for j in range(doc % 8)]
    return " ".join(["changed", *words]) if changed and doc == CHANGED_ROW else " ".join(words)


@functools.lru_cache(maxsize=1)
def tokenizer() -> Any:
    from demo.sample_data import build_tokenizer

    return build_tokenizer()


@dataclass(frozen=True)
class Rows:
    """What a row holds: ``tokens`` (pre-tokenized ``input_ids``), ``text`` (raw text and a tokenizer) or ``images``."""

    kind: str

    @property
    def spec(self) -> TaskSpec:
        return IMAGE_SPEC if self.kind == "images" else SPEC

    def module_options(self) -> dict[str, Any]:
        if self.kind == "text":
            return {"tokenizer": tokenizer()}
        if self.kind == "images":
            return {"device_normalize": True}  # uint8 batches: a row is told by its colour
        return {}

    def records(self, changed: bool = False) -> list[dict[str, Any]]:
        """Every row as a dict of plain values, with its ``doc`` number."""
        if self.kind == "tokens":
            return [{"input_ids": token_row(doc, changed), "doc": doc} for doc in range(ROWS)]
        if self.kind == "text":
            return [{"text": text_row(doc, changed), "doc": doc} for doc in range(ROWS)]
        raise ValueError(f"rows of kind {self.kind!r} are files, not records")

    def known(self) -> dict[tuple, int]:
        """Each row's content as the collator serves it (token ids, or an image's colour) -> its doc number."""
        if self.kind == "tokens":
            contents = [tuple(token_row(doc)) for doc in range(ROWS)]
        elif self.kind == "text":
            contents = [tuple(tokenizer()(text_row(doc))["input_ids"]) for doc in range(ROWS)]
        else:
            contents = [image_colour(doc)[:2] for doc in range(ROWS)]
        assert len(set(contents)) == ROWS, "the known rows must be told apart by their contents"
        return dict(zip(contents, range(ROWS)))


def image_colour(doc: int, changed: bool = False) -> tuple[int, int, int]:
    return (6 * doc + (1 if changed and doc == CHANGED_ROW else 0), 100 + doc % 2, 7)


# ----------------------------------------------------------------------------------------------------------------
# a user-defined source: rows of an sqlite3 table, read by batch


class SQLiteRows:
    """A user's own source: the rows of an sqlite3 table ``rows(doc, input_ids or text)``, read a batch at a time.

    It is what the engine asks of any map-style source: ``__len__``, ``__getitems__(indices) -> list[dict]``
    (``__getitem__`` for one row), plus ``fingerprint()`` (a hash of the table, so that a changed row is caught on
    resume) and ``lengths(key)`` (each row's token count, read from a column, without reading the rows).
    The connection is opened in each process that reads (workers included), never pickled.
    """

    def __init__(self, path: str | Path, *, fail_on: int | None = None) -> None:
        self.path, self.fail_on = str(path), fail_on
        self._connection: sqlite3.Connection | None = None
        self.field = "input_ids" if "input_ids" in self._columns() else "text"
        self._count = self._query("SELECT COUNT(*) FROM rows")[0][0]

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = sqlite3.connect(self.path, check_same_thread=False)
        return self._connection

    def _query(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        return self._db().execute(sql, parameters).fetchall()

    def _columns(self) -> list[str]:
        return [row[1] for row in self._query("PRAGMA table_info(rows)")]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_connection": None}

    def __len__(self) -> int:
        return self._count

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        if self.fail_on is not None and self.fail_on in indices:
            # one row fails to read: the engine's on_error="skip" then reads the batch's rows one by one
            if len(indices) == 1:
                raise OSError(f"row {self.fail_on} of {self.path} is unreadable")
            return [self[index] for index in indices]
        marks = ",".join("?" * len(indices))
        found = dict(self._query(f"SELECT doc, {self.field} FROM rows WHERE doc IN ({marks})", tuple(indices)))
        return [self._row(index, found[index]) for index in indices]

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index == self.fail_on:
            raise OSError(f"row {index} of {self.path} is unreadable")
        ((value,),) = self._query(f"SELECT {self.field} FROM rows WHERE doc = ?", (index,))
        return self._row(index, value)

    def _row(self, index: int, value: Any) -> dict[str, Any]:
        value = torch.tensor(json.loads(value)) if self.field == "input_ids" else value
        return {self.field: value, "doc": index}

    def fingerprint(self) -> str:
        """A hash of every row of the table: reading ids and lengths is cheap next to a training run."""
        digest = hashlib.blake2b(digest_size=12)
        for doc, value in self._query(f"SELECT doc, {self.field} FROM rows ORDER BY doc"):
            digest.update(f"{doc}:{value};".encode())
        return digest.hexdigest()

    def lengths(self, key: str) -> np.ndarray | None:
        """Each row's token count, from the table's ``length`` column; None for a key it does not measure."""
        if key != "input_ids" or self.field != "input_ids":
            return None
        return np.array([n for (n,) in self._query("SELECT length FROM rows ORDER BY doc")], dtype=np.int64)


def write_sqlite(path: Path, records: list[dict[str, Any]]) -> Path:
    field = "input_ids" if "input_ids" in records[0] else "text"
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE rows (doc INTEGER PRIMARY KEY, {field} TEXT, length INTEGER)")
        db.executemany("INSERT INTO rows VALUES (?, ?, ?)", [
            (row["doc"], json.dumps(row[field]) if field == "input_ids" else row[field],
             len(row[field]) if field == "input_ids" else None) for row in records])
    db.close()
    return path


# ----------------------------------------------------------------------------------------------------------------
# a map-style torch Dataset


class TorchRows(torch.utils.data.Dataset):
    """A plain map-style torch ``Dataset`` of dict rows (``__getitem__`` and ``__len__`` only)."""

    def __init__(self, records: list[dict[str, Any]], fail_on: int | None = None) -> None:
        self.records, self.fail_on = records, fail_on

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index == self.fail_on:
            raise OSError(f"row {index} is unreadable")
        row = self.records[index]
        return {key: torch.tensor(value) if key == "input_ids" else value for key, value in row.items()}


# ----------------------------------------------------------------------------------------------------------------
# the makers


@dataclass(frozen=True)
class Kind:
    """One kind of source: its name, the row kinds it can hold, whether it can hold an unreadable row of its own
    (else a raising transform stands for one), and whether it is map-style (else a stream)."""

    name: str
    rows: tuple[str, ...] = ("tokens", "text")
    own_bad_row: bool = False
    stream: bool = False


KINDS = {kind.name: kind for kind in [
    Kind("tensors", rows=("tokens",)),
    Kind("torch", own_bad_row=True),
    Kind("hf"),
    Kind("dataframe"),
    Kind("jsonl"),
    Kind("parquet_file"),
    Kind("image_folder", rows=("images",), own_bad_row=True),
    Kind("shards_parquet", rows=("tokens",)),
    Kind("shards_arrow", rows=("tokens",)),
    Kind("shards_s3", rows=("tokens",)),
    Kind("shards_images", rows=("images",), own_bad_row=True),
    Kind("shards_tar", rows=("images",), own_bad_row=True),
    Kind("shards_tar_s3", rows=("images",), own_bad_row=True),
    Kind("image_text_folder", rows=("images",), own_bad_row=True),
    Kind("stream", stream=True),
    Kind("mixture"),
    Kind("user_sqlite", own_bad_row=True),
]}
"""Every kind of source the suite holds to the contract, by name."""


class Maker:
    """Builds a kind's data in ``folder``; ``s3`` is a fixture's bucket, asked for only by ``shards_s3`` and
    ``shards_tar_s3``.

    File-backed data stay where they were first written: ``made(changed=True)`` rewrites the same files (or objects)
    in place with one row changed, as a user's corpus changes under a checkpoint, and ``made()`` writes the known
    rows back. In-memory data are built anew on every call.
    """

    def __init__(self, kind: str, rows: Rows, folder: Path, s3: Any = None) -> None:
        self.kind, self.rows, self.folder, self.s3 = KINDS[kind], rows, folder, s3
        self._on_disk: dict[Path, bool] = {}  # folder -> whether its files hold the changed row

    def __call__(self, *, changed: bool = False, bad: bool = False) -> dict[str, Any]:
        """``{"train_data": ..., other module options}`` for one module."""
        where = self.folder / f"{self.kind.name}-{self.rows.kind}{'-bad' if bad else ''}"
        write = self._on_disk.get(where) != changed
        where.mkdir(parents=True, exist_ok=True)
        self._on_disk[where] = changed
        made = getattr(self, f"_{self.kind.name}")(where, changed, bad, write)
        return made if isinstance(made, dict) else {"train_data": made}

    def records(self, changed: bool) -> list[dict[str, Any]]:
        return self.rows.records(changed)

    def _tensors(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        return [torch.tensor(row["input_ids"]) for row in self.records(changed)]

    def _torch(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        return TorchRows(self.records(changed), fail_on=BAD_ROW if bad else None)

    def _hf(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        import datasets

        return datasets.Dataset.from_list(self.records(changed))

    def _dataframe(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        import pandas as pd

        return pd.DataFrame(self.records(changed))

    def _jsonl(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        path = where / "rows.jsonl"
        if write:
            path.write_text("".join(json.dumps(row) + "\n" for row in self.records(changed)))
        return str(path)

    def _parquet_file(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = where / "rows.parquet"
        if write:
            pq.write_table(pa.Table.from_pylist(self.records(changed)), path, row_group_size=16)
        return str(path)

    def _image_folder(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        from PIL import Image

        for doc in range(ROWS if write else 0):  # files sort by name in row order: folders c0 (even rows), c1 (odd)
            folder = where / f"c{doc % 2}"
            folder.mkdir(exist_ok=True)
            path = folder / f"{doc:03d}.png"
            if bad and doc == BAD_ROW:
                path.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
            else:
                Image.new("RGB", (6, 4), image_colour(doc, changed)).save(path)
        return str(where)

    def _shard_table(self, changed: bool) -> Any:
        import pyarrow as pa

        records = self.records(changed)
        return pa.table({"input_ids": pa.array([row["input_ids"] for row in records], pa.list_(pa.int32())),
                         "doc": pa.array([row["doc"] for row in records], pa.int64())})

    def _write_shards(self, where: Path, changed: bool, suffix: str) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table, folder = self._shard_table(changed), where / "corpus"
        folder.mkdir(exist_ok=True)
        for number, start in enumerate(range(0, ROWS, 16)):  # 3 shards of 16, 16 and 8 rows; row groups of 6
            part = table.slice(start, 16)
            if suffix == "parquet":
                pq.write_table(part, folder / f"part-{number:03d}.parquet", row_group_size=6)
            else:
                with pa.OSFile(str(folder / f"part-{number:03d}.arrow"), "wb") as sink, \
                        pa.ipc.new_file(sink, part.schema) as writer:
                    for batch in part.to_batches(max_chunksize=6):
                        writer.write_batch(batch)
        return folder

    def _shards_folder(self, where: Path, changed: bool, suffix: str, write: bool) -> Path:
        return self._write_shards(where, changed, suffix) if write else where / "corpus"

    def _shards_parquet(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        from engine import Shards

        return Shards(str(self._shards_folder(where, changed, "parquet", write)), cache_dir=str(where / "cache"),
                      shuffle_window=16)

    def _shards_arrow(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        from engine import Shards

        return Shards(str(self._shards_folder(where, changed, "arrow", write)), cache_dir=str(where / "cache"),
                      shuffle_window=16)

    def _shards_s3(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        from engine import Shards

        prefix = f"{where.name}/"
        if write:
            self.s3.upload_folder(self._write_shards(where, changed, "parquet"), prefix)
        options = self.s3.storage_options
        return Shards(self.s3.url(prefix), cache_dir=str(where / "cache"), shuffle_window=16, retry_wait=0.01,
                      storage_options={key: options[key] for key in ("key", "secret", "client_kwargs")})

    def _image_samples(self, changed: bool, bad: bool) -> list[dict[str, Any]]:
        """Every row as an image-text sample: its PNG (corrupt for the bad row), caption, label and key."""
        return [{"__key__": f"{doc:03d}", "png": b"\x89PNG\r\n\x1a\n not an image" if bad and doc == BAD_ROW
                 else png_bytes(image_colour(doc, changed)), "txt": f"picture {doc}", "cls": doc % 2}
                for doc in range(ROWS)]

    def _write_tars(self, where: Path, changed: bool, bad: bool) -> Path:
        import webdataset

        folder = where / "tars"
        folder.mkdir(exist_ok=True)
        samples = self._image_samples(changed, bad)
        for number, start in enumerate(range(0, ROWS, 16)):  # 3 tars of 16, 16 and 8 samples
            with webdataset.TarWriter(str(folder / f"shard-{number:05d}.tar")) as writer:
                for sample in samples[start:start + 16]:
                    writer.write(sample)
        return folder

    def _shards_tar(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        from engine import Shards

        folder = self._write_tars(where, changed, bad) if write else where / "tars"
        return {"train_data": Shards(str(folder), cache_dir=str(where / "cache"), shuffle_window=16),
                "collate_fn": DecodedImages()}

    def _shards_tar_s3(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        from engine import Shards

        prefix = f"{where.name}/"
        if write:
            self.s3.upload_folder(self._write_tars(where, changed, bad), prefix)
        options = self.s3.storage_options
        return {"train_data": Shards(self.s3.url(prefix), cache_dir=str(where / "cache"), shuffle_window=16,
                                     retry_wait=0.01, storage_options={key: options[key] for key in
                                                                       ("key", "secret", "client_kwargs")}),
                "collate_fn": DecodedImages()}

    def _shards_images(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from engine import Shards

        folder = where / "corpus"
        if write:
            folder.mkdir(exist_ok=True)
            samples = self._image_samples(changed, bad)
            table = pa.table({  # the image as datasets writes its Image feature: a {bytes, path} struct
                "image": pa.array([{"bytes": row["png"], "path": f"{row['__key__']}.png"} for row in samples],
                                  pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                "text": [row["txt"] for row in samples], "label": [row["cls"] for row in samples]})
            for number, start in enumerate(range(0, ROWS, 16)):  # 3 shards of 16, 16 and 8 rows; row groups of 6
                pq.write_table(table.slice(start, 16), folder / f"part-{number:03d}.parquet", row_group_size=6)
        return {"train_data": Shards(str(folder), cache_dir=str(where / "cache"), shuffle_window=16),
                "collate_fn": DecodedImages()}

    def _image_text_folder(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        from engine.datasets import ImageTextFolder

        for sample in self._image_samples(changed, bad) if write else ():
            (where / f"{sample['__key__']}.png").write_bytes(sample["png"])
            (where / f"{sample['__key__']}.txt").write_text(sample["txt"])
        if write:
            (where / "metadata.jsonl").write_text("".join(
                json.dumps({"file_name": f"{doc:03d}.png", "label": doc % 2}) + "\n" for doc in range(ROWS)))
        return {"train_data": ImageTextFolder(where), "collate_fn": DecodedImages()}

    def _stream(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        import datasets

        return datasets.Dataset.from_list(self.records(changed)).to_iterable_dataset(num_shards=2)

    def _mixture(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        import datasets

        records = self.records(changed)  # two sources: an HF dataset and a torch Dataset (an HF one for raw text,
        # which a mixture refuses to take beside a torch Dataset: see the refusals)
        code = TorchRows(records[24:]) if self.rows.kind == "tokens" else datasets.Dataset.from_list(records[24:])
        return {"train_data": {"web": datasets.Dataset.from_list(records[:24]), "code": code},
                "mix": {"web": 0.6, "code": 0.4}}

    def _user_sqlite(self, where: Path, changed: bool, bad: bool, write: bool) -> Any:
        path = where / "rows.sqlite"
        if write:
            path.unlink(missing_ok=True)
            write_sqlite(path, self.records(changed))
        return SQLiteRows(path, fail_on=BAD_ROW if bad else None)


def png_bytes(colour: tuple[int, int, int]) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (6, 4), colour).save(buffer, format="PNG")
    return buffer.getvalue()


class DecodedImages:
    """The image-text kinds' collator: each row's image, encoded (bytes, or the ``{bytes, path}`` struct) or
    already a uint8 CHW tensor (a transform decoded it), decoded where it is collated, stacked uint8; and the
    labels. A corrupt image raises here, in the loader's worker, where ``on_error`` leaves its row out."""

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"image": torch.stack([decoded_image(row["image"]) for row in rows]),
                "label": torch.tensor([int(row["label"]) for row in rows])}


def decoded_image(image: Any) -> torch.Tensor:
    """A uint8 CHW tensor of an encoded image (bytes or a ``{bytes, path}`` struct), or ``image`` if it is one."""
    from torchvision.io import ImageReadMode, decode_image

    if isinstance(image, torch.Tensor):
        return image
    data = image["bytes"] if isinstance(image, dict) else image
    return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)


# ----------------------------------------------------------------------------------------------------------------
# which rows a batch served


def batch_rows(batch: dict[str, Any], rows: Rows) -> list[tuple]:
    """Each row of ``batch`` as its content (as in :meth:`Rows.known`), in batch order."""
    if rows.kind == "images":
        pixels = batch["image"]
        assert pixels.dtype == torch.uint8, "images are kept uint8 (device_normalize=True)"
        return [tuple(int(channel) for channel in image[:, 0, 0]) for image in pixels]
    ids = batch["input_ids"]
    if "cu_seq_lens_q" in batch:  # packed: one [1, T] sequence cut at the documents' boundaries
        bounds = batch["cu_seq_lens_q"].tolist()
        return [tuple(ids[0, start:stop].tolist()) for start, stop in zip(bounds, bounds[1:])]
    mask = batch["attention_mask"].bool()
    return [tuple(row[keep].tolist()) for row, keep in zip(ids, mask)]


def served_rows(batches: list[dict[str, Any]], rows: Rows, known: dict[tuple, int],
                transformed: bool = False) -> list[int]:
    """The doc numbers ``batches`` served, in order; every row must be one of the known rows (a transformed row
    is a known row with one token appended)."""
    served = []
    for batch in batches:
        for content in batch_rows(batch, rows):
            if rows.kind == "images":  # (red, green) tell the row; blue is 7 unless a transform drew it
                key = content[:2]
                assert transformed or content[2] == 7, f"an image's colour changed: {content}"
            else:
                key = content[:-1] if transformed else content
            assert key in known, f"a batch served a row that is none of the known rows: {content}"
            served.append(known[key])
    return served
