"""Raw text to token rows: ``preprocess`` tokenizes a source with the user's tokenizer, once per machine, into the
on-disk cache of ``token_cache``; ``ray_tokenize`` runs the same step on a Ray cluster into Parquet shards."""
