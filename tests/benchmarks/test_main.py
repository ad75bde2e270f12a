"""``python -m benchmarks`` writes its table as Markdown: the writer, and ``main``'s ``--out`` and ``--only``, on fake
rows (no benchmark is timed here)."""

from __future__ import annotations

import re
import sys
import types

import pytest
import torch

import benchmarks.__main__ as bench_main
from benchmarks._harness import PERFORMANCE_DOC, markdown_table, result, write_results


@pytest.fixture
def rows():
    return [
        result("text_collate", "pad 64 id lists", anchor="pad_sequence", anchor_s=0.003, ours_s=0.001,
               target="> 1x", minimum=1.0, throughput="18.4 Mtok/s"),
        result("loader_stages", "own path", anchor="-", anchor_s=0.2, ours_s=0.1, note="a | b"),
    ]


class TestMarkdownTable:
    def test_a_line_per_row_with_the_cells_of_the_text_table(self, rows):
        lines = markdown_table(rows).splitlines()
        assert lines[0] == ("| benchmark | case | anchor | anchor ms | ours ms | ratio | throughput | target | met "
                            "| note |")
        assert lines[1] == "|---|---|---|---:|---:|---:|---|---|---|---|"
        assert lines[2] == ("| text_collate | pad 64 id lists | pad_sequence | 3.000 | 1.000 | 3.00x | 18.4 Mtok/s | "
                            "> 1x | yes |  |")
        assert lines[3] == "| loader_stages | own path | - | 200.0 | 100.0 | 2.00x | - | - | - | a \\| b |"
        assert len(lines) == 4


class TestWriteResults:
    def test_the_file_is_headed_by_the_machine_the_command_and_the_date(self, rows, tmp_path):
        path = write_results(tmp_path / "new" / "quick.md", rows, mode="quick", command="python -m benchmarks --quick",
                             machine_lines=["CPU: test CPU", "torch threads: 1"], date="2025-01-31 14:05 UTC",
                             seconds=61.4)
        assert path == tmp_path / "new" / "quick.md"
        text = path.read_text(encoding="utf-8")
        head, table = text.split("\n\n| benchmark", 1)
        assert head.startswith("# Benchmark results: quick run\n")
        assert "`python -m benchmarks --quick`" in head
        for line in ("- date: 2025-01-31 14:05 UTC", "- CPU: test CPU", "- torch threads: 1", "- wall time: 61 s"):
            assert line in head.splitlines()
        assert "failed" not in head
        link = re.search(r"\[docs/performance.md\]\(([^)]+)\)", head).group(1)
        assert (path.parent / link).resolve() == PERFORMANCE_DOC
        assert ("| benchmark" + table).strip() == markdown_table(rows)

    def test_failed_benchmarks_are_named(self, rows, tmp_path):
        text = write_results(tmp_path / "full.md", rows, mode="full", command="python -m benchmarks", machine_lines=[],
                             date="d", seconds=1, failed=["vision", "memory"]).read_text(encoding="utf-8")
        assert text.startswith("# Benchmark results: full run\n")
        assert "- **failed** (rows missing): vision, memory" in text.splitlines()


class TestMain:
    @pytest.fixture
    def fake_benchmark(self, rows, monkeypatch):
        module = types.ModuleType("benchmarks.bench_fake")
        module.run = lambda quick: rows[:1] if quick else rows
        broken = types.ModuleType("benchmarks.bench_broken")
        broken.run = lambda quick: 1 / 0
        monkeypatch.setitem(sys.modules, "benchmarks.bench_fake", module)
        monkeypatch.setitem(sys.modules, "benchmarks.bench_broken", broken)
        monkeypatch.setattr(bench_main, "discover", lambda: ["fake"])
        monkeypatch.setattr(bench_main, "machine", lambda: ["CPU: fake"])
        threads = torch.get_num_threads()
        yield
        torch.set_num_threads(threads)  # main runs single-threaded; the rest of the suite does not

    def test_out_gets_the_table_of_the_mode(self, fake_benchmark, rows, tmp_path, capsys):
        assert bench_main.main(["--quick", "--out", str(tmp_path)]) == 0
        text = (tmp_path / "quick.md").read_text(encoding="utf-8")
        assert f"`python -m benchmarks --quick --out {tmp_path}`" in text and "- CPU: fake" in text
        assert text.rstrip().endswith(markdown_table(rows[:1]))
        assert f"table written to {tmp_path / 'quick.md'}" in capsys.readouterr().out

    def test_the_whole_run_writes_to_the_results_folder(self, fake_benchmark, tmp_path, monkeypatch):
        monkeypatch.setattr(bench_main, "RESULTS", tmp_path)
        assert bench_main.main([]) == 0
        assert (tmp_path / "full.md").read_text(encoding="utf-8").startswith("# Benchmark results: full run\n")

    def test_a_partial_run_writes_only_where_out_is_given(self, fake_benchmark, tmp_path, monkeypatch):
        monkeypatch.setattr(bench_main, "RESULTS", tmp_path)
        assert bench_main.main(["--only", "fake"]) == 0
        assert not list(tmp_path.iterdir())
        assert bench_main.main(["--only", "fake", "--out", str(tmp_path / "some")]) == 0
        assert (tmp_path / "some" / "full.md").exists()

    def test_a_failed_benchmark_is_named_in_the_file_and_the_exit_status(self, fake_benchmark, rows, tmp_path,
                                                                        monkeypatch):
        monkeypatch.setattr(bench_main, "discover", lambda: ["broken", "fake"])
        assert bench_main.main(["--out", str(tmp_path)]) == 1
        text = (tmp_path / "full.md").read_text(encoding="utf-8")
        assert "- **failed** (rows missing): broken" in text.splitlines()
        assert text.rstrip().endswith(markdown_table(rows))
