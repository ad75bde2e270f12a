"""Stage 1 of a batch's path: the user's data adapted to one map-style interface with batched fetch.

``adapt`` wraps HF datasets, torch datasets and lists of tensors; ``inputs`` checks them against the TaskSpec;
``preprocess`` tokenizes raw text, once per machine into the cache of ``token_cache``; ``lengths`` reads row lengths
from the columns; ``long_rows`` truncates, splits or drops rows longer than the limit; ``streams`` handles
``datasets.IterableDataset`` inputs.
"""
