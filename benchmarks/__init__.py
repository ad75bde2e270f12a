"""Side-by-side benchmarks of the data path against the recipes people use today.

Run ``python -m benchmarks [--quick] [--only NAME]``: every module ``benchmarks/bench_*.py`` exposes
``run(quick: bool) -> list[dict]`` and checks that its anchor and our path produce equal outputs before timing.
"""
