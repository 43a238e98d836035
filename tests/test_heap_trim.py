"""``pipelines/heap_trim.py``: freed C-heap memory goes back to the system after large shards."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from shardfeed.pipelines.heap_trim import can_trim

FRAGMENTED = """
    import json, threading
    from shardfeed.pipelines.heap_trim import trim_c_heap

    def rss_mb():
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) for l in status if l.startswith("VmRSS")) / 1024

    kept = []
    def work():  # 1 KB objects (past Python's small-object allocator) in a thread's own arena
        made = [bytes(1000) + bytes([i % 256]) for i in range(200_000)]
        kept.extend(made[::100])  # one in a hundred stays: the arena cannot shrink from its top
    base = rss_mb()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    before = rss_mb()
    trim_c_heap()
    print(json.dumps({"base": base, "before": before, "after": rss_mb()}))
"""


@pytest.mark.skipif(not can_trim(), reason="glibc's malloc_trim (Linux)")
def test_trimming_gives_a_fragmented_threads_arena_back():
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FRAGMENTED)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(out.stdout.splitlines()[-1])
    grown = found["before"] - found["base"]
    assert grown > 100  # about 200 MB of 1 KB objects were made, and 99% freed
    assert found["before"] - found["after"] > 0.7 * grown, found


@pytest.mark.parametrize("large", [True, False])
def test_the_heap_is_trimmed_after_each_large_shard_only(tmp_path, monkeypatch, large):
    from shardfeed.cli.main import main
    from shardfeed.pipelines import convert

    trims: list[int] = []
    monkeypatch.setattr(convert, "LARGE_SHARD_UNITS", 10 if large else 10**9)
    monkeypatch.setattr(convert, "trim_c_heap", lambda: trims.append(1) or True)
    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        rows = (json.dumps({"text": f"doc {k}-{i} " * (1 + i % 5)}) for i in range(200))
        (src / f"{k}.jsonl").write_text("\n".join(rows) + "\n")
    dst = tmp_path / "dst"
    one = ["--direct_num_workers=1"]
    assert main(["convert", str(src), str(dst), "--target-shard-size", "6KB", *one]) == 0
    shards = len(list((dst / "data").rglob("*.parquet")))
    assert shards >= 3
    assert len(trims) == (shards if large else 0)
