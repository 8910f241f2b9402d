"""CC-aware components for serving loops: readbacks off the scheduler thread,
inputs staged on an idle stream and packed into one crossing, and the
settings that fit this process's CC state; a paged KV cache whose host tier
spills only blocks seen reused.

    from ccbridge.serve import DrainWorker, StagedH2D, cc_defaults
"""

from ccbridge.serve.defaults import ServeDefaults, cc_defaults
from ccbridge.serve.drain import DrainWorker
from ccbridge.serve.kvcache import KVCache, Lookup, block_hashes
from ccbridge.serve.staged import StagedH2D, layout, pack_into, views

__all__ = ["DrainWorker", "KVCache", "Lookup", "StagedH2D", "ServeDefaults", "block_hashes", "cc_defaults", "layout",
           "pack_into", "views"]
