"""pushdown: reduced training data from pushdown servers, as numpy batches.

    import pushdown
    loader = pushdown.Loader(servers=["http://storage-1:50051"],
                             sql="SELECT decode_resize(image, 64, 64) AS pixels, label FROM images",
                             batch_size=256, shuffle_buffer=10_000, seed=0, rank=0, world_size=1)
    for epoch in range(10):
        for batch in loader:      # one epoch per pass: dict[str, numpy.ndarray | pyarrow.Array]
            ...
    state = loader.state_dict()   # resume later with load_state_dict(state)

Each ``for`` over a loader is the next epoch (its own permutation and augmentations). The
epoch's global batches (``batch_size × world_size`` rows) are a function of the seed, the
epoch, the global batch and the shuffle window only, never of the world size: rank ``r``
gets its slice of each. A state saved at one world size continues at another.
PyTorch: ``pushdown.torch.IterableDataset`` (``pip install 'pushdown[torch]'``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

# The native module's allocator (mimalloc, for Rust's allocations only) keeps the pages it
# frees instead of returning them to the system a second later: a loader frees and allocates
# batch-sized buffers without pause, and returning them costs a page fault per 4 KiB the next
# time (`harness ceiling`, the Python cells). mimalloc reads its options once, from the
# environment, as the module loads: the variable is set for that moment only (processes started
# later do not inherit it), and a value already set stands.
_PURGE = "MIMALLOC_PURGE_DELAY"
_purge_set = _PURGE not in os.environ
if _purge_set:
    os.environ[_PURGE] = "-1"
try:
    from ._native import BUILD_PROFILE, _Loader, _Transform
finally:
    if _purge_set:
        del os.environ[_PURGE]
from . import errors as _errors
from .errors import *  # noqa: F403 (the error classes, named in errors.__all__)

__all__ = ["BUILD_PROFILE", "Loader", "Transform", "__version__", *_errors.__all__]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("pushdown")
    except Exception:  # pragma: no cover - not installed as a distribution
        return "0+unknown"


__version__ = _version()


def _arrow(columns: Any):
    """A batch's Arrow columns (an ``_ArrowBatch``) as one ``pyarrow.RecordBatch``, taken
    through the Arrow C Data Interface without copying."""
    try:
        import pyarrow as pa
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "variable-length and nullable columns come as pyarrow arrays: pip install pyarrow"
        ) from e
    return pa.record_batch(columns)


def _value(kind: str, value: Any) -> Any:
    """A column as the loader gives it: numpy arrays as they are, bfloat16 bits as
    ``ml_dtypes.bfloat16`` where that package is installed (else the ``uint16`` bits; numpy
    has no bfloat16 of its own), anything else as a pyarrow array."""
    if kind == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return value
        return value.view(ml_dtypes.bfloat16)
    return value


def _batch(item: Sequence[Tuple[str, str, Any]]) -> Dict[str, Any]:
    """A native batch's columns by name, in its order: tensors as they come, the Arrow ones
    taken from the batch's one ``_ArrowBatch`` together (the i-th Arrow column is its
    column i)."""
    arrow, taken = None, 0
    batch = {}
    for name, kind, value in item:
        if kind == "arrow":
            if arrow is None:
                arrow = _arrow(value)
            batch[name] = arrow.column(taken)
            taken += 1
        else:
            batch[name] = _value(kind, value)
    return batch


def _has_batch_step(pipeline: Union[str, Dict[str, Any]]) -> bool:
    """Whether a pipeline (a dict, or its JSON or TOML text) has a batch step."""
    if isinstance(pipeline, str):
        try:
            pipeline = json.loads(pipeline)
        except ValueError:
            try:
                import tomllib
            except ImportError:  # Python < 3.11: the step's name as TOML writes it
                return '"batch"' in pipeline
            pipeline = tomllib.loads(pipeline)
    return any(step.get("op") == "batch" for step in pipeline.get("steps", []))


class Loader:
    """Batches for one data-parallel rank, epoch after epoch.

    **Epochs.** Each ``for batch in loader`` is one pass of ``epochs`` epochs (default 1):
    the first pass is epoch 0, the next epoch 1, and so on, each with its own permutation
    and augmentations, as a PyTorch training loop expects. ``set_epoch(e)`` makes the next
    pass start at epoch ``e``. A pass left early (``break``) is abandoned: the next starts
    at the epoch after it. After ``load_state_dict``, the next pass continues the saved
    position exactly. ``len(loader)`` is the batches of one epoch on this rank.

    **Defaults.** No shuffling unless asked: ``shuffle_buffer`` (rows in the shuffle window)
    defaults to the pipeline's shuffle step, else 1 (the servers' order). ``batch_size``
    left out is the pipeline's batch step (its ``drop_last`` honoured), else 256; a
    ``batch_size`` that disagrees with the pipeline's batch step is an error.
    ``batch_size=None`` is unbatched, as in torch: each item is one row (tensors as numpy
    arrays of the row's shape, other columns as Python values), for a DataLoader that
    batches (a pipeline with a batch step refuses it). Its rows are those of a loader with
    ``batch_size=shuffle_buffer``, in order.

    A column's type is fixed by the schema, never by a batch: fixed-shape integer and float
    columns (pixels, padded token ids, numeric features) come out as numpy arrays of shape
    ``(rows, ...)`` whether the file calls them nullable or not (pyarrow, pandas, Spark and
    ``datasets`` call every column nullable); a null in one is an error naming the column and
    row (leave such rows out with ``WHERE col IS NOT NULL``, or fill them with ``COALESCE``).
    Variable-length, string, date and decimal columns come as ``pyarrow.Array`` (nulls kept),
    in every batch. Give exactly one of
    ``sql`` (a row-wise query) or ``pipeline`` (TOML/JSON text or a dict, as for
    ``pushdown run``: the planner places its ops by measured cost).

    ``servers`` may name a fleet: several URLs, or ``dns://name:port`` for every address
    the name resolves to. Shards go to the servers holding their files; a stream that fails
    or receives nothing for ``stall_timeout_s`` is resumed on another holder from its first
    undelivered row (up to ``max_retries`` consecutive failures), so faults never change the
    sequence of batches. Every call before streaming (planning, counts, schemas, tokenizers)
    has a deadline, ``call_timeout_s`` (default: ``stall_timeout_s``): a server silent that
    long is passed over, and each epoch is planned on the servers that answer, as long as
    they hold every file the silent one offered; otherwise the error names it and its files.

    ``concurrency`` (shard streams in flight) left unset is tuned while the epoch runs: it
    grows while the loader waits and each step raises the rate, within 1 GiB of read-ahead,
    and never changes the batches. ``bandwidth_bytes_per_s`` left unset is found: servers on
    this host are unlimited (uncompressed streams), others' streams are compressed by their
    servers while the link holds them back.

    Secured servers: ``token`` is sent as ``authorization: Bearer <token>`` (servers started
    with ``--auth-tokens``); ``https://`` servers are checked against ``tls_ca`` (a PEM file;
    default: the system's roots), and ``tls_client_cert`` + ``tls_client_key`` (PEM files)
    answer servers that require mutual TLS. Unset, each falls back to ``PUSHDOWN_TOKEN``,
    ``PUSHDOWN_TLS_CA``, ``PUSHDOWN_TLS_CLIENT_CERT`` and ``PUSHDOWN_TLS_CLIENT_KEY``.

    Data echoing: ``echo=k`` delivers each reduced sample ``k`` times per epoch, before the
    pipeline's random ops (each repeat augmented anew) and spread by the shuffle window
    (needs ``shuffle_buffer`` ≥ 2); ``echo="auto"`` picks ``k`` ≤ ``echo_max`` each epoch
    from the share of the last one spent waiting. Either way the sequence is a function of
    the seed and resumes exactly. Every ``report_every_s`` seconds (0: never) the loader
    tells its servers how long it waits, for their scaling signal.

    **Ranks and elastic resume.** The epoch's rows are cut into ``partitions`` contiguous
    parts (default 8 with a shuffle); each global batch of ``batch_size × world_size`` rows
    takes a chunk of every part, and rank ``rank`` reads ``partitions / world_size`` whole
    parts, so every rank gets ``batch_size`` rows of each global batch and reads only its own
    contiguous part of the data. Any ``world_size`` that divides ``partitions`` sees the same
    global batches, with the same shuffle window per global batch: at world size ``W`` give
    ``batch_size = G / W`` and ``shuffle_buffer = S / W`` for a global batch ``G`` and window
    ``S``. ``state_dict()`` is the same on every rank, and ``load_state_dict`` continues it at
    another world size with the next global batch; a state whose global batch, window, seed
    or query differ is refused, naming what differs. Jobs that will grow past 8 ranks set
    ``partitions`` (e.g. 64) from their first run; a restored state keeps its own. Without a
    shuffle the default is one part per rank (the dataset's order at world size 1). Without
    ``drop_last`` a last global batch of fewer rows is split the same way, a rank one row
    short repeating one (at most ``world_size - 1`` rows repeat, as ``DistributedSampler``).

    **Mixtures.** ``mixture=[{"sql": ..., "weight": 0.7}, {"pipeline": ..., "weight": 0.3,
    "servers": [...]}]`` (instead of ``sql``/``pipeline``) mixes sources with the same columns
    (checked when the loader is made; a mismatch names the columns). Every global batch holds
    each source's rows in proportion to the weights, within a row; each rank reads only its
    partitions of every source. A source that runs out begins its own next epoch (its rows
    once per its own epoch); the mixture's epoch is as many rows as the sources hold
    together, in whole global batches (``drop_last`` has nothing to drop). Its state resumes
    exactly and elastically, as one source's does, on the same files; the sources are
    planned when the loader is made. ``echo`` is not available with a mixture.

    **Packed tokens.** ``pack={"column": "tokens", "length": L, "eos_id": 2}`` packs each
    document's token ids (a list column, as ``tokenize`` makes) into blocks of exactly ``L``
    tokens, after the shuffle: each batch is ``{"tokens": [b, L] uint32, "position_ids":
    [b, L] int32}``, ``b = batch_size`` blocks, positions restarting at 0 at each document
    (what FlashAttention's variable-length kernels and document masks take). A document cut
    at a block's end continues in the next block, its positions continuing;
    ``"split_documents": False`` starts each document in a fresh block instead, padding the
    block's tail with ``pad_id`` (default ``eos_id``, else 0) and cutting a document longer
    than a block. Documents are read by partition, each partition packed on its own, so any
    world size dividing ``partitions`` sees the same global batches. The stream runs on
    across the documents' epochs: a loader epoch is as many batches as one pass fills
    (estimated from the first documents). Each rank's ``state_dict()`` holds its own
    partitions' packers: the same world size restores from its own, another from the list of
    every rank's states (``load_state_dict([s0, s1, ...])``).

    **Coordinated length buckets.** ``bucket_by={"column": "tokens", "boundaries": [64, 256,
    1024], "pad_id": 0}`` (instead of ``pack``) keeps sequences whole and draws every global
    batch from one length bucket (``[0, 64)``, ``[64, 256)``, ``[256, 1024)``, ``[1024, ∞)``), so
    every rank's share of a step holds sequences of about one length and no rank waits for
    another's long tail (tf.data service's coordinated reads). Each batch pads the column to
    its own longest sequence (``[b, longest]``, 16-bit ids stay 16-bit) and gives each row's
    length in ``"<column>_length"``. Which bucket each global batch takes is a function of the
    seed and the buckets' shares of the first rows of every partition, the same on every rank.
    Rows are read by partition as with ``pack``; the stream runs on across epochs of
    ``⌊rows / (batch_size · world_size)⌋`` batches, and ``state_dict()`` resumes exactly, at
    another world size from the list of every rank's states.

    **A tokenizer of the trainer's.** ``tokenizer="path/to/tokenizer.json"`` (or its bytes)
    is the tokenizer of every ``tokenize`` call that names none, wherever the call runs. Each
    server is given it once, kept there by its content (``sha256:…``, the same file is one
    entry whoever sends it); a server that restarted is given it again when the next epoch
    is planned. Calls may also name a tokenizer of the server's folder (``pushdown serve
    --tokenizers DIR``: ``tokenize(body, 512, 'llama3')`` reads ``DIR/llama3.json``).

    **Cores kept apart.** ``cpu_affinity=[2, 3]`` (or ``"2-3"``, or the environment's
    ``PUSHDOWN_LOADER_CPUS``) confines the loader's threads (the network, client-side ops,
    tensor building) to those CPUs, so the training loop's own thread, which launches the
    accelerator's kernels, keeps the others to itself. Each must be a CPU this process may
    run on (``os.sched_getaffinity(0)``). The batches do not depend on it.

    ``placement`` says where a pipeline's ops run: ``"costed"`` (the planner's choice, which
    may split an op's shards between the servers and this process), ``"server"``,
    ``"trainer"``, ``"split:F"`` (the servers reduce a fraction ``F`` of the shards) or
    ``"adaptive"`` (each shard placed when it is requested, by the rates both ends
    deliver). The batches are the same whichever is chosen.
    """

    def __init__(
        self,
        servers: Union[str, Sequence[str]],
        sql: Optional[str] = None,
        pipeline: Optional[Union[str, Dict[str, Any]]] = None,
        batch_size: Any = "auto",
        shuffle_buffer: Optional[int] = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        epochs: int = 1,
        drop_last: bool = False,
        prefetch: int = 4,
        workers: Optional[int] = None,
        concurrency: Optional[int] = None,
        bandwidth_bytes_per_s: Optional[float] = None,
        compression: str = "auto",
        stall_timeout_s: float = 30.0,
        max_retries: int = 3,
        call_timeout_s: Optional[float] = None,
        token: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_client_cert: Optional[str] = None,
        tls_client_key: Optional[str] = None,
        echo: Union[int, str] = 1,
        echo_max: int = 4,
        report_every_s: float = 1.0,
        placement: str = "costed",
        partitions: Optional[int] = None,
        mixture: Optional[Sequence[Dict[str, Any]]] = None,
        pack: Optional[Dict[str, Any]] = None,
        bucket_by: Optional[Dict[str, Any]] = None,
        tokenizer: Optional[Union[str, "os.PathLike[str]", bytes]] = None,
        cpu_affinity: Optional[Union[Sequence[int], str]] = None,
    ) -> None:
        if isinstance(servers, str):
            servers = [servers]
        sources = None if mixture is None else _mixture_sources(mixture)
        self._unbatched = batch_size is None
        #: Columns holding bfloat16 numbers (``normalize(..., 'bfloat16')``): numpy arrays of
        #: ``ml_dtypes.bfloat16`` where that package is installed, else of their ``uint16``
        #: bits; ``pushdown.torch`` gives them as ``torch.bfloat16``.
        self.bfloat16_columns: frozenset = frozenset()
        if batch_size == "auto":
            batch_size = None
        elif batch_size is None:
            # Rows are read in batches of one shuffle window (the order cuts its windows in
            # whole batches), or of 256 without one.
            batch_size = shuffle_buffer if shuffle_buffer is not None and shuffle_buffer > 1 else None
        elif not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size={batch_size!r}: rows per batch (1 or more), or None for single rows")
        if self._unbatched and pipeline is not None and _has_batch_step(pipeline):
            raise InvalidArgumentError(
                "batch_size=None asks for single rows, but the pipeline's batch step makes batches: "
                "drop one of them"
            )
        if pipeline is not None and not isinstance(pipeline, str):
            pipeline = json.dumps(pipeline)
        self._inner = _Loader(
            list(servers),
            sql=sql,
            pipeline=pipeline,
            batch_size=batch_size,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
            rank=rank,
            world_size=world_size,
            epochs=epochs,
            drop_last=drop_last,
            prefetch=prefetch,
            workers=workers,
            concurrency=concurrency,
            bandwidth_bytes_per_s=bandwidth_bytes_per_s,
            compression=compression,
            stall_timeout_s=stall_timeout_s,
            max_retries=max_retries,
            call_timeout_s=call_timeout_s,
            token=token,
            tls_ca=None if tls_ca is None else str(tls_ca),
            tls_client_cert=None if tls_client_cert is None else str(tls_client_cert),
            tls_client_key=None if tls_client_key is None else str(tls_client_key),
            echo=echo,
            echo_max=echo_max,
            report_every_s=report_every_s,
            placement=placement,
            partitions=partitions,
            mixture=sources,
            pack=None if pack is None else _pack(pack),
            bucket_by=None if bucket_by is None else _bucket_by(bucket_by),
            tokenizer=_tokenizer_bytes(tokenizer),
            cpu_affinity=_cpus(cpu_affinity),
        )
        if epochs < 1:
            raise InvalidArgumentError("epochs= is the epochs one pass covers: 1 or more")
        self.epochs = epochs
        # The epoch the next pass starts at, unless it continues the loader's position (new,
        # or restored); whether a pass is being iterated.
        self._next_epoch = 0
        self._continue = True
        self._in_pass = False
        self._rows: list = []
        self._before = b""
        self._batch_rows = 0
        self._skip = 0

    def _start_pass(self) -> None:
        epoch, batches = self._inner.position()
        if self._continue:
            # The saved (or initial) position: the pass it lies in, to its end.
            first = epoch - epoch % self.epochs
            self._inner.begin(first, self.epochs, True)
            self._next_epoch = first + self.epochs
            self._continue = False
        else:
            self._inner.begin(self._next_epoch, self.epochs, False)
            self._next_epoch += self.epochs
        self._in_pass = True

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        """The next pass: a new one unless the current one has not given a batch yet."""
        if self._in_pass:
            epoch, batches = self._inner.position()
            untouched = batches == 0 and epoch == self._next_epoch - self.epochs
            if not untouched:
                self._in_pass = False
        if not self._in_pass:
            self._start_pass()
        return self

    def __next__(self) -> Dict[str, Any]:
        if self._unbatched and self._rows:
            return self._rows.pop()
        if not self._in_pass:
            self._start_pass()
        if self._unbatched:
            # Where the batch being split began: an unbatched state resumes inside it.
            self._before = bytes(self._inner.state())
        item = self._inner.next_batch()
        if item is None:
            self._in_pass = False
            raise StopIteration
        batch = _batch(item)
        if not self.bfloat16_columns:
            self.bfloat16_columns = frozenset(name for name, kind, _ in item if kind == "bfloat16")
        if not self._unbatched:
            return batch
        import numpy as np

        columns = {
            name: ([np.asarray(v) for v in value] if hasattr(value, "__array_interface__") else value.to_pylist())
            for name, value in batch.items()
        }
        rows = len(next(iter(columns.values()), []))
        self._rows = [{name: col[i] for name, col in columns.items()} for i in reversed(range(rows))]
        self._batch_rows, skip, self._skip = rows, self._skip, 0
        del self._rows[len(self._rows) - skip:]
        if not self._rows:
            return self.__next__()
        return self._rows.pop()

    def __len__(self) -> int:
        """Batches per epoch on this rank, or rows when unbatched (the same on every rank;
        one pass is ``epochs`` times this)."""
        rows, batches = self._inner.epoch_len()
        return rows if self._unbatched else batches

    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass start at ``epoch`` (as ``DistributedSampler.set_epoch``). After
        ``load_state_dict`` mid-epoch, setting that same epoch keeps the saved position."""
        if epoch < 0:
            raise InvalidArgumentError("set_epoch: an epoch is 0 or more")
        if self._continue and self._inner.position()[0] == epoch:
            return
        self._continue = False
        self._in_pass = False
        self._next_epoch = epoch

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._inner.position()[0]

    def state_dict(self) -> Dict[str, bytes]:
        """Where the loader is: the same bytes on every rank. A loader with the same query,
        seed, global batch and window continues from it, at any world size that divides its
        partitions."""
        if self._unbatched and self._rows:
            return {"pushdown_loader": self._before, "pushdown_rows_taken": self._batch_rows - len(self._rows)}
        return {"pushdown_loader": bytes(self._inner.state())}

    def load_state_dict(self, state: Union[Dict[str, bytes], Sequence[Dict[str, bytes]]]) -> None:
        """Continues from ``state``, or from the states of every rank saved at one step (a
        list): a packed loader's ranks each know their own partitions, so at another world
        size it continues from all of them together (``torch.distributed.all_gather_object``
        collects them)."""
        states = [state] if isinstance(state, dict) else list(state)
        if not states:
            raise InvalidArgumentError("load_state_dict: no state given")
        self._inner.restore([s["pushdown_loader"] for s in states])
        state = states[0]
        self._continue = True
        self._in_pass = False
        self._rows = []
        self._skip = int(state.get("pushdown_rows_taken", 0))

    @property
    def stats(self) -> Dict[str, float]:
        """Batches and rows delivered, the fraction of time the consumer waited, the distinct
        rows read (fewer than ``rows`` when echoing) and the current echo factor."""
        return dict(self._inner.stats())


