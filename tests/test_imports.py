"""Startup: each process imports what its task needs. A text task's loader workers import no torchvision,
torchaudio, matplotlib or pandas, a vision task's workers collating uint8 tensors no torchvision either, and a
plain training loop imports no Lightning (docs/performance.md, "Startup").

Each check runs in a fresh interpreter: this test process has imported everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("matplotlib", "pandas", "torchaudio", "torchvision")
LIGHTNING = ("lightning", "pytorch_lightning")

WORKER_SCRIPT = '''
import sys


class ReportsModules:
    """The collator's batch, plus the top-level modules loaded in the worker process that made it."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, rows):
        batch = self.collator(rows)
        batch["modules"] = sorted({name.split(".")[0] for name in sys.modules})
        return batch


if __name__ == "__main__":  # a spawned worker imports this file again as __mp_main__, without running this part
    import json

    import torch

    from collators import CollatorRegistry
    from engine import DataLoaderConfig, DataLoaderFactory
    from task_spec import TaskSpec

    if sys.argv[1] == "text":
        collator = CollatorRegistry.get_instance().get_collator(TaskSpec.lm_tiny(), pad_token_id=0)
        rows = [torch.arange(1, 3 + n) for n in range(8)]
    else:
        collator = CollatorRegistry.get_instance().get_collator(TaskSpec.vision_tiny())
        rows = torch.utils.data.StackDataset(pixel_values=torch.arange(8, dtype=torch.uint8).repeat_interleave(48)
                                             .view(8, 3, 4, 4), labels=torch.arange(8) % 2)
    config = DataLoaderConfig(batch_size=4, num_workers=1, multiprocessing_context="spawn", timeout=120,
                              collate_fn=ReportsModules(collator))
    batch = list(DataLoaderFactory().create_dataloader(rows, config))[-1]  # the worker's last batch
    print(json.dumps({"worker": batch["modules"], "keys": sorted(batch),
                      "parent": sorted({name.split(".")[0] for name in sys.modules})}))
'''


def run_python(*arguments: str) -> str:
    """Stdout of a fresh interpreter that runs ``arguments`` with this checkout first on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, *arguments], capture_output=True, text=True, timeout=300, env=env,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_a_spawned_text_worker_imports_no_vision_audio_figures_or_dataframes(tmp_path):
    script = tmp_path / "worker_modules.py"
    script.write_text(WORKER_SCRIPT)
    report = json.loads(run_python(str(script), "text").splitlines()[-1])
    assert report["keys"] == ["attention_mask", "input_ids", "labels", "modules"]
    assert {"collators", "engine", "torch"} <= set(report["worker"])  # it did unpickle the text collator
    assert [name for name in HEAVY + LIGHTNING + ("numba",) if name in report["worker"]] == []  # numpy twins
    assert [name for name in HEAVY + LIGHTNING if name in report["parent"]] == []


def test_a_spawned_vision_worker_collating_uint8_tensors_imports_no_torchvision(tmp_path):
    script = tmp_path / "worker_modules.py"
    script.write_text(WORKER_SCRIPT)
    report = json.loads(run_python(str(script), "vision").splitlines()[-1])
    assert report["keys"] == ["labels", "modules", "pixel_values"]
    assert {"collators", "engine", "torch"} <= set(report["worker"])  # it did unpickle the vision collator
    assert [name for name in HEAVY + LIGHTNING + ("numba",) if name in report["worker"]] == []  # numpy twin
    assert [name for name in HEAVY + LIGHTNING if name in report["parent"]] == []


def test_collators_and_task_spec_import_no_collator_module():
    code = ("import sys, collators, task_spec; from collators import CollatorRegistry; "
            "print(sorted(name for name in sys.modules if name.startswith(('collators.', 'torchvision', "
            "'torchaudio', 'numba'))))")
    assert json.loads(run_python("-c", code).replace("'", '"')) == [
        "collators._registration", "collators.builtins", "collators.registry"]


def test_a_plain_loop_imports_no_lightning_until_the_module_is_read():
    code = """
import sys
import engine
from engine import DataLoaderFactory, Mixture, SeededBatchSampler, Shards, DataMonitor
print(sorted(name for name in ("lightning", "pytorch_lightning") if name in sys.modules))
import lightning
from engine import UniversalDataModule
print(issubclass(UniversalDataModule, lightning.LightningDataModule), "UniversalDataModule" in dir(engine))
"""
    assert run_python("-c", code).splitlines() == ["[]", "True True"]


def test_a_plain_loop_over_the_data_module_imports_no_lightning():
    code = """
import sys
import torch
from engine import DataModule, build_multi_loader
from task_spec import TaskSpec
rows = [torch.arange(1, 2 + n % 9) for n in range(40)]
dm = DataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=8, seed=3)
train = [batch["input_ids"].shape[0] for batch in dm.train_dataloader()]
val = [batch["input_ids"].shape[0] for batch in dm.val_dataloader()]
state = dm.state_dict()
multi = list(build_multi_loader({"a": [1, 2], "b": [3]}))
print(sum(train), sum(val), sorted(state), len(multi))
print(sorted(name for name in ("lightning", "pytorch_lightning") if name in sys.modules))
"""
    assert run_python("-c", code).splitlines() == ["32 8 ['state'] 3", "[]"]


@pytest.mark.parametrize("package", ["collators", "engine"])
def test_every_public_name_is_read_lazily_from_its_module(package):
    module = __import__(package)
    assert set(module._LAZY) <= set(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nothing'"):
        module.nothing  # noqa: B018
