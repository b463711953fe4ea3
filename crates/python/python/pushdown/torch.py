"""PyTorch integration: ``pushdown.torch.IterableDataset``.

    ds = pushdown.torch.IterableDataset(servers, pipeline=..., shuffle_buffer=10_000)
    for epoch in range(E):
        for batch in torch.utils.data.DataLoader(ds, batch_size=None):   # num_workers=0
            ...

Each ``for`` is the next epoch (its own permutation and augmentations); ``set_epoch(e)``
makes the next one epoch ``e``; ``len(ds)`` is the batches of one epoch on this rank;
``state_dict()`` / ``load_state_dict()`` resume exactly, mid-epoch or at a boundary.

**Use ``num_workers=0``** (the default). The loader already runs on its own threads: streams,
decoding and client-side ops happen outside the Python process's GIL, and batches are built
ahead. DataLoader workers would each open their own loader (own threads, own read-ahead)
for a slice of the rank; it works (each worker reads as rank ``rank * num_workers + worker``
of ``world_size * num_workers``, and the DataLoader interleaves them), but each epoch's
workers start afresh: call ``set_epoch(e)`` before each epoch (as with
``DistributedSampler``) or use ``persistent_workers=True``, and a saved state can only be
restored with ``num_workers=0`` (restoring it with workers is an error, never ignored).

Batches are already made: give the DataLoader ``batch_size=None``. Integer columns come as
int64 tensors (what losses and embeddings take), except uint8 (pixels), unless ``dtypes``
says otherwise: ``dtypes={"label": torch.int32, "pixels": torch.float16}``, or ``None`` for a
column to keep the loader's type.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Iterator, Optional

try:
    import torch
    import torch.utils.data as _data
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pushdown.torch needs PyTorch: pip install 'pushdown[torch]' (or install torch); "
        "pushdown.Loader works without it"
    ) from e

from . import Loader

__all__ = ["IterableDataset"]

_warned_workers = False
# Loaders inherited by forked workers from their parent: kept, never dropped.
_forked: list = []


def _distributed() -> tuple:
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _widened(value: Any) -> Any:
    """The default dtype rule: integers other than uint8 as int64."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or dtype in (torch.int64, torch.uint8, torch.bool) or dtype.is_floating_point:
        return value
    return value.to(torch.int64)


class IterableDataset(_data.IterableDataset):
    """A ``torch.utils.data.IterableDataset`` over a pushdown ``Loader``.

    Arguments are those of ``pushdown.Loader``; ``rank``/``world_size`` default to
    ``torch.distributed`` or the ``RANK``/``WORLD_SIZE`` environment variables; ``dtypes``
    maps column names to the torch dtype they arrive in (see the module docs). It pickles
    (DataLoader workers under ``spawn``): the loader itself is made where it is iterated.
    """

    def __init__(
        self,
        servers,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        dtypes: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.servers = servers
        default_rank, default_world = _distributed()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        self.dtypes = dict(dtypes or {})
        self.kwargs = kwargs
        self._state: Optional[Dict[str, bytes]] = None
        self._epoch: Optional[int] = None
        self._loader: Optional[Loader] = None
        self._workers = 1
        self._pid = os.getpid()

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_loader"] = None  # native threads and sockets stay in their process
        return state

    def _make(self) -> Loader:
        info = _data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if self._loader is not None and self._pid != os.getpid():
            # Forked into a worker: the parent's loader has no threads here. Never dropped
            # (its shutdown would wait on them), never used.
            _forked.append(self._loader)
            self._loader = None
        if self._loader is not None and self._workers == workers:
            return self._loader
        global _warned_workers
        if workers > 1 and worker == 0 and not _warned_workers:
            _warned_workers = True
            warnings.warn(
                "pushdown.torch.IterableDataset with num_workers > 0: the loader already runs on "
                "its own threads, so num_workers=0 is faster and resumable; with workers, call "
                "set_epoch(e) each epoch or use persistent_workers=True",
                stacklevel=2,
            )
        if self._state is not None and workers > 1:
            raise RuntimeError(
                "a saved state resumes one loader per rank: iterate with num_workers=0 to "
                "restore it (each worker reads another slice of the rank)"
            )
        loader = Loader(
            self.servers,
            rank=self.rank * workers + worker,
            world_size=self.world_size * workers,
            **self.kwargs,
        )
        if self._state is not None:
            loader.load_state_dict(self._state)
            self._state = None
        self._loader, self._workers, self._pid = loader, workers, os.getpid()
        return loader

    def set_epoch(self, epoch: int) -> None:
        """The next ``for`` is epoch ``epoch`` (also in workers made after this call)."""
        self._epoch = epoch
        if self._loader is not None:
            self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches of one epoch on this rank."""
        loader = self._loader or self._make()
        return len(loader)

    def _convert(self, name: str, value: Any) -> Any:
        if not hasattr(value, "__array_interface__"):
            return value
        tensor = torch.from_numpy(value)
        if name in self.dtypes:
            dtype = self.dtypes[name]
            return tensor if dtype is None else tensor.to(dtype)
        return _widened(tensor)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        loader = self._make()
        if self._epoch is not None:
            loader.set_epoch(self._epoch)
            self._epoch = None
        for batch in loader:
            yield {k: self._convert(k, v) for k, v in batch.items()}

    def state_dict(self) -> Dict[str, bytes]:
        """The position of the loader (main-process loading)."""
        if self._loader is None:
            return dict(self._state or {})
        return self._loader.state_dict()

    def load_state_dict(self, state: Dict[str, bytes]) -> None:
        self._state = dict(state)
        if self._loader is not None and self._workers == 1:
            self._loader.load_state_dict(self._state)
            self._state = None
