"""The demo behind ``make demo``: one short training run per preset task, with a table of what the engine chose.

For each preset (lm, mlm, cls, seq2seq, vision, audio, vlm) the demo builds a :class:`UniversalDataModule` over the
bundled sample data, trains a tiny model for a few dozen steps on the CPU, and prints the split sizes, the collator
the registry chose and why, the shapes of a train batch, the padding share and the training loss at the start and
the end. Everything is local and deterministic: the tokenizer is trained on the bundled corpus, nothing downloads.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar

from demo import models as demo_models
from demo import sample_data
from engine.tools.report_numbers import describe_images, image_numbers
from task_spec import TaskSpec

TASKS = ("lm", "mlm", "cls", "seq2seq", "vision", "audio", "vlm")
DEFAULT_STEPS = 100
QUICK_STEPS = 20
WINDOW = 5
"""Training losses averaged at each end of a run to give 'loss start' and 'loss end'."""
EVAL_BATCHES = 2
"""Fixed validation batches scored before and after training."""


def _text_spec(preset: TaskSpec, tokenizer: Any, **config: Any) -> TaskSpec:
    """``preset`` with the local tokenizer's special token ids and vocabulary size."""
    special = {name: getattr(tokenizer, name) for name in (
        "pad_token_id", "unk_token_id", "bos_token_id", "eos_token_id", "mask_token_id", "cls_token_id",
        "sep_token_id")}
    if "decoder_start_token_id" in preset.special_tokens:
        special["decoder_start_token_id"] = tokenizer.bos_token_id
    return preset.replace(
        special_tokens=special,
        additional_config={**preset.additional_config, "vocab_size": len(tokenizer), "max_seq_len": 64, **config},
    )


def _lm(tokenizer: Any, quick: bool) -> tuple[TaskSpec, Any, demo_models.DemoModel]:
    spec = _text_spec(TaskSpec.lm_tiny(), tokenizer)
    return spec, sample_data.text_dataset(), demo_models.CausalLM(len(tokenizer))


def _mlm(tokenizer: Any, quick: bool) -> tuple[TaskSpec, Any, demo_models.DemoModel]:
    spec = _text_spec(TaskSpec.mlm_tiny(), tokenizer)
    return spec, sample_data.text_dataset(), demo_models.MaskedLM(len(tokenizer))


def _cls(tokenizer: Any, quick: bool) -> tuple[TaskSpec, Any, demo_models.DemoModel]:
    spec = _text_spec(TaskSpec.cls_tiny(), tokenizer)
    model = demo_models.TextClassifier(len(tokenizer), spec.num_classes, lr=1e-2)
    return spec, sample_data.classification_dataset(), model


def _seq2seq(tokenizer: Any, quick: bool) -> tuple[TaskSpec, Any, demo_models.DemoModel]:
    spec = _text_spec(TaskSpec.seq2seq_tiny(), tokenizer, max_target_len=32)
    model = demo_models.Seq2Seq(len(tokenizer), tokenizer.pad_token_id, spec.special_tokens["decoder_start_token_id"])
    return spec, sample_data.seq2seq_dataset(), model


def _vision(tokenizer: Any, quick: bool) -> tuple[TaskSpec, Any, demo_models.DemoModel]:
    spec = TaskSpec.vision_tiny()
    return spec, sample_data.image_dataset(256 if quick else 512), demo_models.ImageClassifier(spec.num_classes)


def _audio(tokenizer: Any, quick: bool) -> tuple[TaskSpec, Any, demo_models.DemoModel]:
    spec = TaskSpec.audio_tiny()
    model = demo_models.AudioClassifier(spec.num_classes, spec.preprocessing_config.get("n_mels", 40))
    return spec, sample_data.audio_dataset(128 if quick else 256), model


def _vlm(tokenizer: Any, quick: bool) -> tuple[TaskSpec, Any, demo_models.DemoModel]:
    spec = TaskSpec.vlm_tiny().replace(additional_config={"vocab_size": len(sample_data.CAPTION_VOCAB)})
    model = demo_models.VisionLanguageLM(len(sample_data.CAPTION_VOCAB), spec.special_tokens["image_token_id"],
                                         spec.additional_config["patch_size"])
    return spec, sample_data.caption_dataset(256 if quick else 512), model


BUILDERS: dict[str, Callable[[Any, bool], tuple[TaskSpec, Any, demo_models.DemoModel]]] = {
    "lm": _lm, "mlm": _mlm, "cls": _cls, "seq2seq": _seq2seq, "vision": _vision, "audio": _audio, "vlm": _vlm,
}


