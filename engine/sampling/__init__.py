"""Stage 2 of a batch's path: seeded, epoch-aware, rank-aware, resumable batch samplers.

Every sampler is an :class:`engine.sampling.base.EpochBatchSampler`: an epoch's batches are a pure function of
(seed, epoch, rank). :func:`engine.sampling.ranks.deal_to_ranks` is the one rule that shares rows among ranks.
The samplers are built in one place, :class:`engine.loading.factory.DataLoaderFactory`.
"""
