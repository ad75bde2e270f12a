"""Stage 4 of a batch's path: the loaders. ``config`` (``DataLoaderConfig``), ``factory`` (the one place samplers
and loaders are built), ``loader`` (in-process and worker processes), ``pipeline`` (threads), and ``state`` (what
a checkpoint holds)."""
