"""Ray Data integration: ``pushdown.ray.read``, a ``ray.data.Datasource`` over pushdown servers.

    import pushdown.ray
    ds = pushdown.ray.read(["http://storage-1:50051"],
                           sql="SELECT label, decode_resize(image, 64, 64) AS pixels FROM images")
    ds = ds.select_columns(["pixels", "label"]).filter(expr="label < 10")   # pushed to the servers
    for batch in ds.iter_batches(batch_size=256): ...        # or a Ray Train worker's shard

The query is planned on every server once Ray has optimized the dataset: one read task per
shard, each carrying the locations of the servers that hold it (a task tries them in turn
until one answers). Ray's projection (``select_columns``) and its predicate (``filter(expr=...)``,
``col("label") < 10``) become part of the servers' query, so unused columns and filtered rows
never leave them, and the reducing ops of the SQL or pipeline (decode and resize, tokenize, …)
run at the servers. A predicate that cannot be written as SQL (a UDF, floor division) stays a
Ray ``Filter`` over the read. A pipeline runs whole at the servers: its trainer-side steps
(shuffle, batch, random augmentation) are refused; Ray shuffles (``random_shuffle``), batches
(``iter_batches``) and augments (``map_batches``) itself.

Read tasks use pyarrow's own Flight client (Ray Data's blocks are pyarrow tables), with the
bearer ``token`` and the ``tls_ca`` given here. Requires ``ray[data]`` (``pip install
'pushdown[ray]'``) on the driver and the workers, and pushdown on the workers.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

try:
    import ray.data
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource as _RayDatasource
    from ray.data.datasource import ReadTask
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("pushdown.ray needs Ray Data: pip install 'pushdown[ray]' (or 'ray[data]')") from e

from . import InvalidArgumentError, UnavailableError
from ._native import plan_read

__all__ = ["PushdownDatasource", "read", "to_sql"]


def read(
    servers: Union[str, Sequence[str]],
    *,
    sql: Optional[str] = None,
    pipeline: Optional[Union[str, Dict[str, Any]]] = None,
    compression: str = "auto",
    token: Optional[str] = None,
    tls_ca: Optional[str] = None,
    call_timeout_s: float = 30.0,
    **read_args: Any,
) -> "ray.data.Dataset":
    """A Ray ``Dataset`` of ``sql`` (a row-wise query) or ``pipeline`` (TOML/JSON text or a
    dict, as for ``pushdown.Loader``) served by ``servers`` (a URL, several, or
    ``dns://name:port``). ``compression``: the streams' codec (``auto``: each server
    measures its link and picks per batch, as ``adaptive``; or ``zstd``, ``lz4``, ``none``). Other keyword arguments go to ``ray.data.read_datasource``
    (``concurrency``, ``num_cpus``, ``ray_remote_args``, ...)."""
    datasource = PushdownDatasource(
        servers, sql=sql, pipeline=pipeline, compression=compression, token=token, tls_ca=tls_ca,
        call_timeout_s=call_timeout_s,
    )
    return ray.data.read_datasource(datasource, **read_args)


class PushdownDatasource(_RayDatasource):
    """The ``ray.data.Datasource`` behind :func:`read`: projection and predicate pushdown, one
    read task per shard."""

    def __init__(
        self,
        servers: Union[str, Sequence[str]],
        *,
        sql: Optional[str] = None,
        pipeline: Optional[Union[str, Dict[str, Any]]] = None,
        compression: str = "auto",
        token: Optional[str] = None,
        tls_ca: Optional[str] = None,
        call_timeout_s: float = 30.0,
    ) -> None:
        super().__init__()
        if (sql is None) == (pipeline is None):
            raise InvalidArgumentError("pushdown.ray.read: give exactly one of sql= or pipeline=")
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.sql = sql
        self.pipeline = pipeline if pipeline is None or isinstance(pipeline, str) else json.dumps(pipeline)
        self.compression = compression
        self.token = token
        self.tls_ca = tls_ca
        self.call_timeout_s = call_timeout_s
        self._projection_map: Optional[Dict[str, str]] = None
        self._predicate_sql: Optional[str] = None

    def get_name(self) -> str:
        return "Pushdown"

    def supports_projection_pushdown(self) -> bool:
        return True

    def supports_predicate_pushdown(self) -> bool:
        return True

    def apply_predicate(self, predicate_expr: Any) -> "PushdownDatasource":
        """Ray's predicate as SQL in the servers' query; itself (the ``Filter`` kept above the
        read) when the predicate has a part SQL cannot say the same way."""
        text = to_sql(predicate_expr)
        if text is None:
            return self
        clone = super().apply_predicate(predicate_expr)
        clone._predicate_sql = text if self._predicate_sql is None else f"({self._predicate_sql}) AND ({text})"
        return clone

    @property
    def columns(self) -> Optional[List[str]]:
        """The columns Ray keeps (``None``: all)."""
        return None if self._projection_map is None else list(self._projection_map)

    @property
    def predicate(self) -> Optional[str]:
        """Ray's predicate, as the SQL the servers run (``None``: none pushed)."""
        return self._predicate_sql

    def plan(self) -> Any:
        """The servers' plan (``pyarrow.flight.FlightInfo``): one endpoint per shard."""
        import pyarrow.flight as flight

        info = plan_read(
            self.servers, sql=self.sql, pipeline=self.pipeline, columns=self.columns,
            predicate=self._predicate_sql, compression=self.compression,
            call_timeout_s=self.call_timeout_s, token=self.token, tls_ca=self.tls_ca,
        )
        return flight.FlightInfo.deserialize(info)

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return None  # the servers' estimate bounds bytes scanned, not what the ops produce

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: Optional[int] = None, data_context: Any = None
    ) -> List[ReadTask]:
        info = self.plan()
        schema = info.schema
        tls_root = pathlib.Path(self.tls_ca).read_bytes() if self.tls_ca else None
        tasks = []
        for endpoint in info.endpoints:
            locations = [_flight_uri(loc.uri) for loc in endpoint.locations] or [_flight_uri(s) for s in self.servers]
            read = functools.partial(_read_shard, endpoint.ticket.ticket, locations, self.token, tls_root)
            metadata = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
            tasks.append(ReadTask(read, metadata, schema=schema, per_task_row_limit=per_task_row_limit))
        return tasks


