"""Many threads asking a module for its first train loader at once, as a notebook's or a server's threads may."""

import threading
from concurrent.futures import ThreadPoolExecutor


def first_loaders_from_threads(dm, threads=8):
    """The loader each of ``threads`` threads got, released together by a barrier; every other thread calls
    ``setup("fit")`` first."""
    barrier = threading.Barrier(threads)

    def first_loader(thread):
        barrier.wait()
        if thread % 2:
            dm.setup("fit")
        return dm.train_dataloader()

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(first_loader, range(threads)))
