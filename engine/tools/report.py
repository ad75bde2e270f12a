"""``dm.report()``: what to check before training, with figures, for a notebook cell or a saved HTML page.

Split sizes; the collator chosen and why (its options behind a ``<details>``); a length histogram per split
(text and audio); the padding share of plain shuffled batches beside the module's own batching over one epoch;
rows cut by ``max_length``; the label distribution; sharded data's listing and reader counts (fetches, cache hits,
retries, bytes, evictions, read-ahead); a mixture's target against the rows and tokens served per source
(:mod:`engine.tools.report_mixture`); and the first training batch, decoded. The numbers come
from the columns (:mod:`engine.tools.report_numbers`), so a million rows take well under a second; figures are
inline SVG (:mod:`engine.tools.figures`).
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from engine.loading.factory import batch_sampler_for
from engine.sampling.seeded import SeededBatchSampler
from engine.sources.inputs import token_field
from engine.sources.protocol import Source
from engine.tools import report_numbers as measure
from engine.tools.inline import save_page
from engine.tools.rank_waits import RankWaits
from engine.tools.report_mixture import fresh_mixture_order, mixture_html, mixture_lines, mixture_numbers
from engine.tools.summary import collator_line, describe_value, summary_rows

SPLITS = ("train", "val", "test", "predict")
SHOWN_ROWS = 8
"""Rows of the sample batch shown decoded (its shapes are those of the whole batch)."""
MEASURED = ("text", "audio")
"""Modalities whose rows have a length worth a histogram and a padding share."""
STYLE = ("<style>.udm-report{font-family:system-ui,sans-serif;font-size:13px;max-width:1180px}"
         ".udm-report table{border-collapse:collapse;margin:4px 0}.udm-report th,.udm-report td{text-align:left;"
         "padding:2px 10px 2px 0;vertical-align:top}.udm-report .plots{display:flex;flex-wrap:wrap;gap:8px}"
         ".udm-report figure{margin:0}.udm-report figcaption{font-size:11px;color:#555}"
         ".udm-report code{font-size:12px;white-space:pre-wrap}</style>")


@dataclass
class DataReport:
    """A data module's report: ``numbers`` (plain data), ``figures`` (HTML), ``str()`` text, ``save(path)`` a page."""

    title: str
    numbers: dict[str, Any]
    summary: list[tuple[str, str]]
    collator_repr: str
    figures: list[str] = field(default_factory=list)
    sample_lines: list[str] = field(default_factory=list)
    waits: RankWaits | None = None
    """Every rank's wait for data during training, added by :meth:`with_waits`."""

    def with_waits(self, waits: RankWaits) -> DataReport:
        """This report with a section on the wait for data per rank and its imbalance, e.g.
        ``dm.report().with_waits(monitor.rank_waits())`` (or a ``DataMonitorCallback``'s ``rank_waits``)."""
        return dataclasses.replace(self, waits=waits)

    def __str__(self) -> str:
        lines = [self.title, *(f"  {label}: {value}" for label, value in self.summary)]
        lines += mixture_lines(self.numbers.get("mixture"))
        for split, stats in self.numbers["lengths"].items():
            lines.append(f"  lengths {split}: " + (", ".join(f"{k}={_fmt(v)}" for k, v in stats.items())))
        padding = self.numbers["padding"]
        if padding:
            lines.append(f"  padding: plain shuffle {padding['plain']:.1%}, {padding['batching']} (this module) "
                         f"{padding['chosen']:.1%}")
            if padding.get("advice"):
                lines.append(f"  advice: {padding['advice']}")
        for split, counts in self.numbers["labels"].items():
            lines.append(f"  labels {split}: " + ", ".join(f"{self._class(label)}={count}"
                                                           for label, count in counts.items()))
        if self.numbers.get("images"):
            lines.append(f"  images (first batch): {measure.describe_images(self.numbers['images'])}")
        lines += [f"  not measured {split}: {why}" for split, why in self.numbers["skipped"].items()]
        lines += [f"  shards {splits}: {measure.describe_reads(reads)}" for splits, reads in self._shards()]
        lines += [f"  sample: {line}" for line in self.sample_lines]
        if self.waits is not None:
            lines += ["  waiting for data, per rank:", *(f"    {line}" for line in str(self.waits).splitlines())]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        table = "".join(f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
                        for label, value in [*self.summary, *self._number_rows()])
        details = (f"<details><summary>collator options</summary><code>{html.escape(self.collator_repr)}</code>"
                   f"</details>")
        sample = "".join(f"<li><code>{html.escape(line)}</code></li>" for line in self.sample_lines)
        return (f'<div class="udm-report">{STYLE}<h3>{html.escape(self.title)}</h3><table>{table}</table>{details}'
                f'{mixture_html(self.numbers.get("mixture"))}'
                f'<div class="plots">{"".join(self.figures)}</div>'
                f"<h4>first train batch</h4><ul>{sample}</ul>"
                f'{self.waits.to_html() if self.waits is not None else ""}</div>')

    def _number_rows(self) -> list[tuple[str, str]]:
        rows = [(f"lengths {split}", ", ".join(f"{k}={_fmt(v)}" for k, v in stats.items()))
                for split, stats in self.numbers["lengths"].items()]
        padding = self.numbers["padding"]
        if padding:
            rows.append(("padding", f"plain shuffle {padding['plain']:.1%}; {padding['batching']} (this module) "
                                    f"{padding['chosen']:.1%}"))
            if padding.get("advice"):
                rows.append(("advice", padding["advice"]))
        shown = {label for label, _ in self.summary}  # repr(dm)'s truncation line already says the train split's
        for split, cut in self.numbers["truncation"].items():
            if split == "train" and "truncation" in shown:
                continue
            rows.append((f"truncated {split}", f"{cut['long_rows']} of {cut['rows']} rows, {cut['lost_tokens']} of "
                                               f"{cut['tokens']} tokens"))
        rows += [(f"labels {split}", ", ".join(f"{self._class(label)}: {count}" for label, count in counts.items()))
                 for split, counts in self.numbers["labels"].items()]
        if self.numbers.get("images"):
            rows.append(("images (first batch)", measure.describe_images(self.numbers["images"])))
        rows += [(f"not measured {split}", why) for split, why in self.numbers["skipped"].items()]
        rows += [(f"shards {splits}", measure.describe_reads(reads)) for splits, reads in self._shards()]
        return rows

    def _shards(self) -> list[tuple[str, dict[str, Any]]]:
        return list(self.numbers.get("shards", {}).items())

    def _class(self, label: int) -> str:
        names = self.numbers.get("class_names")
        return f"{names[label]} ({label})" if names is not None and 0 <= label < len(names) else str(label)

    def save(self, path: str | Path) -> Path:
        """Write the report as one self-contained HTML page (figures inline) and return its path."""
        return save_page(path, self.title, self._repr_html_())


