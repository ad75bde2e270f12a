"""Image-text pairs per second and loader-worker memory: WebDataset tars and Parquet shards, local and on S3.

Method
------
* Data: ONE set of synthetic image-text pairs, seeded (``SEED``): JPEG images (quality 90) of random sizes from
  192 to 384 pixels a side (smooth colour fields plus noise, so they compress as photos do), each with a caption of
  8 to 24 words. The same pairs are written as 4 WebDataset tars (``webdataset.TarWriter``: ``key.jpg``,
  ``key.txt``) and as 4 Parquet files whose ``image`` column is the ``{bytes, path}`` struct of ``datasets``'
  ``Image`` feature (row groups of 64). Object storage: moto's S3 server on 127.0.0.1 (tests/object_store.py),
  both layouts uploaded to one bucket.
* One batch for all (``BATCH`` pairs): ``pixel_values`` float32 ``[B, 3, 224, 224]`` (resized to 224 x 224,
  normalized with CLIP's mean and std) and the captions' ``input_ids`` / ``attention_mask`` padded to the batch's
  longest (the benchmark's local WordLevel tokenizer).
* Loaders, each reading every pair once, in order (no shuffle), ``WORKERS`` loader worker processes (fork):
  - ours: ``UniversalDataModule(Shards(tars or Parquet), task_spec=<contrastive image-text pairs>, tokenizer=...)``:
    a ``modality="multimodal"`` spec (``loss_type="contrastive"``, no target, ``image_size`` 224, CLIP
    normalization) whose built-in ``vision_language`` collator (:class:`collators.multimodal.ImageTextCollator`)
    tokenizes each caption, pads the batch's ids, decodes the JPEGs with ``torchvision.io.decode_image``, resizes
    them to 224 x 224 (bicubic, antialiased, as uint8) and stacks and normalizes them;
  - WebDataset: ``webdataset.WebDataset(urls).decode("pil").to_tuple("jpg", "txt")`` with torchvision's
    ``Resize`` (bicubic, as CLIP's and ours) / ``ToTensor`` / ``Normalize`` per pair, the captions padded by the
    tokenizer, and torch's ``DataLoader`` (the S3 tars through plain HTTP GETs by ``curl`` from presigned URLs,
    webdataset's own way for an ``http://`` URL);
  - HF: ``datasets`` (``Dataset.from_parquet`` on disk, ``load_dataset("parquet", streaming=True)`` from S3) with
    its ``Image`` column decoded to PIL, and a ``transformers`` ``CLIPProcessor`` (``CLIPImageProcessor`` resizing
    to 224 x 224, no crop, and the same tokenizer) in the ``DataLoader``'s ``collate_fn``.
* Measures: pairs per second over one whole pass, from building the dataset to the last batch (ours lists the
  shards and fills its cache in that time, and its cache starts empty on every pass), after one untimed pass of
  each loader (imports, the page cache); the loader workers' peak private memory (psutil USS, the largest worker,
  sampled every 0.1 s; ours trims its C heap after each batch, see ``engine.collation.handoff``). Every pass is
  checked: every pair's caption served exactly once, and ``pixel_values`` of the right shape. 1024 pairs
  (``--quick``: 128).

Results: ``python -m benchmarks --only vlm --out benchmarks/results/vlm``.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._harness import OutputMismatch, result, tokenizer

SEED = 0
BATCH = 32
WORKERS = 2
SIZE = 224
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SHARDS = 4


def make_pairs(count: int) -> list[tuple[str, bytes, str]]:
    """``(key, JPEG bytes, caption)`` of ``count`` pairs, seeded."""
    from PIL import Image

    rng = np.random.default_rng(SEED)
    pairs = []
    for index in range(count):
        height, width = (int(side) for side in rng.integers(192, 385, size=2))
        base = rng.integers(0, 256, size=(4, 4, 3)).astype(np.float32)
        field = np.asarray(Image.fromarray(base.astype(np.uint8)).resize((width, height), Image.BILINEAR), np.float32)
        pixels = np.clip(field + rng.normal(0, 12, size=field.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        words = " ".join(f"w{int(word)}" for word in rng.integers(0, 30_000, size=int(rng.integers(8, 25))))
        pairs.append((f"{index:07d}", buffer.getvalue(), words))
    return pairs


def write_layouts(pairs: list[tuple[str, bytes, str]], folder: Path) -> tuple[Path, Path]:
    """The pairs as WebDataset tars and as Parquet shards of ``Image`` structs; ``(tar folder, parquet folder)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset

    tars, parquet = folder / "tars", folder / "parquet"
    tars.mkdir(parents=True)
    parquet.mkdir(parents=True)
    per = -(-len(pairs) // SHARDS)
    for number in range(SHARDS):
        part = pairs[number * per:(number + 1) * per]
        with webdataset.TarWriter(str(tars / f"shard-{number:05d}.tar")) as writer:
            for key, image, text in part:
                writer.write({"__key__": key, "jpg": image, "txt": text})
        table = pa.table({"image": pa.array([{"bytes": image, "path": f"{key}.jpg"} for key, image, _ in part],
                                            pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                          "text": [text for _, _, text in part]})
        pq.write_table(table, parquet / f"part-{number:05d}.parquet", row_group_size=64)
    return tars, parquet


class PilBatch:
    """WebDataset's side: ``(pixel tensor, caption)`` pairs made per sample by torchvision's PIL transforms,
    stacked, and the captions padded by the tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, samples: list[tuple[torch.Tensor, str]]) -> dict[str, torch.Tensor]:
        text = self.tokenizer([caption for _, caption in samples], padding=True, return_tensors="pt")
        return {"pixel_values": torch.stack([pixels for pixels, _ in samples]), "input_ids": text["input_ids"],
                "attention_mask": text["attention_mask"]}


def pil_transform() -> Callable[[Any], torch.Tensor]:
    from torchvision import transforms

    return transforms.Compose([transforms.Resize((SIZE, SIZE), interpolation=transforms.InterpolationMode.BICUBIC),
                               transforms.ToTensor(),
                               transforms.Normalize(CLIP_MEAN, CLIP_STD)])


class WdsSample:
    """Per sample, in webdataset's pipeline: the decoded PIL image through torchvision's transforms."""

    def __init__(self) -> None:
        self.transform = pil_transform()

    def __call__(self, sample: tuple[Any, str]) -> tuple[torch.Tensor, str]:
        image, caption = sample
        return self.transform(image.convert("RGB")), caption


class ProcessorBatch:
    """HF's side: a ``CLIPProcessor`` over the batch's PIL images and captions."""

    def __init__(self, tokenizer: Any) -> None:
        from transformers import CLIPImageProcessor, CLIPProcessor

        images = CLIPImageProcessor(size={"height": SIZE, "width": SIZE}, do_center_crop=False,
                                    image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD))
        self.processor = CLIPProcessor(image_processor=images, tokenizer=tokenizer)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        out = self.processor(images=[row["image"].convert("RGB") for row in rows], text=[row["text"] for row in rows],
                             padding=True, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "input_ids": out["input_ids"],
                "attention_mask": out["attention_mask"]}


class WorkerMemory:
    """The largest private memory (USS) any child process of this one reached, sampled every 0.1 s."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.1):
            for child in me.children(recursive=True):
                try:
                    self.peak = max(self.peak, child.memory_full_info().uss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def measure(build: Callable[[], Iterable[dict[str, torch.Tensor]]], captions: dict[tuple[int, ...], int],
            what: str) -> tuple[float, int]:
    """``(seconds, peak worker USS)`` of one whole pass of ``build()``'s batches, checked: every caption once."""
    seen: list[int] = []
    with WorkerMemory() as memory:
        start = time.perf_counter()
        for batch in build():
            if tuple(batch["pixel_values"].shape[1:]) != (3, SIZE, SIZE):
                raise OutputMismatch(f"{what}: pixel_values of shape {tuple(batch['pixel_values'].shape)}")
            for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
                seen.append(captions.get(tuple(ids[mask.bool()].tolist()), -1))
        seconds = time.perf_counter() - start
    if sorted(seen) != list(range(len(captions))):
        raise OutputMismatch(f"{what}: served {len(seen)} pairs, not each of the {len(captions)} once")
    return seconds, memory.peak


def loader(dataset: Any, collate: Any) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate,
                                       multiprocessing_context="fork")


def run(quick: bool) -> list[dict[str, Any]]:
    import datasets
    import webdataset
    from tokenizers import pre_tokenizers

    from engine import Shards, UniversalDataModule
    from task_spec import TaskSpec
    from tests.object_store import S3Server

    spec = TaskSpec(name="image_text_pairs", task_type="classification", modality="multimodal",
                    loss_type="contrastive", input_fields=("input_ids",), target_field=None,
                    additional_config={"image_size": SIZE}, preprocessing_config={"normalization": "clip"})

    count = 128 if quick else 1024
    tok = tokenizer()
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # captions are words "w17 w4031 ..."
    pairs = make_pairs(count)
    captions = {tuple(tok(text)["input_ids"]): index for index, (_, _, text) in enumerate(pairs)}
    rows: list[dict[str, Any]] = []
    folder = Path(tempfile.mkdtemp(prefix="bench-vlm-"))
    try:
        tars, parquet = write_layouts(pairs, folder)
        with S3Server() as server:
            server.upload_folder(tars, "tars/")
            server.upload_folder(parquet, "parquet/")
            options = {key: server.storage_options[key] for key in ("key", "secret", "client_kwargs")}
            tar_names = sorted(path.name for path in tars.iterdir())

            def ours(url: str, storage: dict | None) -> Callable[[], Any]:
                def build() -> Any:
                    cache = folder / "cache"
                    shutil.rmtree(cache, ignore_errors=True)
                    data = Shards(url, storage_options=storage, cache_dir=str(cache), shuffle_window=256)
                    dm = UniversalDataModule(data, task_spec=spec, tokenizer=tok, batch_size=BATCH, val_split=0,
                                             shuffle=False, num_workers=WORKERS, multiprocessing_context="fork")
                    return dm.train_dataloader()
                return build

            def wds(urls: list[str]) -> Callable[[], Any]:
                return lambda: loader(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False)
                                      .decode("pil").to_tuple("jpg", "txt").map(WdsSample()), PilBatch(tok))

            def hf_local() -> Any:
                data = datasets.Dataset.from_parquet(sorted(str(path) for path in parquet.iterdir()),
                                                     features=datasets.Features({"image": datasets.Image(),
                                                                                 "text": datasets.Value("string")}),
                                                     cache_dir=str(folder / "hf-cache"))
                return loader(data, ProcessorBatch(tok))

            def hf_s3() -> Any:
                data = datasets.load_dataset("parquet", data_files=server.url("parquet/*.parquet"), split="train",
                                             streaming=True, storage_options=server.storage_options,
                                             features=datasets.Features({"image": datasets.Image(),
                                                                         "text": datasets.Value("string")}))
                return loader(data, ProcessorBatch(tok))

            http = [server.client.generate_presigned_url(  # the bucket is private: presigned GETs, as for curl
                "get_object", Params={"Bucket": server.bucket_name, "Key": f"tars/{name}"}, ExpiresIn=3600)
                for name in tar_names]
            cases = [
                ("WebDataset tars, local", "webdataset + DataLoader",
                 wds([str(tars / name) for name in tar_names]), ours(str(tars), None)),
                ("WebDataset tars, moto S3", "webdataset (curl, presigned URLs) + DataLoader", wds(http),
                 ours(server.url("tars/"), options)),
                ("Parquet Image structs, local", "HF datasets + CLIPProcessor", hf_local, ours(str(parquet), None)),
                ("Parquet Image structs, moto S3", "HF datasets streaming + CLIPProcessor", hf_s3,
                 ours(server.url("parquet/"), options)),
            ]
            for case, anchor, theirs_build, ours_build in cases:
                for build in (theirs_build, ours_build):  # a first pass each: imports, page cache, forked code
                    measure(build, captions, case)
                theirs_s, theirs_mem = measure(theirs_build, captions, f"{anchor} ({case})")
                ours_s, ours_mem = measure(ours_build, captions, f"ours ({case})")
                rows.append(result(
                    "vlm", f"{case}: {count} pairs, batch {BATCH}, {WORKERS} workers", anchor=anchor,
                    anchor_s=theirs_s, ours_s=ours_s, target="ahead (ratio > 1)", minimum=1.0,
                    throughput=f"{count / ours_s:.0f} vs {count / theirs_s:.0f} pairs/s",
                    note=f"worker USS peak: ours {ours_mem / 2**20:.0f} MiB, anchor {theirs_mem / 2**20:.0f} MiB; "
                         f"ours: Shards + the vision_language collator (ImageTextCollator)"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows
