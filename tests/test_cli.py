"""The ``shardfeed`` command line: help, ``inspect`` (human and JSON) and the module entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shardfeed import __version__, open_dataset
from shardfeed.cli.main import main
from shardfeed.schemas import Rejects

REJECTS = Rejects(5, {"bad_image": 2, "too_long": 3})
SHARD_KEYS = {
    "path",
    "bytes",
    "payload_bytes",
    "rows",
    "row_groups",
    "sha256",
    "index_start",
    "index_end",
    "units",
    "footer_sha256",
}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def dataset(make_small_dataset):
    root, manifest, _ = make_small_dataset(rejects=REJECTS, source="unit-test-source")
    return root, manifest


# --------------------------------------------------------------------------------------------
# help and usage


def test_top_level_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: shardfeed" in out
    assert "inspect" in out and "verify" in out


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ("inspect", ["--json", "--shards", "dataset"]),
        ("verify", ["--no-hash", "--json", "dataset"]),
    ],
)
def test_subcommand_help(capsys, command, flags):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: shardfeed {command}" in out
    for flag in flags:
        assert flag in out


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"shardfeed {__version__}"


def test_no_command_prints_help_and_returns_2(capsys):
    assert main([]) == 2
    assert "usage: shardfeed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv", [["frobnicate"], ["inspect"], ["verify"], ["inspect", "--shards", "x", "ds"]]
)
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# inspect


def _line(out: str, label: str) -> str:
    matches = [line for line in out.splitlines() if line.startswith(label)]
    assert len(matches) == 1, (label, out)
    return matches[0]


def test_inspect_human(dataset, capsys):
    root, manifest = dataset
    rc, out, err = run_cli(capsys, "inspect", str(root))
    assert rc == 0, err
    assert err == ""
    assert _line(out, "samples").split() == ["samples", f"{manifest.num_samples:,}"]
    shards_line = _line(out, "shards ")
    assert shards_line.split()[1] == str(len(manifest.shards))
    assert f"{sum(len(s.row_groups) for s in manifest.shards)} row groups" in shards_line
    assert "parquet" in shards_line
    balance = _line(out, "balance")
    assert "bytes max/mean" in balance and "payload max/mean" in balance
    sizes = [s.bytes for s in manifest.shards]
    assert f"{max(sizes) / (sum(sizes) / len(sizes)):.4f}" in balance
    assert _line(out, "rejects").split() == ["rejects", "5"]
    assert "bad_image" in out and "too_long" in out
    assert manifest.fingerprint in _line(out, "fingerprint")
    assert "unit-test-source" in _line(out, "source")
    for name in ("observation.state", "label", "caption", "image"):
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name
    for shard in manifest.shards:
        assert shard.path in out
        assert f"[{shard.index_start}, {shard.index_end})" in out


@pytest.mark.parametrize(("limit", "shown"), [("0", 0), ("2", 2), ("-1", None)])
def test_inspect_shard_limit(dataset, capsys, limit, shown):
    root, manifest = dataset
    rc, out, _ = run_cli(capsys, "inspect", "--shards", limit, str(root))
    assert rc == 0
    listed = [s.path for s in manifest.shards if s.path in out]
    expected = len(manifest.shards) if shown is None else shown
    assert len(listed) == expected
    if 0 < expected < len(manifest.shards):
        assert f"shards (first {expected} of {len(manifest.shards)})" in out


def test_inspect_json(dataset, capsys):
    root, manifest = dataset
    rc, out, err = run_cli(capsys, "inspect", "--json", str(root))
    assert rc == 0, err
    summary = json.loads(out)
    assert {"num_samples", "shards", "balance", "rejects"} <= set(summary)
    assert summary["num_samples"] == manifest.num_samples == 120
    assert summary["num_shards"] == len(manifest.shards)
    assert summary["num_row_groups"] == sum(len(s.row_groups) for s in manifest.shards)
    assert summary["bytes"] == sum(s.bytes for s in manifest.shards)
    assert summary["payload_bytes"] == sum(s.payload_bytes for s in manifest.shards)
    assert summary["fingerprint"] == manifest.fingerprint

    shards = summary["shards"]
    assert isinstance(shards, list) and len(shards) == len(manifest.shards)
    for got, record in zip(shards, manifest.shards, strict=True):
        assert set(got) == SHARD_KEYS
        assert got == record.to_json()
        assert got["index_end"] - got["index_start"] == got["rows"] == sum(got["row_groups"])
        assert os.path.getsize(root / got["path"]) == got["bytes"]
    assert shards[0]["index_start"] == 0 and shards[-1]["index_end"] == summary["num_samples"]

    balance = summary["balance"]
    assert set(balance) == {
        "bytes_max_over_mean",
        "payload_bytes_max_over_mean",
        "oversized_unit_shards",
    }
    assert balance["oversized_unit_shards"] == 0
    sizes = [s["bytes"] for s in shards]
    payloads = [s["payload_bytes"] for s in shards]
    assert balance["bytes_max_over_mean"] == pytest.approx(
        max(sizes) / (sum(sizes) / len(sizes)), abs=1e-4
    )
    assert balance["payload_bytes_max_over_mean"] == pytest.approx(
        max(payloads) / (sum(payloads) / len(payloads)), abs=1e-4
    )
    assert balance["bytes_max_over_mean"] >= 1.0

    assert summary["rejects"] == {"total": 5, "by_reason": {"bad_image": 2, "too_long": 3}}
    assert summary["provenance"]["source"] == "unit-test-source"
    assert summary["features"]["observation.state"] == {
        "dtype": "float32",
        "shape": [3],
        "stored": True,
    }

    # consistent with what the reader sees
    ds = open_dataset(root)
    assert len(ds) == summary["num_samples"]
    assert [s.path for s in ds.shards] == [s["path"] for s in shards]


def test_inspect_does_not_read_shards(dataset, capsys):
    """inspect works from the manifest and info.json alone (no shard is opened)."""
    root, manifest = dataset
    for shard in manifest.shards:
        (root / shard.path).write_bytes(b"")
    rc, out, err = run_cli(capsys, "inspect", "--json", str(root))
    assert rc == 0, err
    assert json.loads(out)["num_samples"] == manifest.num_samples


# --------------------------------------------------------------------------------------------
# module entry point


def test_module_entry_point(dataset, tmp_path):
    root, manifest = dataset
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [sys.executable, "-m", "shardfeed.cli.main", "inspect", str(root)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"samples        {manifest.num_samples:,}" in proc.stdout
    assert "Traceback" not in proc.stderr

    proc = subprocess.run(
        [sys.executable, "-m", "shardfeed.cli.main", "verify", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("shardfeed: error: ")
    assert "Traceback" not in proc.stderr
