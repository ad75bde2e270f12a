"""Small image-text corpora for the image-text source tests: WebDataset tars, Parquet shards of ``datasets``'
``Image`` struct, each sample a PNG whose colour and ``json`` name its number, and a collator that decodes them."""

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image

from task_spec import TaskSpec

SPEC = TaskSpec.vision_tiny().replace(input_fields=("image",), target_field="label",
                                      additional_config={"num_classes": 2, "image_size": [3, 4, 6]})
CORRUPT = b"\x89PNG\r\n\x1a\n not an image"


def png(doc: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (6, 4), (doc % 256, doc // 256, 7)).save(buffer, format="PNG")
    return buffer.getvalue()


def samples(start: int, count: int, corrupt: int | None = None) -> list[dict]:
    """Samples as ``webdataset.TarWriter`` takes them: ``__key__``, ``png``, ``txt``, ``json``, ``cls``."""
    return [{"__key__": f"sample{doc:05d}", "png": CORRUPT if doc == corrupt else png(doc),
             "txt": f"a picture of number {doc}", "json": {"doc": doc}, "cls": doc % 2}
            for doc in range(start, start + count)]


def write_tars(folder: Path, files: int = 3, per_file: int = 100, corrupt: int | None = None) -> Path:
    """``files`` WebDataset tars of ``per_file`` samples, written by ``webdataset.TarWriter``."""
    import webdataset

    folder.mkdir(parents=True, exist_ok=True)
    for number in range(files):
        with webdataset.TarWriter(str(folder / f"shard-{number:05d}.tar")) as writer:
            for sample in samples(number * per_file, per_file, corrupt):
                writer.write(sample)
    return folder


def write_image_parquet(folder: Path, files: int = 3, per_file: int = 100, corrupt: int | None = None) -> Path:
    """The same samples as Parquet shards of an ``image`` struct ``{bytes, path}`` (as ``datasets`` writes its
    ``Image`` feature), ``text``, ``label`` and ``doc``; row groups of 32."""
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(files):
        rows = samples(number * per_file, per_file, corrupt)
        table = pa.table({
            "image": pa.array([{"bytes": row["png"], "path": f"{row['__key__']}.png"} for row in rows],
                              pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "text": [row["txt"] for row in rows], "label": [row["cls"] for row in rows],
            "doc": [row["json"]["doc"] for row in rows]})
        pq.write_table(table, folder / f"part-{number:03d}.parquet", row_group_size=32)
    return folder


class DecodeImages:
    """A collator of image-text rows: each encoded image (bytes, or the ``{bytes, path}`` struct) decoded to uint8
    CHW in the worker; ``image`` [B, 3, H, W], ``label``, and ``doc`` (read from the row's ``json`` or ``doc``)."""

    def __call__(self, rows: list[dict]) -> dict:
        from torchvision.io import ImageReadMode, decode_image

        images = []
        for row in rows:
            data = row["image"]["bytes"] if isinstance(row["image"], dict) else row["image"]
            images.append(decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB))
        docs = [json.loads(row["json"])["doc"] if "json" in row else row["doc"] for row in rows]
        return {"image": torch.stack(images), "label": torch.tensor([row["label"] for row in rows]),
                "doc": torch.tensor(docs)}


def served(batches) -> list[int]:
    """The sample numbers batches served, checked against each image's colour."""
    out = []
    for batch in batches:
        for image, doc in zip(batch["image"], batch["doc"].tolist()):
            assert (int(image[0, 0, 0]), int(image[1, 0, 0])) == (doc % 256, doc // 256), "image and row disagree"
            out.append(doc)
    return out