def _pack(pack: Dict[str, Any]) -> tuple:
    """``pack=`` as the native loader takes it: ``(column, length, eos_id, split_documents,
    pad_id)``."""
    if not isinstance(pack, dict) or "column" not in pack or "length" not in pack:
        raise InvalidArgumentError('pack= is a dict: {"column": "tokens", "length": 2048, "eos_id": ...}')
    unknown = sorted(set(pack) - {"column", "length", "eos_id", "split_documents", "pad_id"})
    if unknown:
        raise InvalidArgumentError(f"pack=: unknown keys {unknown}; known: column, length, eos_id, split_documents, pad_id")
    return (pack["column"], int(pack["length"]), pack.get("eos_id"), bool(pack.get("split_documents", True)),
            pack.get("pad_id"))


def _cpus(cpus: Optional[Union[Sequence[int], str]]) -> Optional[list]:
    """``cpu_affinity=`` as the native loader takes it: a list of CPU numbers."""
    if cpus is None:
        return None
    if isinstance(cpus, str):
        out: list = []
        for part in filter(None, (p.strip() for p in cpus.split(","))):
            first, _, last = part.partition("-")
            try:
                out.extend(range(int(first), int(last or first) + 1))
            except ValueError:
                raise InvalidArgumentError(f"cpu_affinity={cpus!r}: a CPU list is written 0-3,8") from None
        return out
    return [int(c) for c in cpus]


def _tokenizer_bytes(tokenizer: Optional[Union[str, "os.PathLike[str]", bytes]]) -> Optional[bytes]:
    """``tokenizer=`` as the native loader takes it: the ``tokenizer.json`` bytes."""
    if tokenizer is None or isinstance(tokenizer, bytes):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        with open(tokenizer, "rb") as f:
            return f.read()
    raise InvalidArgumentError(f"tokenizer= is a tokenizer.json path or its bytes, got {type(tokenizer).__name__}")


def _bucket_by(bucket_by: Dict[str, Any]) -> tuple:
    """``bucket_by=`` as the native loader takes it: ``(column, boundaries, pad_id)``."""
    if not isinstance(bucket_by, dict) or "column" not in bucket_by or "boundaries" not in bucket_by:
        raise InvalidArgumentError('bucket_by= is a dict: {"column": "tokens", "boundaries": [64, 256, 1024], "pad_id": 0}')
    unknown = sorted(set(bucket_by) - {"column", "boundaries", "pad_id"})
    if unknown:
        raise InvalidArgumentError(f"bucket_by=: unknown keys {unknown}; known: column, boundaries, pad_id")
    boundaries = bucket_by["boundaries"]
    if isinstance(boundaries, (str, bytes)) or not all(isinstance(b, int) and b >= 0 for b in boundaries):
        raise InvalidArgumentError(f"bucket_by=: boundaries are increasing lengths in tokens, got {boundaries!r}")
    return (bucket_by["column"], [int(b) for b in boundaries], int(bucket_by.get("pad_id", 0)))