def run_task(task: str, *, steps: int, quick: bool = False, seed: int = 0, batch_size: int = 16,
             report_dir: Path | None = None) -> dict[str, Any]:
    """Train the tiny model of ``task`` for ``steps`` steps and return the demo's row for it; with ``report_dir``,
    first write the module's HTML report (``dm.report()``) there as ``<task>.html``."""
    from engine import UniversalDataModule

    if task not in BUILDERS:
        raise ValueError(f"task should be one of {', '.join(map(repr, TASKS))}, but got task={task!r}")
    started = time.perf_counter()
    tokenizer = sample_data.build_tokenizer()
    with torch.random.fork_rng():  # the model's initial weights come from the seed, not from global state
        torch.manual_seed(seed)
        spec, data, model = BUILDERS[task](tokenizer, quick)
    text = spec.modality == "text"
    # Text and audio batches are length-grouped (mega-batches sorted by length, then shuffled): far less padding.
    dm = UniversalDataModule(data, task_spec=spec, tokenizer=tokenizer if text else None, batch_size=batch_size,
                             val_split=0.1, num_workers=0, seed=seed,
                             batching="grouped" if spec.modality in ("text", "audio") else None)
    dm.setup("fit")
    report = dm.report() if report_dir is not None else None  # before training: it leaves the loaders as they are
    images = image_numbers(dm.first_batch(), dm.collator)
    val_batches = [batch for _, batch in zip(range(EVAL_BATCHES), dm.val_dataloader())]
    val_start = model.mean_loss(val_batches)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, enable_progress_bar=True, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, callbacks=[TQDMProgressBar(refresh_rate=10)])
    trainer.fit(model, datamodule=dm)
    losses = model.train_losses
    window = min(WINDOW, max(len(losses) // 2, 1))
    resolution = dm.collator_resolution
    return {
        "task": task,
        "spec": spec.name,
        "task_type": spec.task_type,
        "modality": spec.modality,
        "split_sizes": dict(dm.split_sizes),
        "collator": resolution.chosen.name,
        "batching": dm.batching,
        "reason": resolution.reason,
        "batch_shapes": {key: list(shape) for key, shape in model.batch_shapes.items()},
        "padding_share": model.padding_share,
        "steps": len(losses),
        "loss_start": sum(losses[:window]) / window,
        "loss_end": sum(losses[-window:]) / window,
        "val_loss_start": val_start,
        "val_loss_end": model.mean_loss(val_batches),
        "seconds": time.perf_counter() - started,
        "images": describe_images(images) if images is not None else None,
        "report": str(report.save(Path(report_dir) / f"{task}.html")) if report is not None else None,
    }


def format_row(row: dict[str, Any]) -> str:
    """The printable table of one task's row."""
    splits = row["split_sizes"]
    shape_lines = [""]
    for key, shape in row["batch_shapes"].items():  # wrap long key lists onto continuation lines
        item = f"{key} {shape}"
        if shape_lines[-1] and len(shape_lines[-1]) + len(item) > 70:
            shape_lines[-1] += ","
            shape_lines.append("")
        shape_lines[-1] = f"{shape_lines[-1]}, {item}" if shape_lines[-1] else item
    share = row["padding_share"]
    cells = [
        ("splits", " / ".join(f"{name} {size}" for name, size in splits.items())),
        ("collator", f"{row['collator']!r}: {row['reason']}"),
        ("batch", ("\n" + " " * 17).join(shape_lines)),
        ("padding share", "n/a (no attention_mask)" if share is None
         else f"{share:.1%} of positions ({row['batching']} batching)"),
        ("train loss", f"{row['loss_start']:.3f} -> {row['loss_end']:.3f}  (mean of first/last {WINDOW} "
                       f"of {row['steps']} steps)"),
        ("val loss", f"{row['val_loss_start']:.3f} -> {row['val_loss_end']:.3f}  ({EVAL_BATCHES} fixed batches)"),
        *([("images", row["images"])] if row.get("images") else []),
        ("time", f"{row['seconds']:.1f} s"),
        *([("report", row["report"])] if row.get("report") else []),
    ]
    title = f"{row['task']}: {row['spec']} ({row['task_type']} on {row['modality']})"
    width = max(len(title), *(17 + len(part) for _, value in cells for part in value.splitlines()))
    lines = [title, "-" * width] + [f"  {name:<13}  {value}" for name, value in cells]
    return "\n".join(lines)


def run_demo(quick: bool = False, max_steps: int | None = None, tasks: tuple[str, ...] = TASKS,
             seed: int = 0, report_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Train every demo task briefly, print one table per task, and return the rows.

    Args:
        quick: Fewer steps and smaller synthetic datasets (for tests).
        max_steps: Training steps per task; defaults to ``QUICK_STEPS`` in quick mode, else ``DEFAULT_STEPS``.
        tasks: Which tasks to run, a subset of ``TASKS``.
        seed: Seed of the splits, the batch order, the random masks and the model's initial weights.
        report_dir: Write each task's data report (``dm.report()``, an HTML page with figures) here as
            ``<task>.html``; its path is the row's ``report`` and is printed in the task's table.

    Returns:
        One dict per task with ``split_sizes``, ``collator``, ``reason``, ``batch_shapes``, ``padding_share``,
        ``loss_start``, ``loss_end`` (and the validation losses, steps, seconds and the report's path or None).

    Raises:
        ValueError: If ``max_steps`` is not a positive int or a task is unknown.

    Example:
        >>> rows = run_demo(quick=True, tasks=("cls",))  # doctest: +SKIP
        >>> rows[0]["loss_end"] < rows[0]["loss_start"]  # doctest: +SKIP
        True
    """
    steps = max_steps if max_steps is not None else (QUICK_STEPS if quick else DEFAULT_STEPS)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise ValueError(f"max_steps should be an int >= 2 (to compare start and end), but got max_steps={steps!r}")
    unknown = [task for task in tasks if task not in BUILDERS]
    if unknown:
        raise ValueError(f"tasks should be among {', '.join(map(repr, TASKS))}, but got {unknown!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: more threads only add overhead and contention
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    rows = []
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*(val_dataloader|validation_step).*")
            for task in tasks:
                row = run_task(task, steps=steps, quick=quick, seed=seed,
                               report_dir=Path(report_dir) if report_dir is not None else None)
                print(format_row(row), flush=True)
                print(flush=True)
                rows.append(row)
    finally:
        torch.set_num_threads(threads)
        quiet.setLevel(level)
    total = sum(row["seconds"] for row in rows)
    falling = sum(row["loss_end"] < row["loss_start"] for row in rows)
    print(f"{len(rows)} tasks in {total:.1f} s; the training loss fell in {falling} of {len(rows)}.", flush=True)
    if report_dir is not None:
        print(f"data reports (open in a browser): {Path(report_dir).resolve()}/<task>.html", flush=True)
    return rows
