"""engine/tools/summary.py: what repr(dm) and the notebook HTML show before and after setup."""

import pytest
import torch

from engine import UniversalDataModule
from engine.tools.summary import describe_value, render_html, render_text, summary_rows
from task_spec import TaskSpec

ROWS = [torch.randint(5, 100, (n,)) for n in range(5, 25)]


def test_before_setup_the_data_and_after_setup_the_splits_and_batch_shapes():
    dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=0.2, seed=3)
    before = dict(summary_rows(dm))
    assert before["data"].startswith("train=20") and "batch" not in before
    dm.setup()
    after = dict(summary_rows(dm))
    assert after["splits"] == "train=16, val=4 (seed=3)"
    assert "'text'" in after["collator"] and "batch_size=4, shuffle=True" in after["loader"]
    assert after["batch"].startswith("input_ids: [4, ") and "labels: [4, " in after["batch"]
    assert render_text(dm).startswith("UniversalDataModule(\n  task: lm_tiny (text, causal_lm)")


def test_html_escapes_names():
    spec = TaskSpec.lm_tiny().replace(name="<b>mine</b>")
    html = render_html(UniversalDataModule(ROWS, task_spec=spec, batch_size=4))
    assert "&lt;b&gt;mine&lt;/b&gt;" in html and "<b>mine</b>" not in html


@pytest.mark.parametrize("batching", ["plain", "grouped", "token_budget", "packed"])
def test_the_batch_line_is_the_loaders_real_first_batch(batching):
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 90, (int(n),), generator=generator) for n in torch.randint(2, 60, (64,),
                                                                                          generator=generator)]
    options = {"max_tokens": 96} if batching in ("token_budget", "packed") else {"batch_size": 4}
    dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batching=batching, seed=5, **options)
    dm.setup()
    loaded = next(iter(dm.train_dataloader()))
    assert all(torch.equal(value, loaded[key]) if isinstance(value, torch.Tensor) else value == loaded[key]
               for key, value in dm.first_batch().items())
    shapes = ", ".join(f"{key}: {describe_value(value)}" for key, value in loaded.items())
    assert f"  batch: {shapes}\n" in repr(dm)