def _fmt(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def collect(dm: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], Any]:
    """``(numbers, lengths per split, the first train batch)`` of a set-up module, all read from the columns."""
    spec, collator = dm.task_spec, dm.collator
    key = token_field(spec) if spec is not None else None
    measured = spec is not None and spec.modality in MEASURED
    max_length = getattr(collator, "max_length", None)
    numbers: dict[str, Any] = {
        "split_sizes": {role: size for role, size in dm.split_sizes.items() if size != 0},
        "collator": collator_line(dm), "batching": dm.batching, "lengths": {}, "length_how": {}, "padding": None,
        "truncation": {}, "labels": {}, "label_how": {}, "skipped": {}, "class_names": None, "shards": {},
    }
    lengths: dict[str, np.ndarray] = {}
    for role in SPLITS:
        source = dm.datasets.get(role)
        if source is None:
            continue
        if measured:
            values, how = measure.measured_lengths(source, key)
            numbers["length_how"][role] = how
            if values is None:
                numbers["skipped"][role] = how
            else:
                lengths[role] = values
                numbers["lengths"][role] = measure.length_stats(values)
                cut = measure.truncation(values, max_length)
                if cut is not None and cut["long_rows"]:
                    numbers["truncation"][role] = cut
        if spec is not None and spec.task_type in ("classification", "regression") and role != "predict":
            counts, how = measure.label_counts(source, spec.target_field, spec.num_classes)
            numbers["label_how"][role] = how
            if counts is not None:
                numbers["labels"][role] = counts
            if role == "train":
                numbers["class_names"] = measure.class_names(source, spec.target_field)
    numbers["shards"] = measure.shard_reads(dm.datasets)
    train = dm.datasets.get("train")
    order = fresh_mixture_order(dm)
    chosen = _chosen_batches(dm, train, key, order) if train is not None and not isinstance(
        train, IterableDataset) else None
    if "train" in lengths and chosen is not None and chosen[1]:
        plain = SeededBatchSampler(len(train) if order is None else order.size, dm.train_config.batch_size,
                                   shuffle=True, seed=dm.train_config.seed or 0, drop_last=dm.train_config.drop_last,
                                   num_replicas=dm.world_size, rank=dm.rank, uneven=dm.uneven, order=order)
        numbers["padding"] = {"plain": measure.plain_padding_share(plain, lengths["train"], collator),
                              "chosen": measure.padding_share(chosen[1], lengths["train"], collator),
                              "batching": dm.batching}
        if dm.batching == "plain":
            numbers["padding"].update(_grouped_advice(dm, train, key, lengths["train"], numbers["padding"]["plain"],
                                                      order))
    numbers["mixture"] = mixture_numbers(dm)
    batch = dm.first_batch() if train is not None else None
    numbers["sample_batch"] = _shapes(batch)
    numbers["images"] = measure.image_numbers(batch, collator)
    return numbers, lengths, batch


