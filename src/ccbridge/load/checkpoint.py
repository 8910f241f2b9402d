"""Which files a checkpoint is: one file, several, or a directory with or without an index."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ccbridge import schema
from ccbridge.errors import UsageError
from ccbridge.load.header import Header, HeaderError

INDEX_SUFFIX = ".safetensors.index.json"
# Hugging Face's shard index: {"weight_map": {tensor name: shard file name}, "metadata": {...}}
INDEX = schema.Schema(schema.record({"weight_map": schema.mapping(schema.STRING), "metadata": {"type": "object"}},
                                    required=("weight_map",)))


def _index_files(index: Path) -> tuple[list[Path], dict[str, str]]:
    where = str(index)
    try:
        obj = json.loads(index.read_text(encoding="utf-8"))
    except OSError as e:
        raise HeaderError(where, "unreadable", e.strerror or str(e)) from None
    except (UnicodeDecodeError, ValueError) as e:
        raise HeaderError(where, "index not JSON", str(e)) from None
    problem = INDEX.problem(obj)
    if problem is not None:
        raise HeaderError(where, "malformed index", problem)
    wm = obj["weight_map"]
    files = []
    for name in dict.fromkeys(wm.values()):  # first-seen order, once each
        if Path(name).name != name:
            raise HeaderError(where, "index weight_map", f"file {name!r} is not a plain file name next to the index")
        files.append(index.parent / name)
    return files, wm


def resolve(paths) -> tuple[list[str], dict[str, str] | None, str | None]:
    """(files, weight map or None, index path or None) for a path or a list of paths.

    A directory means its index (*.safetensors.index.json) if it has one,
    else every *.safetensors in it; an index file means the files it names.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise UsageError("no checkpoint given: pass a .safetensors file, several, a directory or an index")
    files: list[Path] = []
    weight_map, index = None, None
    for item in map(Path, items):
        if not item.exists():
            raise UsageError(f"{item}: no such file or directory")
        if item.is_dir():
            indexes = sorted(item.glob("*" + INDEX_SUFFIX))
            if len(indexes) > 1:
                raise HeaderError(str(item), "several indexes", ", ".join(p.name for p in indexes))
            if indexes:
                item = indexes[0]
            else:
                found = sorted(item.glob("*.safetensors"))
                if not found:
                    raise HeaderError(str(item), "empty checkpoint", "no *.safetensors files and no index here")
                files += found
                continue
        if item.name.endswith(".json"):
            if len(items) > 1:
                raise UsageError(f"an index ({item}) must be the only path given")
            index = str(item)
            files, weight_map = _index_files(item)
            continue
        files.append(item)
    seen: dict[str, Path] = {}
    for f in files:
        key = os.path.realpath(f)
        if key in seen:
            raise UsageError(f"{f} is given twice" + (f" (as {seen[key]})" if str(seen[key]) != str(f) else ""))
        seen[key] = f
    return [str(f) for f in files], weight_map, index


def check_names(headers: list[Header], weight_map: dict[str, str] | None, index: str | None) -> None:
    """Tensor names unique across shards, and exactly as the index places them."""
    owner: dict[str, str] = {}
    for h in headers:
        for t in h.tensors:
            if t.name in owner:
                raise HeaderError(h.path, "duplicate tensor", f"{t.name!r} is also in {owner[t.name]}")
            owner[t.name] = h.path
    if weight_map is None:
        return
    for name, fname in weight_map.items():
        if name not in owner:
            raise HeaderError(index, "index mismatch", f"tensor {name!r} is listed in {fname} but no shard holds it")
        if Path(owner[name]).name != fname:
            raise HeaderError(index, "index mismatch", f"tensor {name!r} is listed in {fname} but is in {Path(owner[name]).name}")
    extra = owner.keys() - weight_map.keys()
    if extra:
        raise HeaderError(index, "index mismatch", f"{len(extra)} tensors not in the index, e.g. {sorted(extra)[0]!r}")