def _mixture_sources(mixture: Sequence[Dict[str, Any]]) -> list:
    """``mixture=`` as the native loader takes it: ``(sql, pipeline, weight, servers)`` each."""
    if isinstance(mixture, (str, bytes, dict)) or not hasattr(mixture, "__iter__"):
        raise InvalidArgumentError("mixture= is a list of sources, each a dict with sql= or pipeline= and weight=")
    out = []
    for i, source in enumerate(mixture):
        if not isinstance(source, dict):
            raise InvalidArgumentError(f"mixture source {i}: a dict with sql= or pipeline=, weight= and optionally servers=")
        unknown = sorted(set(source) - {"sql", "pipeline", "weight", "servers"})
        if unknown:
            raise InvalidArgumentError(f"mixture source {i}: unknown keys {unknown} (sql, pipeline, weight, servers)")
        if "weight" not in source:
            raise InvalidArgumentError(f"mixture source {i}: weight= is missing")
        pipeline = source.get("pipeline")
        if pipeline is not None and not isinstance(pipeline, str):
            pipeline = json.dumps(pipeline)
        servers = source.get("servers")
        if isinstance(servers, str):
            servers = [servers]
        out.append((source.get("sql"), pipeline, float(source["weight"]), None if servers is None else list(servers)))
    return out


