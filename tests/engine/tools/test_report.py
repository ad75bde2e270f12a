"""engine/tools/report.py: dm.report()'s numbers against values computed independently, its figures and its page."""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from collators._padding import padded_length
from demo import sample_data
from engine import MultiDataModule, UniversalDataModule
from engine.tools import report_numbers
from engine.tools.report import DataReport, collect
from task_spec import TaskSpec

LM = TaskSpec.lm_tiny()  # max_seq_len 128: rows longer than that are truncated by the collator


def token_rows(count: int = 120, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 160, (count,), generator=generator)
    return [torch.randint(5, 500, (int(n),), generator=generator) for n in lengths]


def module(rows, **options) -> UniversalDataModule:
    return UniversalDataModule(rows, **{"task_spec": LM, "batch_size": 8, "val_split": 0.25, "seed": 3, **options})


def loader_padding_share(dm: UniversalDataModule) -> float:
    """Padding share of the batches the module's train loader really yields in its first epoch (from the masks)."""
    real = positions = 0
    for batch in dm.train_dataloader():
        real += int(batch["attention_mask"].sum())
        positions += batch["attention_mask"].numel()
    return 1 - real / positions


def numbers_of(dm: UniversalDataModule) -> dict:
    """``dm.report().numbers`` without drawing the figures (the page tests below draw them)."""
    dm.setup()
    return collect(dm)[0]


def plots(page: str) -> list[str]:
    return re.findall(r'<figure class="udm-plot" data-plot="([^"]+)"><svg', page)


