"""Data that is not yet Parquet, written as a dataset a pushdown server serves: the same
importer as ``pushdown import KIND INPUT... --out DIR``.

    import pushdown.imports as imports
    summary = imports.imagefolder("~/pets", out="/data/pets")    # class folders, as torchvision
    imports.webdataset(["shard-000000.tar", ...], out="/data/laion")
    imports.audiofolder("~/speech", out="/data/speech")          # with metadata.csv/.jsonl
    imports.jsonl(["a.jsonl", "b.jsonl"], out="/data/text")
    print(summary["rows"], summary["skipped"])                   # every input not imported, named

Inputs and OUT may be object-store URLs (``s3://bucket/prefix``, ``gs://``, ``az://``),
configured from the same variables as ``pushdown serve --data``: a folder is every object under
the prefix, a prefix given for shards or JSONL files is every ``.tar`` (``.jsonl``) under it.

The dataset is the Hugging Face Hub's layout (``OUT/data/<split>-NNNNN-of-NNNNN.parquet``,
images and audio as ``struct<bytes, path>``, the features in the footer): a server with
``--data`` on OUT's parent serves it as OUT's name, and ``datasets.load_dataset(OUT)`` reads
it too. Each function returns the summary as a dict: ``rows``, ``files``, ``bytes_read``,
``bytes_written``, ``seconds`` and ``skipped`` (``{reason: {"count", "named"}}``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Sequence, Union

from ._native import import_dataset as _import

__all__ = ["imagefolder", "webdataset", "audiofolder", "jsonl"]

Path = Union[str, "os.PathLike[str]"]


def _paths(inputs: Union[Path, Sequence[Path]]) -> list:
    """One path (a file, a folder, a URL) or several."""
    if isinstance(inputs, (str, os.PathLike)):
        return [inputs]
    return list(inputs)


def _run(kind: str, inputs: Sequence[Path], out: Path, split: str, progress: bool) -> Dict[str, Any]:
    paths = [os.path.expanduser(os.fspath(p)) for p in inputs]
    return json.loads(_import(kind, paths, os.path.expanduser(os.fspath(out)), split, progress))


def imagefolder(folder: Path, out: Path, split: str = "train", progress: bool = False) -> Dict[str, Any]:
    """Class sub-folders of images (labels by sorted class name, as torchvision's
    ``ImageFolder``; the names in the footer), or images with a ``metadata.csv``/``.jsonl``."""
    return _run("imagefolder", [folder], out, split, progress)


def webdataset(shards: Union[Path, Sequence[Path]], out: Path, split: str = "train",
               progress: bool = False) -> Dict[str, Any]:
    """WebDataset tar shards (files, or folders and prefixes of them): one row per sample
    (``__key__``, ``__url__``, a column per extension)."""
    return _run("webdataset", _paths(shards), out, split, progress)


def audiofolder(folder: Path, out: Path, split: str = "train", progress: bool = False) -> Dict[str, Any]:
    """Audio files with a ``metadata.csv``/``.jsonl`` (``file_name`` and other columns), or in
    class sub-folders, as ``datasets``' ``audiofolder``."""
    return _run("audiofolder", [folder], out, split, progress)


def jsonl(files: Union[Path, Sequence[Path]], out: Path, split: str = "train",
          progress: bool = False) -> Dict[str, Any]:
    """JSON Lines files (or folders and prefixes of ``.jsonl`` files): one row per object, one
    schema inferred over all of them."""
    return _run("jsonl", _paths(files), out, split, progress)
