"""The ``pushdown`` console script: the server and command line (``pushdown serve``,
``gen``, ``run``, ``explain``, ``demo``, ``scaling``), the same command as the Rust binary,
carried inside the wheel's native module."""

from __future__ import annotations

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line ``argv`` (default: this process's arguments) and returns its
    exit status; as the console script, exits with it."""
    import signal

    from ._native import cli_main

    args = ["pushdown", *(sys.argv[1:] if argv is None else argv)]
    # The command runs without the interpreter's lock, where Python's SIGINT handler (a flag
    # checked between bytecodes) would never act: Ctrl-C stops it as it stops the binary
    # (`serve` installs its own handler and drains first).
    if argv is None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return cli_main(args)


if __name__ == "__main__":  # pragma: no cover - `python -m pushdown._cli`
    sys.exit(main())
