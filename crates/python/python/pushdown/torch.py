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
ahead. The batches do not depend on ``num_workers``: with workers, each opens the rank's
loader and yields every ``num_workers``-th batch of it (worker ``k`` the ``k``-th), which the
DataLoader's round-robin puts back in the rank's order; but each worker reads the rank's whole
stream, so workers multiply the servers' work and the network by ``num_workers`` for nothing.
Each epoch's workers start afresh: call ``set_epoch(e)`` before each epoch (as with
``DistributedSampler``) or use ``persistent_workers=True``. A restored state continues in
every worker.

``rank``/``world_size`` default to ``torch.distributed``'s (or ``RANK``/``WORLD_SIZE``, as
``torchrun`` sets them). The epoch's global batches do not depend on the world size (see
``pushdown.Loader``): a state saved at one world size continues at another, with
``batch_size × world_size`` unchanged.

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

from . import InvalidArgumentError, Loader

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
                f"pushdown.torch.IterableDataset with num_workers={workers}: the loader already "
                f"runs on its own threads; each worker reads the rank's whole stream to yield one "
                f"batch in {workers} ({workers}x the servers' work and network): use num_workers=0",
                stacklevel=2,
            )
        loader = Loader(self.servers, rank=self.rank, world_size=self.world_size, **self.kwargs)
        if self._state is not None:
            loader.load_state_dict(self._state)
            if workers == 1:
                self._state = None
        self._loader, self._workers, self._pid = loader, workers, os.getpid()
        return loader

    def set_epoch(self, epoch: int) -> None:
        """The next ``for`` is epoch ``epoch`` (also in workers made after this call)."""
        self._epoch = epoch
        if self._loader is not None:
            self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches of one epoch on this rank (all workers together)."""
        loader = self._loader or self._make()
        return len(loader)

    def _convert(self, name: str, value: Any, bfloat16: frozenset = frozenset()) -> Any:
        if not hasattr(value, "__array_interface__"):
            return value
        if value.dtype.name == "bfloat16" or (value.dtype.name == "uint16" and name in bfloat16):
            # numpy has no bfloat16 of its own: the loader gives the numbers' bits.
            tensor = torch.from_numpy(value.view("int16")).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(value)
        if name in self.dtypes:
            dtype = self.dtypes[name]
            return tensor if dtype is None else tensor.to(dtype)
        return _widened(tensor)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        loader = self._make()
        info = _data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if self._epoch is not None:
            loader.set_epoch(self._epoch)
            self._epoch = None
        # Worker k of n: the pass's batches k, k + n, ... (the DataLoader takes one from each
        # worker in turn: the rank's sequence, whatever n is).
        for i, batch in enumerate(loader):
            if i % workers == worker:
                yield {k: self._convert(k, v, loader.bfloat16_columns) for k, v in batch.items()}

    def state_dict(self) -> Dict[str, bytes]:
        """The position of the loader (main-process loading)."""
        if self._loader is None:
            if isinstance(self._state, list):
                raise InvalidArgumentError("state_dict: the dataset holds every rank's states, not yet restored: iterate first")
            return dict(self._state or {})
        return self._loader.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """A state, or every rank's states in a list (a packed loader at another world size)."""
        self._state = dict(state) if isinstance(state, dict) else [dict(s) for s in state]
        if self._loader is not None and self._workers == 1:
            self._loader.load_state_dict(self._state)
            self._state = None
