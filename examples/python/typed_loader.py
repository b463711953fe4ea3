"""Reading a pushdown server from Python, with the errors a trainer catches told apart.

    python examples/python/typed_loader.py http://127.0.0.1:50051 "SELECT id FROM clicks"

Checked with `mypy --strict` in the tests (tests/python/test_errors.py): the package ships
`py.typed` and a stub of its native module.
"""

from __future__ import annotations

import sys
import time
from typing import Dict, List

import numpy as np

import pushdown


def read_epoch(servers: List[str], sql: str, attempts: int = 3) -> Dict[str, int]:
    """Rows and batches of one epoch; an unreachable fleet is retried, a bad query is not."""
    for attempt in range(attempts):
        try:
            loader = pushdown.Loader(servers, sql=sql, batch_size=256, call_timeout_s=5.0)
            rows, batches = 0, 0
            for batch in loader:
                first: np.ndarray = next(iter(batch.values()))
                rows += len(first)
                batches += 1
            return {"rows": rows, "batches": batches}
        except (pushdown.UnavailableError, pushdown.TimedOutError) as e:
            print(f"attempt {attempt + 1}: {e.kind}: {e}", file=sys.stderr)
            time.sleep(1.0)
        except pushdown.InvalidArgumentError as e:
            raise SystemExit(f"the query is refused: {e}") from e
        except pushdown.PushdownError as e:
            raise SystemExit(f"{e.kind}: {e}") from e
    raise SystemExit(f"no server answered in {attempts} attempts")


def main() -> None:
    counts = read_epoch([sys.argv[1]], sys.argv[2])
    print(f"{counts['rows']} rows in {counts['batches']} batches")


if __name__ == "__main__":
    main()
