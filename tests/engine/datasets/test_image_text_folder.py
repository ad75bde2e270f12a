"""ImageTextFolder: images with same-named .txt captions or metadata.jsonl / metadata.csv rows, served encoded; a
corrupt image left out where the collator decodes it, named by its file."""

import json

import pytest

from engine import UniversalDataModule
from engine.datasets import ImageTextFolder
from tests.engine.sources.shards.image_text import CORRUPT, SPEC, DecodeImages, png, served
from tests.engine.sources.test_bad_rows import no_hang


def write_folder(root, count=24, corrupt=None):
    """``count`` images in two subfolders; even ones captioned by .txt files, odd ones by a metadata.jsonl row in
    their folder, which also gives every image its ``doc`` and ``label`` (both kept in the row)."""
    for part in ("a", "b"):
        (root / part).mkdir(parents=True)
    metadata = {"a": [], "b": []}
    for doc in range(count):
        part = "a" if doc < count // 2 else "b"
        (root / part / f"{doc:03d}.png").write_bytes(CORRUPT if doc == corrupt else png(doc))
        row = {"file_name": f"{doc:03d}.png", "doc": doc, "label": doc % 2}
        if doc % 2:
            row["text"] = f"odd picture {doc}"
        else:
            (root / part / f"{doc:03d}.txt").write_text(f"even picture {doc}\n")
        metadata[part].append(row)
    for part, rows in metadata.items():
        (root / part / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_rows_hold_the_encoded_image_its_caption_and_its_metadata(tmp_path):
    rows = ImageTextFolder(write_folder(tmp_path / "pics"))
    assert len(rows) == 24
    assert rows[0] == {"image": png(0), "__key__": "a/000", "text": "even picture 0", "doc": 0, "label": 0}
    assert rows[13] == {"image": png(13), "__key__": "b/013", "text": "odd picture 13", "doc": 13, "label": 1}


def test_metadata_csv_is_read_as_datasets_imagefolder_reads_it(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "x.png").write_bytes(png(1))
    (tmp_path / "pics" / "metadata.csv").write_text("file_name,text,source\nx.png,a red square,web\n")
    assert ImageTextFolder(tmp_path / "pics")[0] == {"image": png(1), "__key__": "x", "text": "a red square",
                                                     "source": "web"}


def test_an_image_without_a_caption_is_refused_naming_it_and_the_fix(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "x.png").write_bytes(png(1))
    with pytest.raises(ValueError, match=r"image 'x.png' of .* has no caption: put it in 'x.txt' beside the image"):
        ImageTextFolder(tmp_path / "pics")
    (tmp_path / "pics" / "metadata.jsonl").write_text('{"file_name": "y.png", "text": "gone"}\n')
    (tmp_path / "pics" / "x.txt").write_text("here")
    with pytest.raises(ValueError, match=r"metadata rows of .* name images that are not there: \['y.png'\]"):
        ImageTextFolder(tmp_path / "pics")


def test_a_module_serves_every_image_once_and_leaves_out_a_corrupt_one_naming_its_file(tmp_path):
    dm = UniversalDataModule(ImageTextFolder(write_folder(tmp_path / "pics")), task_spec=SPEC, batch_size=4,
                             val_split=0, seed=1, collate_fn=DecodeImages())
    with no_hang(120):
        assert sorted(served(dm.train_dataloader())) == list(range(24))
    dm = UniversalDataModule(ImageTextFolder(write_folder(tmp_path / "bad", corrupt=5)), task_spec=SPEC,
                             batch_size=4, val_split=0, seed=1, collate_fn=DecodeImages(), on_error="skip",
                             num_workers=2, multiprocessing_context="fork")
    with no_hang(120):
        assert sorted(served(dm.train_dataloader())) == [doc for doc in range(24) if doc != 5]
    (record,) = dm.skipped.records
    assert record.index == 5 and f"file '{tmp_path / 'bad' / 'a' / '005.png'}'" in record.message
