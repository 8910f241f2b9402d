"""Imports every probe family so its tests register (in report order)."""

from ccbridge.probe import (  # noqa: F401
    compute,
    transfer,
    semantics,
    smallcopy,
    concurrency,
    launch,
    toll,
    framework,
    lifecycle,
    hostcrypto,
    peer,
)