def _flight_uri(uri: Union[str, bytes]) -> str:
    """A server URL as pyarrow's Flight client takes it (``http`` is ``grpc+tcp``)."""
    text = uri.decode() if isinstance(uri, bytes) else uri
    for ours, theirs in (("http://", "grpc+tcp://"), ("https://", "grpc+tls://"), ("grpc://", "grpc+tcp://")):
        if text.startswith(ours):
            return theirs + text[len(ours):]
    return text


def _read_shard(ticket: bytes, locations: List[str], token: Optional[str], tls_root: Optional[bytes]) -> Iterator[Any]:
    """One shard's rows as pyarrow tables, from the first of its servers that answers. A
    server that cannot be reached is passed over; any other error (a bad value, a damaged
    file, a refused token) is the shard's and raised as it is."""
    import pyarrow as pa
    import pyarrow.flight as flight

    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    options = flight.FlightCallOptions(headers=headers)
    passed: List[str] = []
    for location in locations:
        client = flight.connect(location, tls_root_certs=tls_root) if tls_root else flight.connect(location)
        try:
            try:
                reader = client.do_get(flight.Ticket(ticket), options)
                first = reader.read_chunk()
            except (flight.FlightUnavailableError, flight.FlightTimedOutError) as e:
                passed.append(f"{location}: {e}")
                continue
            except StopIteration:
                return
            yield pa.Table.from_batches([first.data])
            for chunk in reader:
                yield pa.Table.from_batches([chunk.data])
            return
        finally:
            client.close()
    raise UnavailableError("no server holding this shard answered: " + "; ".join(passed))


_BINARY = {
    "add": "+", "sub": "-", "mul": "*", "gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "=",
    "ne": "<>", "and": "AND", "or": "OR",
}


def to_sql(expr: Any) -> Optional[str]:
    """A Ray Data expression as SQL with the same meaning, or ``None`` where there is none
    here (UDFs, division, ``random()``, literals other than numbers, strings, booleans and
    null): such a predicate stays in Ray."""
    kind = type(expr).__name__
    if kind == "ColumnExpr":
        return '"' + expr.name.replace('"', '""') + '"'
    if kind == "LiteralExpr":
        return _literal(expr.value)
    if kind == "AliasExpr":
        return to_sql(expr.expr)
    op = getattr(getattr(expr, "op", None), "value", None)
    if kind == "UnaryExpr":
        operand = to_sql(expr.operand)
        forms = {"not": "(NOT {})", "is_null": "({} IS NULL)", "is_not_null": "({} IS NOT NULL)"}
        return None if operand is None or op not in forms else forms[op].format(operand)
    if kind == "BinaryExpr":
        left = to_sql(expr.left)
        if op in ("in", "not_in"):
            values = getattr(expr.right, "value", None)
            values = values if isinstance(values, list) else [values]
            items = [_literal(v) for v in values]
            if left is None or not items or any(i is None for i in items):
                return None
            return f"({left} {'IN' if op == 'in' else 'NOT IN'} ({', '.join(items)}))"  # type: ignore[arg-type]
        right = to_sql(expr.right)
        if left is None or right is None or op not in _BINARY:
            return None
        return f"({left} {_BINARY[op]} {right})"
    return None


def _literal(value: Any) -> Optional[str]:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return None