class TestNumbers:
    def test_split_lengths_and_truncation_equal_a_python_pass_over_the_rows(self):
        rows = token_rows()
        dm = module(rows, batching="grouped")
        numbers = numbers_of(dm)
        assert numbers["split_sizes"] == {"train": 90, "val": 30}
        for role in ("train", "val"):
            lengths = [len(rows[i]) for i in getattr(dm.split_plan, role).tolist()]
            stats = numbers["lengths"][role]
            assert (stats["rows"], stats["total"], stats["min"], stats["max"]) == (
                len(lengths), sum(lengths), min(lengths), max(lengths))
            assert stats["median"] == float(np.median(lengths))
            assert numbers["length_how"][role] == "flat-buffer shapes"
        long = [n for n in (len(rows[i]) for i in dm.split_plan.train.tolist()) if n > 128]
        assert numbers["truncation"]["train"] == dm.truncation == {
            "rows": 90, "long_rows": len(long), "tokens": sum(len(rows[i]) for i in dm.split_plan.train.tolist()),
            "lost_tokens": sum(n - 128 for n in long)}
        assert long, "the data should hold rows the collator truncates"

    @pytest.mark.parametrize("batching", ["plain", "grouped"])
    def test_padding_shares_equal_those_of_the_batches_the_loaders_yield(self, batching):
        rows = token_rows()
        numbers = numbers_of(module(rows, batching=batching))
        assert numbers["padding"]["batching"] == batching
        assert numbers["padding"]["plain"] == pytest.approx(loader_padding_share(module(rows)), abs=1e-12)
        assert numbers["padding"]["chosen"] == pytest.approx(
            loader_padding_share(module(rows, batching=batching)), abs=1e-12)
        if batching == "grouped":
            assert numbers["padding"]["chosen"] < numbers["padding"]["plain"] / 3

    def test_plain_batching_is_told_what_grouped_batching_would_cut_measured_on_its_loader(self):
        rows = token_rows()
        numbers = numbers_of(module(rows))
        grouped = loader_padding_share(module(rows, batching="grouped"))
        assert numbers["padding"]["grouped"] == pytest.approx(grouped, abs=1e-12)
        assert numbers["padding"]["advice"] == (f"batching='grouped' would cut padding from "
                                                f"{numbers['padding']['plain']:.1%} to {grouped:.1%} of the positions "
                                                f"(rows of similar length batched together, batches shuffled)")
        assert f"  advice: {numbers['padding']['advice']}" in str(module(rows).report())
        assert "advice" not in numbers_of(module(rows, batching="grouped"))["padding"]

    def test_rows_of_one_length_get_no_grouping_advice(self):
        numbers = numbers_of(module([torch.arange(5, 25)] * 40))
        assert numbers["padding"]["plain"] == 0.0 and "advice" not in numbers["padding"]

    def test_packed_batches_have_no_padding_and_the_report_says_so(self):
        dm = module(token_rows(), batching="packed", max_tokens=512)
        numbers = numbers_of(dm)
        batches = list(dm.train_dataloader())
        assert all(batch["input_ids"].shape[1] == int(batch["cu_seq_lens_q"][-1]) for batch in batches)  # no pad
        assert numbers["padding"]["batching"] == "packed" and numbers["padding"]["chosen"] == 0.0
        assert numbers["padding"]["plain"] > 0.2

    def test_label_counts_equal_a_counter_over_the_label_column(self, tokenizer):
        data = sample_data.classification_dataset(200)
        dm = UniversalDataModule(data, task_spec=TaskSpec.cls_tiny(), tokenizer=tokenizer, batch_size=16,
                                 val_split=0.2, seed=1)
        numbers = numbers_of(dm)
        labels = data["labels"][:]
        for role in ("train", "val"):
            counts = collections.Counter(labels[i] for i in getattr(dm.split_plan, role).tolist())
            assert numbers["labels"][role] == {0: counts[0], 1: counts[1]}
            assert numbers["label_how"][role] == "the Arrow label column"
        assert numbers["lengths"]["train"]["rows"] == 160 and numbers["length_how"]["train"] == "Arrow list offsets"

    def test_the_sample_batch_is_the_first_batch_the_train_loader_yields(self, tokenizer):
        data = sample_data.classification_dataset(64)
        options = dict(task_spec=TaskSpec.cls_tiny(), tokenizer=tokenizer, batch_size=8, seed=5, batching="grouped")
        report = UniversalDataModule(data, **options).report()
        first = next(iter(UniversalDataModule(data, **options).train_dataloader()))
        assert report.numbers["sample_batch"]["input_ids"] == f"{list(first['input_ids'].shape)} int64"
        row = first["input_ids"][0][first["attention_mask"][0].bool()].tolist()
        assert report.sample_lines[1] == f"label={int(first['labels'][0])}: {tokenizer.decode(row)}"[:160]

    def test_the_report_leaves_the_train_loader_as_it_was(self):
        rows = token_rows()
        reported = module(rows, batching="grouped")
        numbers_of(reported)
        fresh = module(rows, batching="grouped")
        for ours, theirs in zip(reported.train_dataloader(), fresh.train_dataloader()):
            assert torch.equal(ours["input_ids"], theirs["input_ids"])

    def test_a_source_without_columns_is_read_row_by_row_only_below_the_limit(self, monkeypatch):
        dm = UniversalDataModule(sample_data.audio_dataset(40), task_spec=TaskSpec.audio_tiny(), batch_size=8,
                                 val_split=0.25)
        numbers = numbers_of(dm)
        assert numbers["length_how"]["train"] == "a pass over its 30 rows (no length column)"
        waves = [sample_data.audio_dataset(40)[i]["input_values"] for i in dm.split_plan.train.tolist()]
        assert numbers["lengths"]["train"]["total"] == sum(len(wave) for wave in waves)
        monkeypatch.setattr(report_numbers, "ROW_PASS_LIMIT", 20)
        numbers = numbers_of(dm)
        assert "train" not in numbers["lengths"] and "30 rows without a length column" in numbers["skipped"]["train"]
        assert numbers["padding"] is None and "train" not in numbers["labels"]

    @settings(max_examples=60, deadline=None)
    @given(longest=st.lists(st.integers(1, 300), min_size=1, max_size=20), max_length=st.none() | st.integers(1, 256),
           multiple=st.none() | st.integers(1, 16), static=st.booleans(), buckets=st.booleans())
    def test_vectorized_widths_equal_the_collators_padded_length(self, longest, max_length, multiple, static,
                                                                 buckets):
        padding = "max_length" if static and max_length is not None else "longest"
        widths = (64, 512) if buckets and padding == "longest" and (max_length or 301) <= 512 else None

        class Options:
            pass

        options = Options()
        options.max_length, options.pad_to_multiple_of, options.padding, options.pad_to_buckets = (
            max_length, multiple, padding, widths)
        expected = [padded_length(n, max_length=max_length, pad_to_multiple_of=multiple, padding=padding,
                                  buckets=widths) for n in longest]
        assert report_numbers.padded_widths(np.array(longest), options).tolist() == expected


