"""Mixtures of named sources inside every batch: ``mixture`` is the user's ``Mixture`` (weights, schedule, unit),
``order`` draws each epoch's order block by block at exact shares (``MixtureOrder``), ``plan`` counts and
stores the rows each block takes from each source, and ``served`` reads the rows and tokens served so far."""
