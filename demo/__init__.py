"""The demo: tiny models trained on the bundled sample data, one per preset task (``python -m demo``).

Kept out of the library packages; ``demo.sample_data`` also gives notebooks and tests offline data.
"""