class TestPage:
    def test_html_holds_one_figure_per_plot_and_the_numbers(self, tokenizer, tmp_path):
        data = sample_data.classification_dataset(200)
        dm = UniversalDataModule(data, task_spec=TaskSpec.cls_tiny(), tokenizer=tokenizer, batch_size=16,
                                 val_split=0.2, batching="grouped")
        report = dm.report()
        page = report._repr_html_()
        assert plots(page) == ["lengths-train", "lengths-val", "padding", "labels"]
        assert page.count("<svg") == 4 and page.count("</svg>") == 4
        padding, labels = report.numbers["padding"], report.numbers["labels"]
        assert "train=160, val=40" in page
        assert f"plain shuffle {padding['plain']:.1%}; grouped (this module) {padding['chosen']:.1%}" in page
        assert f"0: {labels['val'][0]}, 1: {labels['val'][1]}" in page
        assert "<details><summary>collator options</summary><code>TextCollator(task_type=" in page
        saved = report.save(tmp_path / "reports" / "cls.html").read_text(encoding="utf-8")
        assert saved.startswith("<!doctype html>") and plots(saved) == plots(page)
        assert dm._repr_html_().count("<svg") == 4  # the notebook view of a set-up module is the report

    def test_vision_shows_an_image_grid_and_labels_but_no_lengths(self):
        dm = UniversalDataModule(sample_data.image_dataset(48), task_spec=TaskSpec.vision_tiny(), batch_size=8,
                                 val_split=0.25)
        report = dm.report()
        page = report._repr_html_()
        assert plots(page) == ["labels", "sample-images"]
        grid = page[page.index('data-plot="sample-images"'):]
        assert grid[: grid.index("</svg>")].count("<image") == 8  # one embedded PNG per image of the batch
        assert report.numbers["lengths"] == {} and report.numbers["padding"] is None

    def test_an_image_folder_shows_its_image_column_as_a_grid_and_its_class_names(self, tmp_path):
        from PIL import Image

        for label, name in enumerate(["cat", "dog"]):
            (tmp_path / name).mkdir()
            for i in range(4 + label):
                Image.fromarray(np.full((6, 5, 3), 40 * label + i, dtype=np.uint8)).save(tmp_path / name / f"{i}.png")
        spec = TaskSpec.vision_tiny().replace(input_fields=("image",), target_field="label",
                                              additional_config={"num_classes": 2})
        report = UniversalDataModule(tmp_path, task_spec=spec, batch_size=4, seed=0).report()
        page = report._repr_html_()
        assert plots(page) == ["labels", "sample-images"]
        assert report.numbers["class_names"] == ["cat", "dog"]
        assert "  labels train: cat (0)=4, dog (1)=5" in str(report)
        grid = page[page.index('data-plot="sample-images"'):page.index("</svg>", page.index('data-plot="sample-im'))]
        assert grid.count("<image") == 4 and ("cat" in grid or "dog" in grid)
        assert ">cat<" in page[page.index('data-plot="labels"'):]  # the label bars are named too

    def test_text_is_short_and_names_what_was_measured(self):
        report = module(token_rows(), batching="grouped").report()
        text = str(report)
        assert isinstance(report, DataReport) and text.startswith("UniversalDataModule report: lm_tiny")
        assert "  splits: train=90, val=30 (seed=3)" in text and "  padding: plain shuffle " in text
        assert max(len(line) for line in text.splitlines()) <= 170