def _chosen_batches(dm: Any, train: Source, key: str | None, order: Any = None) -> tuple[int, list[list[int]]]:
    """(seed, epoch 0's batches) of the module's own training sampler (drawing from its mixture's ``order``, if
    any), built afresh (the loader is untouched)."""
    config = dm.train_config
    sampler = batch_sampler_for(train, batching=dm.batching, batch_size=config.batch_size, max_tokens=dm.max_tokens,
                                key=key, seed=config.seed, shuffle=config.shuffle, drop_last=config.drop_last,
                                num_replicas=dm.world_size, rank=dm.rank, uneven=dm.uneven, order=order,
                                balance=dm.balance, attention_weight=dm.attention_weight,
                                measure=getattr(dm.collator, "row_length", None))
    return sampler.seed, sampler.epoch_batches(0)


GROUPED_CUTS = 0.25
"""The report suggests ``batching='grouped'`` when it would cut the padding share by at least this fraction (and by
at least 5 points)."""


def _grouped_advice(dm: Any, train: Source, key: str | None, lengths: np.ndarray, plain: float | None,
                    order: Any = None) -> dict[str, Any]:
    """``{grouped, advice}``: the padding share grouped batching would give this module, and a sentence when it
    would cut padding markedly; {} where grouping does not apply."""
    if plain is None or not plain:
        return {}
    config = dm.train_config
    grouped_sampler = batch_sampler_for(train, batching="grouped", batch_size=config.batch_size, key=key,
                                        seed=config.seed or 0, drop_last=config.drop_last,
                                        num_replicas=dm.world_size, rank=dm.rank, uneven=dm.uneven, order=order)
    grouped = measure.padding_share(grouped_sampler.epoch_batches(0), lengths, dm.collator)
    if grouped is None:
        return {}
    numbers: dict[str, Any] = {"grouped": grouped}
    if plain - grouped >= max(0.05, GROUPED_CUTS * plain):
        numbers["advice"] = (f"batching='grouped' would cut padding from {plain:.1%} to {grouped:.1%} of the "
                             f"positions (rows of similar length batched together, batches shuffled)")
    return numbers


def _shapes(batch: Any) -> dict[str, str]:
    if batch is None:
        return {}
    items = batch.items() if isinstance(batch, dict) else enumerate(batch if isinstance(batch, (list, tuple))
                                                                     else [batch])
    return {str(key): describe_value(value) for key, value in items}


def _image_key(spec: Any, batch: Any) -> str:
    """The batch key of a vision spec's images (its input field, ``image`` for a folder), else ``pixel_values``."""
    if spec is not None and spec.modality == "vision" and isinstance(batch, dict) and spec.input_fields \
            and spec.input_fields[0] in batch:
        return spec.input_fields[0]
    return "pixel_values"


def _label_key(spec: Any, batch: Any) -> str:
    """The batch key of the spec's target field (``label`` for a folder), else ``labels``."""
    target = getattr(spec, "target_field", None)
    return target if isinstance(batch, dict) and target in batch else "labels"


def build_report(dm: Any) -> DataReport:
    """The report of ``dm`` (set up first if needed): numbers from the columns, figures drawn with matplotlib."""
    from engine.tools import figures
    from engine.tools.report_sample import sample_lines

    dm.setup()
    numbers, lengths, batch = collect(dm)
    spec = dm.task_spec
    unit = "samples" if spec is not None and spec.modality == "audio" else "tokens"
    plots = [figures.length_histogram(values, split=role, unit=unit, max_length=getattr(dm.collator, "max_length",
                                                                                          None))
             for role, values in lengths.items()]
    padding = numbers["padding"]
    if padding:
        plots.append(figures.padding_bars({"plain shuffle": padding["plain"],
                                           f"{padding['batching']} (this module)": padding["chosen"]}))
    if numbers["labels"]:
        plots.append(figures.label_bars(numbers["labels"], numbers["class_names"]))
    if numbers["mixture"]:
        plots.append(figures.mixture_bars(numbers["mixture"]))
        by_step = numbers["mixture"]["weights_by_step"]
        if by_step["changes"] or len({tuple(weights) for weights in zip(*by_step["weights"].values())}) > 1:
            plots.append(figures.mixture_weights(numbers["mixture"]))
    lines, images = sample_lines(batch, dm.tokenizer, SHOWN_ROWS,
                                 seq2seq=spec is not None and spec.task_type == "seq2seq",
                                 image_key=_image_key(spec, batch), label_key=_label_key(spec, batch),
                                 class_names=numbers["class_names"])
    if images is not None:
        plots.append(images)
    title = f"{type(dm).__name__} report" + (f": {spec.name}" if spec is not None else "")
    return DataReport(title=title, numbers=numbers, summary=summary_rows(dm, shapes=False),
                      collator_repr=repr(dm.collator), figures=plots, sample_lines=lines)
