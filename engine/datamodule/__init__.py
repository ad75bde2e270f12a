"""Stage 5 of a batch's path: ``UniversalDataModule``, which wires the stages together, with its arguments
(``options``), its inputs (``given``), its collator (``collator``) and its checkpoints (``checkpointing``)."""