class TestSummary:
    def test_repr_keeps_the_collator_to_one_short_line_with_its_options_on_demand(self):
        dm = module(token_rows())
        collator = next(line for line in repr(dm).splitlines() if "collator:" in line)
        assert collator == "  collator: TextCollator from 'text': registered for modality='text'"
        page = dm._repr_html_()  # not set up: the short table, options behind <details>
        assert "<svg" not in page and f"<code>{repr(dm.collator)}</code>".replace("'", "&#x27;") in page
        assert not dm.datasets, "the notebook view must not set the module up"

    def test_report_of_several_named_datasets_names_the_children(self):
        dm = MultiDataModule({"a": token_rows(20), "b": token_rows(20, seed=1)}, task_spec=LM, batch_size=4)
        with pytest.raises(ValueError, match=r"report\(\) describes one dataset: pass name= one of \['a', 'b'\]"):
            dm.report()
        assert dm.report("a").numbers["split_sizes"] == {"train": 20}

    def test_a_stream_reports_its_first_rows_and_says_what_it_did_not_measure(self):
        rows = [list(range(5, 5 + n)) for n in range(3, 23)]
        stream = datasets.Dataset.from_dict({"input_ids": rows}).to_iterable_dataset()
        report = UniversalDataModule(stream, task_spec=LM, batch_size=4).report()
        assert report.numbers["split_sizes"] == {"train": None} and report.numbers["padding"] is None
        assert report.numbers["skipped"] == {"train": "a stream: its length is unknown until it is read"}
        assert report.sample_lines[1:] == [str(row) for row in rows[:4]]  # no tokenizer: the ids themselves
        assert "  not measured train: a stream" in str(report)

    def test_an_hf_view_maps_lengths_through_its_indices(self):
        data = datasets.Dataset.from_dict({"input_ids": [[5] * n for n in range(1, 41)]}).select(range(39, -1, -1))
        dm = UniversalDataModule(data, task_spec=LM, batch_size=4, shuffle=False)
        assert numbers_of(dm)["lengths"]["train"]["max"] == 40


class ImportsAtImportTime(ast.NodeVisitor):
    """The modules a file imports when it is imported: every import outside a function body."""

    def __init__(self):
        self.names: list[str] = []

    def visit_FunctionDef(self, node):  # runs when called, not when imported
        pass

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        self.names += [alias.name for alias in node.names]

    def visit_ImportFrom(self, node):
        self.names.append(node.module or "")


def test_the_engine_imports_matplotlib_only_inside_the_functions_that_draw():
    """No module of ours imports matplotlib at import time, so ``import engine`` does not pay for it (lightning's
    torchmetrics still imports it when it is installed; that is outside this package)."""
    root = Path(__file__).resolve().parents[3]
    offenders = []
    for path in sorted([*(root / "engine").rglob("*.py"), *(root / "collators").rglob("*.py")]):
        visitor = ImportsAtImportTime()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        offenders += [f"{path.relative_to(root)}: {name}" for name in visitor.names if name.startswith("matplotlib")]
    assert not offenders, offenders
    assert "matplotlib" in (root / "engine" / "tools" / "figures.py").read_text(encoding="utf-8")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=300))
def test_length_bins_are_whole_lengths_of_one_width_covering_every_row(lengths):
    from engine.tools.figures import integer_bins

    values = np.array(lengths)
    edges = integer_bins(values)
    widths = np.diff(edges)
    assert edges.dtype.kind == "i" and len(set(widths.tolist())) == 1 and len(widths) <= 40
    assert edges[0] == values.min() and edges[-2] <= values.max() < edges[-1]
    counts, _ = np.histogram(values, bins=edges)
    assert counts.sum() == len(values)
    low = values.min()
    assert all(counts[i] == int(((values >= low + i * widths[0]) & (values < low + (i + 1) * widths[0])).sum())
               for i in range(len(counts)))
