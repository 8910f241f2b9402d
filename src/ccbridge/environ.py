"""os.environ changed for a block: what the programs a command starts, or a library it calls that reads getenv,
see, put back as it was after."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping


@contextmanager
def setting(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `values` set for the block, then each name as it was (unset where it was unset), however the
    block ends."""
    was = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in was.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
