"""Sharded corpora: Parquet or Arrow IPC files on disk or in object storage, read a row group at a time.

A *shard* is one file of the corpus. ``listing`` finds the shards and reads their footers (``Shards``,
``list_shards``); ``object_stores`` opens ``s3://``, ``gs://`` and ``az://`` through pyarrow's clients; ``reader``
fetches row groups into the local cache, reads ahead, retries and checks versions (``RowGroupReader``); ``decode``
writes and reads the cache's files; ``source`` is the corpus as one source (``ShardedSource``).
"""
