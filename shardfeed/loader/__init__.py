"""The training-side loader: rank-aware SoA batches with prefetch, node cache and mixtures.

No Beam import. ``ShardLoader`` is the entry point; see docs/LOADER.md.
"""

from __future__ import annotations

from shardfeed.loader.shard_loader import ShardLoader

__all__ = ["ShardLoader"]
