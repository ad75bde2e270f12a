"""Utilities beside the path of a batch: step counts, first-batch validation, monitoring, worker tuning,
device transfer and normalization, split files, the notebook summary, and the rows left out in Lightning's log."""
