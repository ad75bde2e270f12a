"""Stage 1 of a batch's path: the user's data adapted to one map-style interface with batched fetch, its seeded
splits (``splits``), and the fetch of each batch, as rows or as columns (:mod:`collators.columns`).

``rows`` is that interface (``MapSource``, ``RowBatch``), and ``adapt`` wraps HF datasets, torch datasets and lists
of tensors behind it; ``files`` reads paths to files and folders with ``datasets``; ``inputs`` checks them against
the TaskSpec; ``tokenizing/`` tokenizes raw text, once per machine into a cache, or on a Ray cluster into Parquet
shards; ``shards/`` reads sharded corpora on disk or in object storage a row group at a time; ``mixed`` lays a
mixture's named sources end to end; ``media`` decodes image and audio columns to tensors; ``lengths`` reads row
lengths from the columns; ``long_rows`` truncates, splits or drops rows longer than the limit; ``streams`` handles
``datasets.IterableDataset`` inputs; ``transforms`` applies a split's per-row transform; ``bad_rows`` names rows
that fail to read, or leaves them out and records them.
"""
