"""Stage 5: the loaders. ``config`` (``DataLoaderConfig``), ``factory`` (the one place samplers and loaders are
built), ``loader`` and ``iterators`` (worker processes), ``pipeline`` (threads), and ``state`` (the resume state)."""
