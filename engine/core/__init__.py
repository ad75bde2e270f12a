"""The leaf of the engine: argument checks in torch's form, seeds derived from (seed, epoch, index), the rank and
world of this process, and the one module that touches library internals (``compat``). Imports nothing of ours."""
