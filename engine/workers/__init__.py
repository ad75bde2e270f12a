"""Worker processes of the loaders: how a worker hands its batch to the parent (``handoff``), and the iterators a
map-style loader hands out, with or without workers (``iterators``)."""
