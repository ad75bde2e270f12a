"""Task specifications: immutable values that say what a task is, so the data path can adapt to it."""

from task_spec.spec import LOSS_TYPES, MODALITIES, REMOVE, SUPERVISED_TASK_TYPES, TASK_TYPES, TaskSpec

__all__ = ["LOSS_TYPES", "MODALITIES", "REMOVE", "SUPERVISED_TASK_TYPES", "TASK_TYPES", "TaskSpec"]
