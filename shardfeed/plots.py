"""Plots for ``shardfeed inspect --plot`` (matplotlib, the ``[plot]`` extra)."""

from __future__ import annotations

import os

import numpy as np

from shardfeed.formats.atomic import temp_name
from shardfeed.planning.assign import EpochPlan
from shardfeed.planning.hot import coverage_curve
from shardfeed.schemas.errors import ShardfeedError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ShardfeedError("--plot needs matplotlib: pip install 'shardfeed[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_assignment(report: dict, plan: EpochPlan, span_bytes: np.ndarray, out: str) -> None:
    """Two panels: each rank's bytes against the mean (coloured by node, with the +-2% target), and the
    bytes each node reads from each shard (its shard set is its bright band)."""
    plt = _pyplot()
    ranks = report["ranks"]
    nodes = len(report["nodes"])
    nbytes = np.array([r["bytes"] for r in ranks], dtype=np.float64) / 1e6
    node = np.array([r["node"] for r in ranks])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), constrained_layout=True)
    colours = plt.get_cmap("tab20")(node % 20)
    mean = float(nbytes.mean()) if len(nbytes) else 0.0
    deviation = (nbytes / mean - 1) * 100 if mean else np.zeros_like(nbytes)
    top.bar(np.arange(len(ranks)), deviation, width=1.0, color=colours, linewidth=0)
    top.axhspan(-2, 2, color="grey", alpha=0.15, label="target: within 2% of the mean")
    top.axhline(0, color="black", linewidth=0.8, label=f"mean {mean:,.2f} MB")
    top.set_xlim(-0.5, len(ranks) - 0.5)
    limit = max(2.5, float(np.abs(deviation).max(initial=0)) * 1.2)
    top.set_ylim(-limit, limit)
    top.set_xlabel("rank (colour: node)")
    top.set_ylabel("payload bytes vs mean, %")
    top.set_title(
        f"epoch {report['epoch']}: {report['samples_per_rank']:,} samples per rank, "
        f"bytes max/mean {report['bytes_max_over_mean']:.4f}"
    )
    top.legend(loc="lower right")
    shards = int(plan.spans.shard.max(initial=-1)) + 1
    matrix = np.zeros((nodes, max(shards, 1)))
    np.add.at(matrix, (plan.rank // (len(ranks) // max(nodes, 1)), plan.spans.shard), span_bytes)
    image = bottom.imshow(
        matrix / 1e6, aspect="auto", interpolation="nearest", cmap="viridis", origin="lower"
    )
    bottom.set_xlabel("shard (position in the manifest)")
    bottom.set_ylabel("node")
    if nodes <= 32:
        bottom.set_yticks(range(nodes))
    share = min((n["home_share"] for n in report["nodes"]), default=1.0)
    bottom.set_title(f"MB each node reads from each shard (lowest home share {share:.3f})")
    fig.colorbar(image, ax=bottom, label="MB")
    _save(fig, plt, out)


def plot_hot_cdf(hot, out: str) -> None:
    """The hot-set CDF: share of expected accessed bytes (and of accesses) served against cache
    size, as a share of the dataset's payload."""
    plt = _pyplot()
    dataset_bytes = sum(s.payload_bytes for s in hot.source.manifest.shards) or 1
    order = np.arange(len(hot.index))
    cum_bytes, bytes_share = coverage_curve(hot.accesses, hot.bytes, order)
    counts = np.concatenate([[0.0], np.cumsum(hot.accesses)])
    step = max(1, len(cum_bytes) // 4000)  # a few thousand points draw the same curve
    x = cum_bytes[::step] / dataset_bytes * 100
    fig, axis = plt.subplots(figsize=(8, 5), constrained_layout=True)
    axis.plot(x, bytes_share[::step] * 100, label="expected accessed bytes")
    axis.plot(x, counts[::step] / max(counts[-1], 1e-300) * 100, label="expected accesses", ls="--")
    axis.set_xlabel("cache size, % of the dataset's payload (hottest samples first)")
    axis.set_ylabel("served from the cache, %")
    axis.set_xlim(0, 100)
    axis.set_ylim(0, 100)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    axis.set_title(f"hot-set CDF: {hot.header.samples:,} samples ({hot.header.source.kind})")
    _save(fig, plt, out)


def _save(fig, plt, out: str) -> None:
    tmp = temp_name(out)
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    os.replace(tmp, out)
