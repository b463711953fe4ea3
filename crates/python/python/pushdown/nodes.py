"""torchdata integration: ``pushdown.nodes.LoaderNode``, a ``torchdata.nodes`` source.

    import torchdata.nodes as tn
    from pushdown.nodes import LoaderNode

    node = LoaderNode(servers=["http://storage-1:50051"], pipeline="train.toml", seed=0)
    node = tn.Prefetcher(tn.PinMemory(node), prefetch_factor=2)     # compose as usual
    loader = tn.Loader(node)
    for epoch in range(E):
        for batch in loader:          # one epoch per pass, each with its own permutation
            ...
    state = loader.state_dict()       # resume later: loader.load_state_dict(state)

The node yields the batches of one data-parallel rank, as ``pushdown.Loader`` does (its
arguments are the loader's; or give a ``Loader`` you made). It is epoch-aware the way
``torchdata.nodes.SamplerWrapper`` is: ``reset()`` with no state starts the next epoch (the
first reset epoch 0), so each pass of a ``torchdata.nodes.Loader`` is a new permutation, not a
replay of epoch 0. ``get_state()`` is the loader's own state (the same bytes on every rank),
and ``reset(state)`` continues exactly there: mid-epoch, the rest of that epoch; at an epoch's
end, the next epoch.

The node subclasses ``torchdata.nodes.BaseNode`` when torchdata is installed (it needs torch).
Without it, the base is a stand-in with the same protocol (``reset``, ``next``,
``get_state``, ``state_dict``, iteration), so the node can be used and tested where torch is
absent; ``HAVE_TORCHDATA`` says which.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from . import InvalidArgumentError, Loader

__all__ = ["HAVE_TORCHDATA", "LoaderNode"]

try:
    from torchdata.nodes import BaseNode as _Base

    HAVE_TORCHDATA = True
except ImportError:  # torchdata (and torch) absent: the same protocol, without them
    HAVE_TORCHDATA = False

    class _Base:  # type: ignore[no-redef]
        """``torchdata.nodes.BaseNode``'s protocol: ``next``/``get_state`` implemented by the
        subclass; ``reset`` called lazily before the first item or state."""

        def __init__(self) -> None:
            self._initialized = False

        def __iter__(self) -> "_Base":
            return self

        def reset(self, initial_state: Optional[Dict[str, Any]] = None) -> None:
            self._initialized = True

        def __next__(self) -> Any:
            if not self._initialized:
                self.reset(None)
            return self.next()

        def next(self) -> Any:
            raise NotImplementedError(type(self))

        def get_state(self) -> Dict[str, Any]:
            raise NotImplementedError(type(self))

        def state_dict(self) -> Dict[str, Any]:
            if not self._initialized:
                self.reset(None)
            return self.get_state()


class LoaderNode(_Base):
    """A ``torchdata.nodes`` source of one rank's batches from pushdown servers.

    ``LoaderNode(loader)`` wraps a ``pushdown.Loader``; ``LoaderNode(servers, **kwargs)``
    makes one (the keyword arguments of ``pushdown.Loader``). ``reset(None)`` starts the next
    epoch, ``reset(state)`` continues from a ``get_state()``; ``next()`` is the next batch of
    the epoch, ``StopIteration`` at its end.
    """

    STATE_KEY = "pushdown_loader"

    def __init__(self, loader: Any = None, **kwargs: Any) -> None:
        super().__init__()
        if isinstance(loader, Loader):
            if kwargs:
                raise InvalidArgumentError(
                    f"LoaderNode: give a Loader or the Loader's arguments, not both ({sorted(kwargs)})"
                )
            self.loader = loader
        else:
            servers = loader if loader is not None else kwargs.pop("servers", None)
            if servers is None:
                raise InvalidArgumentError("LoaderNode: give a pushdown.Loader, or servers= and the Loader's arguments")
            self.loader = Loader(servers, **kwargs)
        self._it: Optional[Iterator[Dict[str, Any]]] = None

    def reset(self, initial_state: Optional[Dict[str, Any]] = None) -> None:
        super().reset(initial_state)
        if initial_state is not None:
            if self.STATE_KEY not in initial_state:
                raise InvalidArgumentError(
                    f"LoaderNode.reset: not a LoaderNode state (keys {sorted(initial_state)}; "
                    f"expected {self.STATE_KEY!r})"
                )
            self.loader.load_state_dict(initial_state[self.STATE_KEY])
        # A new pass of the loader: the next epoch, or the restored position to its epoch's end.
        self._it = iter(self.loader)

    def next(self) -> Dict[str, Any]:
        if self._it is None:
            self.reset(None)
        assert self._it is not None
        return next(self._it)

    def get_state(self) -> Dict[str, Any]:
        return {self.STATE_KEY: self.loader.state_dict()}

    def __len__(self) -> int:
        """Batches of one epoch on this rank."""
        return len(self.loader)
