"""PyTorch integration: ``pushdown.torch.IterableDataset``.

torch is imported lazily: ``import pushdown`` never needs it. Each DataLoader worker of each
rank reads a disjoint part of every epoch: the loader's rank is ``rank * num_workers +
worker_id`` of ``world_size * num_workers``. Use ``batch_size=None`` in the DataLoader: the
batches are already made.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional

from . import Loader


def _distributed() -> tuple:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class IterableDataset:
    """A ``torch.utils.data.IterableDataset`` over a pushdown ``Loader``.

    Arguments are those of ``pushdown.Loader``; ``rank``/``world_size`` default to
    ``torch.distributed`` or the ``RANK``/``WORLD_SIZE`` environment variables.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        import torch.utils.data

        # Subclass torch's IterableDataset on first use, so torch stays optional.
        klass = type("IterableDataset", (_Dataset, torch.utils.data.IterableDataset), {})
        return klass(*args, **kwargs)


class _Dataset:
    def __init__(self, servers, rank: Optional[int] = None, world_size: Optional[int] = None, **kwargs: Any):
        self.servers = servers
        default_rank, default_world = _distributed()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        self.kwargs = kwargs
        self._state: Optional[Dict[str, bytes]] = None
        self._loader: Optional[Loader] = None

    def _make(self) -> Loader:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        loader = Loader(
            self.servers,
            rank=self.rank * workers + worker,
            world_size=self.world_size * workers,
            **self.kwargs,
        )
        if self._state is not None and workers == 1:
            loader.load_state_dict(self._state)
        return loader

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        import torch

        self._loader = self._make()
        for batch in self._loader:
            yield {k: (torch.from_numpy(v) if hasattr(v, "__array_interface__") else v) for k, v in batch.items()}

    def state_dict(self) -> Dict[str, bytes]:
        """The position of the loader of the current iteration (main-process loading)."""
        if self._loader is None:
            return dict(self._state or {})
        return self._loader.state_dict()

    def load_state_dict(self, state: Dict[str, bytes]) -> None:
        self._state = dict(state)
