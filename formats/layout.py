"""LeRobot v3.0 path templates: where shard number ``i`` and the metadata files live."""

from __future__ import annotations

from shardfeed.formats.atomic import TMP_MARKER
from shardfeed.schemas.info import DEFAULT_CHUNKS_SIZE, DEFAULT_DATA_PATH

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
SHARDFEED_META_DIR = "meta/shardfeed"
#: Directories whose every file must be listed in the manifest (``verify`` flags any other file).
LISTED_DIRS = ("data", "videos")
#: Everything a dataset writer owns; ``--overwrite`` clears these (manifest first).
DATASET_DIRS = ("data", "videos", "meta")
#: The writer lease of a dataset directory (formats/writer_lease.py): not dataset content.
LEASE_NAME = ".shardfeed-lease"


def is_lease_file(name: str) -> bool:
    """DST's writer lease, or the temporary of an attempt to take it (formats/writer_lease.py):
    neither is dataset content, so neither makes DST "hold files"."""
    return name == LEASE_NAME or name.startswith(f".{LEASE_NAME}{TMP_MARKER}")


def chunk_file_index(number: int, chunks_size: int = DEFAULT_CHUNKS_SIZE) -> tuple[int, int]:
    """File number ``number`` (0-based, in order) lives in chunk ``number // chunks_size``."""
    if number < 0:
        raise ValueError(f"file number must be >= 0, got {number}")
    return divmod(number, chunks_size)


def data_path(
    number: int, chunks_size: int = DEFAULT_CHUNKS_SIZE, template: str = DEFAULT_DATA_PATH
) -> str:
    chunk, file = chunk_file_index(number, chunks_size)
    return template.format(chunk_index=chunk, file_index=file)


def episodes_path(number: int, chunks_size: int = DEFAULT_CHUNKS_SIZE) -> str:
    chunk, file = chunk_file_index(number, chunks_size)
    return EPISODES_PATH.format(chunk_index=chunk, file_index=file)
