"""Several named datasets behind one module: their config, the seeded schedule, the loader and the module."""
