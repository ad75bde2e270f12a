"""Two real processes (gloo on CPU) over the same raw text: the text is tokenized once, by local rank 0, and the
other rank loads the cached result."""

import sys
from pathlib import Path

from tests.distributed._counting_tokenizer import counted
from tests.distributed._torchrun_tokenize import TEXTS
from tests.distributed.test_two_processes import launch

ROOT = Path(__file__).resolve().parents[2]


def test_torchrun_ranks_tokenize_the_text_once(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(ROOT / "tests" / "distributed" / "_torchrun_tokenize.py"), str(tmp_path)]
    ranks = launch(command, tmp_path, timeout=180)
    assert sorted(counted(tmp_path / "counter.txt")) == sorted(TEXTS)  # each text once, not once per rank
    assert len(list((tmp_path / "cache").iterdir())) == 1
    assert ranks[0]["sizes"] == ranks[1]["sizes"] and ranks[0]["report"] == ranks[1]["report"]
    assert ranks[0]["report"]["out_rows"] > ranks[0]["report"]["rows"] == 54  # long documents were split
    assert ranks[0]["batches"] == ranks[1]["batches"] > 0
