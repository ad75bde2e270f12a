"""Worker processes of the loaders: how a worker hands its batch to the parent (``handoff``)."""
