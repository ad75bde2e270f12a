"""Stage 5 of a batch's path: ``DataModule`` (``module``), which wires the stages together, and its Lightning subclass
``UniversalDataModule`` (``universal``), with its arguments (``options``), its inputs (``given``), its collator
(``collator``) and its checkpoints (``checkpointing``)."""
