"""Tests for demo.run and the ``python -m engine demo`` command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from demo import run as demo
from engine import __main__ as cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick_rows():
    return demo.run_demo(quick=True)


class TestRunDemo:
    def test_every_task_runs_and_its_loss_falls(self, quick_rows):
        assert [row["task"] for row in quick_rows] == list(demo.TASKS)
        for row in quick_rows:
            assert row["steps"] == demo.QUICK_STEPS, row["task"]
            assert row["loss_end"] < row["loss_start"], row
            assert row["val_loss_end"] < row["val_loss_start"], row

    def test_rows_describe_splits_collator_and_batches(self, quick_rows):
        rows = {row["task"]: row for row in quick_rows}
        for row in quick_rows:
            sizes = row["split_sizes"]
            assert sizes["train"] > 0 and sizes["val"] > 0
            assert row["collator"] and row["reason"]
            assert row["batch_shapes"]["labels"][0] == 16
        for task in ("lm", "mlm", "cls", "seq2seq"):
            shapes = rows[task]["batch_shapes"]
            assert shapes["input_ids"] == shapes["attention_mask"]
            assert 0 < rows[task]["padding_share"] < 1
        assert rows["lm"]["batch_shapes"]["labels"] == rows["lm"]["batch_shapes"]["input_ids"]
        assert rows["cls"]["batch_shapes"]["labels"] == [16]
        assert rows["vision"]["batch_shapes"]["pixel_values"] == [16, 3, 32, 32]
        assert rows["vision"]["padding_share"] is None
        audio = rows["audio"]["batch_shapes"]
        assert audio["input_features"][:2] == [16, 40]
        assert audio["input_values"] == audio["attention_mask"]
        assert 0 < rows["audio"]["padding_share"] < 1
        vlm = rows["vlm"]
        assert vlm["batch_shapes"]["pixel_values"] == [16, 3, 32, 32] and vlm["batch_shapes"]["images_per_row"] == [16]
        assert vlm["images"].startswith("16 images (16 at 32x32); image tokens per row min 16, mean 16.0, max 16; "
                                        "tokens: text ")

    def test_prints_one_table_per_task(self, quick_rows, capsys):
        print("\n\n".join(demo.format_row(row) for row in quick_rows))
        out = capsys.readouterr().out
        for row in quick_rows:
            assert f"{row['task']}: {row['spec']}" in out
        for label in ("splits", "collator", "batch", "padding share", "train loss"):
            assert out.count(f"  {label} ") == len(quick_rows)

    def test_deterministic(self):
        first, second = (demo.run_demo(max_steps=6, tasks=("cls",))[0] for _ in range(2))
        assert first["loss_start"] == second["loss_start"]
        assert first["loss_end"] == second["loss_end"]

    def test_bad_arguments_raise(self):
        with pytest.raises(ValueError, match=r"max_steps should be an int >= 2 .*, but got max_steps=1"):
            demo.run_demo(max_steps=1)
        with pytest.raises(ValueError, match=r"tasks should be among .*, but got \['nope'\]"):
            demo.run_demo(tasks=("nope",))


class TestCli:
    def test_exit_code_zero_on_success_and_the_report_is_written_where_it_says(self, tmp_path):
        result = subprocess.run(
            [sys.executable, "-m", "engine", "demo", "--tasks", "cls", "--max-steps", "6", "--reports",
             str(tmp_path / "reports")], cwd=ROOT, capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "cls: cls_tiny" in result.stdout
        page = tmp_path / "reports" / "cls.html"
        assert f"  report         {page}" in result.stdout and page.read_text(encoding="utf-8").count("<svg") == 4
        assert f"data reports (open in a browser): {tmp_path / 'reports'}/<task>.html" in result.stdout


class TestReports:
    def test_each_task_writes_a_report_with_its_figures_and_numbers(self, tmp_path):
        rows = demo.run_demo(max_steps=2, tasks=("lm", "vision", "audio", "vlm"), report_dir=tmp_path, quick=True)
        expected = {"lm": ["lengths-train", "lengths-val", "padding"], "vlm": ["sample-images"],
                    "vision": ["labels", "sample-images"],
                    "audio": ["lengths-train", "lengths-val", "padding", "labels"]}
        for row in rows:
            page = Path(row["report"]).read_text(encoding="utf-8")
            assert row["report"] == str(tmp_path / f"{row['task']}.html")
            assert re.findall(r'data-plot="([^"]+)"><svg', page) == expected[row["task"]], row["task"]
            sizes = row["split_sizes"]
            assert f"train={sizes['train']}, val={sizes['val']} (seed=0)" in page
            assert f"{row['collator']!r}".replace("'", "&#x27;") in page
        assert "image tokens per row min 16, mean 16.0, max 16" in Path(rows[-1]["report"]).read_text(encoding="utf-8")

    def test_exit_code_one_when_a_loss_does_not_fall(self, monkeypatch, capsys):
        stuck = {"task": "lm", "loss_start": 1.0, "loss_end": 1.5}
        monkeypatch.setattr(demo, "run_demo", lambda **kwargs: [stuck])
        assert cli.main(["demo", "--quick"]) == 1
        assert "the lm loss did not fall (1.000 -> 1.500)" in capsys.readouterr().err

    @pytest.mark.parametrize("argv", [["demo", "--max-steps", "1"], ["demo", "--tasks", "lm,nope"], []])
    def test_bad_arguments_exit_two(self, argv, capsys):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
