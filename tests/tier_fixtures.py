"""The tier config example shared by the tier and planner tests."""

#: the example of issue 7, byte for byte (docs/PLANNING.md and the README use it too)
EXAMPLE_TIERS = """\
[tiers.nvme]
path = "/local/nvme/{dataset}"
scope = "node"
capacity = "3.5TB"
read_bandwidth = "12GB/s"

[tiers.pfs]
path = "/lustre/datasets/{dataset}"
scope = "shared"
capacity = "2PB"
read_bandwidth = "400GB/s"
stripe_count = "auto"

[tiers.cold]
path = "s3://bucket/datasets/{dataset}"
scope = "shared"
capacity = "10PB"
read_bandwidth = "20GB/s"

[policy]
hot = ["nvme", "pfs"]   # hot shards go to these tiers
all = ["pfs", "cold"]   # every shard goes to these tiers
"""
