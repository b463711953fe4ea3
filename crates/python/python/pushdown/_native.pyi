"""The Rust extension module. Use ``pushdown.Loader`` and ``pushdown.Transform``, which wrap it."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

BUILD_PROFILE: str

# One column of a batch: (name, "tensor" | "bfloat16" | "arrow", numpy array | _ArrowBatch).
_Column = Tuple[str, str, Any]

class _ArrowBatch:
    """A batch's Arrow columns, taken once through the Arrow PyCapsule protocol
    (``pyarrow.record_batch(it)``)."""

    def __arrow_c_array__(self, requested_schema: Optional[Any] = None) -> Tuple[Any, Any]: ...
# One source of `mixture=`: (sql, pipeline, weight, servers).
_MixtureSource = Tuple[Optional[str], Optional[str], float, Optional[List[str]]]

class _Loader:
    def __new__(
        cls,
        servers: Sequence[str],
        sql: Optional[str] = None,
        pipeline: Optional[str] = None,
        batch_size: Optional[int] = None,
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
        mixture: Optional[Sequence[_MixtureSource]] = None,
        pack: Optional[Tuple[str, int, Optional[int], bool, Optional[int]]] = None,
        bucket_by: Optional[Tuple[str, Sequence[int], int]] = None,
        tokenizer: Optional[bytes] = None,
        cpu_affinity: Optional[Sequence[int]] = None,
    ) -> "_Loader": ...
    def next_batch(self) -> Optional[List[_Column]]: ...
    def state(self) -> bytes: ...
    def restore(self, states: Sequence[bytes]) -> None: ...
    def begin(self, first: int, count: int, continuing: bool) -> None: ...
    def position(self) -> Tuple[int, int]: ...
    def epoch_len(self) -> Tuple[int, int]: ...
    def stats(self) -> Dict[str, float]: ...

def choose_codec(link: str, forced: Optional[str] = None, profiled: str = "none") -> str: ...

def plan_read(
    servers: Sequence[str],
    sql: Optional[str] = None,
    pipeline: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    predicate: Optional[str] = None,
    compression: str = "auto",
    call_timeout_s: float = 30.0,
    token: Optional[str] = None,
    tls_ca: Optional[str] = None,
    tls_client_cert: Optional[str] = None,
    tls_client_key: Optional[str] = None,
) -> bytes: ...

class _Transform:
    def __new__(
        cls, pipeline: str, seed: int = 0, tokenizers: Optional[Dict[str, bytes]] = None
    ) -> "_Transform": ...
    @staticmethod
    def filters(pipeline: str) -> List[str]: ...
    def apply(self, ipc: bytes, key: int) -> bytes: ...
def cli_main(argv: Sequence[str]) -> int: ...
def import_dataset(kind: str, inputs: Sequence[str], out: str, split: str = "train", progress: bool = False) -> str: ...
