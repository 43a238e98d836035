"""Datasets and tier configs shared by the staging, tier-read, warm and Lustre tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardfeed.formats.atomic import is_temp_name
from shardfeed.formats.dataset_writer import write_dataset
from shardfeed.formats.layout import LEASE_NAME

SPEC = {"blob": {"dtype": "image", "shape": [8, 8, 3]}, "id": {"dtype": "int64", "shape": [1]}}


def dataset(root: Path, n: int = 400, size: int = 2000, hot_shards: int = 0) -> Path:
    """About eight shards of random bytes; the first ``hot_shards`` marked hot, as
    ``convert --hot-weights`` would."""
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(int(k)) for k in rng.integers(size // 2, size * 2, n)]
    write_dataset(
        root,
        SPEC,
        {"blob": blobs, "id": [[i] for i in range(n)]},
        target_shard_size=n * size // 8,
        row_group_size=n * size // 32,
        cost="bytes",  # random bytes are not images: count payload bytes
    )
    if hot_shards:
        path = root / "meta/shardfeed/manifest.json"
        text = path.read_text()
        path.write_text(
            text.replace('\n  "provenance"', f'\n  "hot_shards": {hot_shards},\n  "provenance"')
        )
    return root


def tiers_toml(base: Path, capacity: str = "1GB", cold: bool = True) -> Path:
    """nvme (node, 5GB/s), pfs (shared, 2GB/s: every file), warm (shared, 1GB/s: hot shards)
    and, with ``cold``, an S3 tier (100MB/s: every file)."""
    text = f"""
[tiers.nvme]
path = "{base}/nvme/{{dataset}}"
scope = "node"
capacity = "1GB"
read_bandwidth = "5GB/s"

[tiers.pfs]
path = "{base}/pfs/{{dataset}}"
scope = "shared"
capacity = "{capacity}"
read_bandwidth = "2GB/s"

[tiers.warm]
path = "{base}/warm/{{dataset}}"
scope = "shared"
capacity = "1GB"
read_bandwidth = "1GB/s"
"""
    if cold:
        text += """
[tiers.cold]
path = "s3://bucket/datasets/{dataset}"
scope = "shared"
capacity = "1GB"
read_bandwidth = "100MB/s"
"""
    text += f"""
[policy]
hot = ["nvme", "warm"]
all = {'["pfs", "cold"]' if cold else '["pfs"]'}
"""
    path = base / "tiers.toml"
    path.write_text(text)
    return path


def final_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but shardfeed's temporary ones and a writer's lease (a killed
    run leaves its own), by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not is_temp_name(p.name) and p.name != LEASE_NAME
    }
