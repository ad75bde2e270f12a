from __future__ import annotations

import pickle

import pytest
import torch
from torchvision.transforms import v2

from collators import VisionCollator
from engine.datasets import ImageFolderDataset, LoadingMode, StreamingImageFolderDataset

MAP_MODES = [LoadingMode.LAZY, LoadingMode.EAGER, LoadingMode.CACHED]


class TestDiscovery:
    def test_classes_are_sorted_subfolders(self, image_root):
        ds = ImageFolderDataset(image_root[0])
        assert ds.classes == ["cat", "dog", "emu"]
        assert ds.class_to_idx == {"cat": 0, "dog": 1, "emu": 2}
        assert ds.targets.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2]

    def test_images_are_found_recursively_case_insensitively_and_sorted(self, image_root):
        root, _ = image_root
        names = [path.removeprefix(str(root) + "/") for path, _ in ImageFolderDataset(root).samples]
        assert names == ["cat/w.png", "cat/x.png", "cat/y.bmp", "cat/z.png", "dog/a.png", "dog/b.PNG",
                         "dog/sub/c.png", "emu/e1.png", "emu/e2.png"]

    def test_extensions_filter(self, image_root):
        ds = ImageFolderDataset(image_root[0], extensions=["bmp", ".PNG"])
        assert len(ds) == 9
        with pytest.raises(ValueError, match="class folder .*dog.* holds no images with extensions \\('.bmp',\\)"):
            ImageFolderDataset(image_root[0], extensions=[".bmp"])


class TestRows:
    def test_rows_are_uint8_chw_pixels_and_int_labels(self, image_root):
        root, pixels = image_root
        ds = ImageFolderDataset(root)
        for index, (path, label) in enumerate(ds.samples):
            row = ds[index]
            assert row["labels"] == label and isinstance(row["labels"], int)
            assert row["pixel_values"].dtype == torch.uint8 and torch.equal(row["pixel_values"], pixels[path])

    @pytest.mark.parametrize("mode", MAP_MODES[1:])
    def test_every_map_style_mode_gives_the_rows_of_lazy(self, image_root, mode, rows_equal):
        indices = [8, 0, 2, 2, 5]
        lazy = ImageFolderDataset(image_root[0]).__getitems__(indices)
        other = ImageFolderDataset(image_root[0], mode=mode)
        rows_equal(other.__getitems__(indices), lazy)
        rows_equal(other.__getitems__(indices), lazy)

    def test_grayscale_images_become_rgb_unless_asked(self, tmp_path, write_image):
        gray = write_image(tmp_path / "only" / "g.png", 0, mode="L")
        assert torch.equal(ImageFolderDataset(tmp_path)[0]["pixel_values"], gray.expand(3, -1, -1))
        assert torch.equal(ImageFolderDataset(tmp_path, image_mode="GRAY")[0]["pixel_values"], gray)
        assert ImageFolderDataset(tmp_path, image_mode="UNCHANGED")[0]["pixel_values"].shape[0] == 1

    def test_transform_runs_once_per_decode_and_is_cached(self, image_root):
        ds = ImageFolderDataset(image_root[0], mode="eager", transform=v2.Resize((4, 4), antialias=True))
        assert ds[3]["pixel_values"].shape == (3, 4, 4)

    def test_mixed_sizes_can_be_stored_eagerly(self, tmp_path, write_image):
        small = write_image(tmp_path / "a" / "s.png", 0, size=(3, 2))
        large = write_image(tmp_path / "a" / "t.png", 1, size=(5, 7))
        rows = ImageFolderDataset(tmp_path, mode="eager").__getitems__([1, 0])
        assert torch.equal(rows[0]["pixel_values"], large) and torch.equal(rows[1]["pixel_values"], small)


class TestWithCollatorAndWorkers:
    @pytest.mark.parametrize("mode", MAP_MODES)
    def test_two_workers_give_the_batches_of_the_main_process(self, image_root, mode, load, batches_equal):
        ds = ImageFolderDataset(image_root[0], mode=mode)
        collate = VisionCollator(keep_uint8=True)
        batches = load(ds, workers=2, context="fork", collate_fn=collate)
        batches_equal(batches, load(ds, collate_fn=collate))
        assert batches[0]["pixel_values"].dtype == torch.uint8 and batches[0]["pixel_values"].shape == (4, 3, 6, 8)
        assert torch.cat([b["labels"] for b in batches]).tolist() == ds.targets.tolist()

    def test_normalizing_collator_gives_float_batches(self, image_root, load):
        batch = load(ImageFolderDataset(image_root[0]), collate_fn=VisionCollator())[0]
        assert batch["pixel_values"].dtype == torch.float32

    def test_pickles_with_a_transform(self, image_root, rows_equal):
        ds = ImageFolderDataset(image_root[0], transform=v2.Resize((4, 4), antialias=True))
        rows_equal([pickle.loads(pickle.dumps(ds))[1]], [ds[1]])


class TestErrors:
    def test_missing_root(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="image folder not found: .*missing.* is not a directory"):
            ImageFolderDataset(tmp_path / "missing")

    def test_root_without_class_folders(self, tmp_path, write_image):
        write_image(tmp_path / "loose.png", 0)
        with pytest.raises(ValueError, match="has no class subfolders; put each class's images in root/<class"):
            ImageFolderDataset(tmp_path)

    def test_class_folder_without_images(self, image_root):
        (image_root[0] / "empty").mkdir()
        with pytest.raises(ValueError, match="class folder .*empty' holds no images"):
            ImageFolderDataset(image_root[0])

    @pytest.mark.parametrize("content", [b"", b"\x89PNG\r\n\x1a\n garbage"])
    def test_unreadable_image_names_its_path(self, image_root, content):
        root, _ = image_root
        (root / "dog" / "a.png").write_bytes(content)
        ds = ImageFolderDataset(root)
        ds[0]  # other images still read
        with pytest.raises(OSError, match="cannot read image .*dog/a.png"):
            ds[4]
        with pytest.raises(OSError, match="cannot read image .*dog/a.png"):
            ImageFolderDataset(root, mode="eager")

    def test_bad_arguments(self, image_root):
        with pytest.raises(ValueError, match="image_mode should be one of \\['RGB', 'GRAY', 'UNCHANGED'\\]"):
            ImageFolderDataset(image_root[0], image_mode="CMYK")
        with pytest.raises(ValueError, match="extensions should be a non-empty sequence"):
            ImageFolderDataset(image_root[0], extensions=".png")


def test_streaming_mode_constructs_the_streaming_class(image_root):
    ds = ImageFolderDataset(image_root[0], mode="streaming")
    assert type(ds) is StreamingImageFolderDataset
    assert [row["labels"] for row in ds] == ds.targets.tolist()
