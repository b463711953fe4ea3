"""What the Python contenders share: a dataset's Parquet row groups, the trainer host's CPU
seconds, and batches from worker processes as a PyTorch user gets them (torch's
``DataLoader`` when torch is importable, else ``multiprocessing`` queues; two batches
prefetched per worker either way)."""

import os
import resource

import pyarrow.parquet as pq


def cpu_seconds():
    """CPU seconds of this process and its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def units_of(data):
    """Every (file, row group) of a dataset's folder, in order."""
    files = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".parquet"))
    return [(f, rg) for f in files for rg in range(pq.ParquetFile(f).num_row_groups)]


def _worker(make, units, k, queue):
    for b in make(units, k):
        queue.put(b)
    queue.put(None)


def worker_batches(units, workers, make):
    """Batches of `make(units[k::workers], k)` from `workers` processes (`make` a top-level
    function or a `functools.partial` of one, yielding tuples of numpy arrays). Yields the
    mechanism's name and None first."""
    try:
        import torch
        from torch.utils.data import DataLoader, IterableDataset, get_worker_info

        class Units(IterableDataset):
            def __iter__(self):
                info = get_worker_info()
                k, n = (info.id, info.num_workers) if info else (0, 1)
                for b in make(units[k::n], k):
                    yield tuple(torch.from_numpy(x) for x in b)

        yield "torch", None
        yield from DataLoader(Units(), batch_size=None, num_workers=workers, prefetch_factor=2)
    except ImportError:
        import multiprocessing as mp

        queue = mp.Queue(maxsize=2 * workers)
        procs = [mp.Process(target=_worker, args=(make, units[k::workers], k, queue)) for k in range(workers)]
        for p in procs:
            p.start()
        yield "multiprocessing", None
        done = 0
        while done < workers:
            b = queue.get()
            if b is None:
                done += 1
            else:
                yield b
        for p in procs:
            p.join()
