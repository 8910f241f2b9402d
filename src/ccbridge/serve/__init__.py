"""CC-aware components for serving loops: readbacks off the scheduler thread,
inputs staged on an idle stream and packed into one crossing, and the
settings that fit this process's CC state.

    from ccbridge.serve import DrainWorker, StagedH2D, cc_defaults
"""

from ccbridge.serve.defaults import ServeDefaults, cc_defaults
from ccbridge.serve.drain import DrainWorker
from ccbridge.serve.staged import StagedH2D, layout, pack_into, views

__all__ = ["DrainWorker", "StagedH2D", "ServeDefaults", "cc_defaults", "layout", "pack_into", "views"]
