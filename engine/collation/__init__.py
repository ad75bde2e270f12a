"""Stage 3 of a batch's path: the collate step of a loader. ``seeded_collate`` hands each batch's seeded
generator to the registry's collator; ``handoff`` is how a worker process hands its collated batch to the parent."""