class Transform:
    """A pipeline's per-row steps (its op calls and selects, deterministic and random) applied
    to ``pyarrow.RecordBatch``es you read yourself, with the same kernels a server and the
    ``Loader`` run.

    For readers of your own (``pyarrow.dataset``, a feature store): the pipeline's filters,
    shuffles and batching are not applied here. ``Transform.filters(pipeline)`` returns the
    filters as SQL, for the reader to evaluate::

        t = pushdown.Transform(pipeline, seed=0)
        for i, batch in enumerate(scanner.to_batches()):
            out = t(batch, key=i)   # the same batch and key give the same output

    Tokenizers are given as ``{name: tokenizer.json bytes}``; as on a server, the one named
    after the pipeline's dataset is the default (a server reads it from the dataset's
    ``tokenizer.json``). Batches cross into Rust as Arrow IPC (one copy each way).
    """

    def __init__(
        self,
        pipeline: Union[str, Dict[str, Any]],
        seed: int = 0,
        tokenizers: Optional[Dict[str, bytes]] = None,
    ) -> None:
        if not isinstance(pipeline, str):
            pipeline = json.dumps(pipeline)
        self._inner = _Transform(pipeline, seed=seed, tokenizers=tokenizers)

    @staticmethod
    def filters(pipeline: Union[str, Dict[str, Any]]) -> list:
        if not isinstance(pipeline, str):
            pipeline = json.dumps(pipeline)
        return list(_Transform.filters(pipeline))

    def __call__(self, batch, key: int = 0):
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        out = self._inner.apply(sink.getvalue().to_pybytes(), key)
        return pa.ipc.open_stream(out).read_next_batch()
