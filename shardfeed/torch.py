"""PyTorch adapter: a ``torch.utils.data.IterableDataset`` of whole batches over ``ShardLoader``.

Needs the ``[torch]`` extra. Use it with automatic batching off, one DataLoader per rank::

    ds = ShardIterableDataset("out/example", batch_size=256)   # rank/world from torch.distributed
    loader = DataLoader(ds, batch_size=None, num_workers=4)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for batch in loader:  # dict: column -> tensor, or object array of bytes / str
            ...

Each DataLoader worker process iterates its own :class:`~shardfeed.loader.ShardLoader`, made in
the worker with ``worker=info.id, num_workers=info.num_workers`` from
``torch.utils.data.get_worker_info()`` (worker 0 of 1 with ``num_workers=0``), so the workers of a
rank read disjoint parts of the rank's share and together read all of it, once. The rank and
world come from the arguments, else from ``torch.distributed`` when its process group is
initialised (with ``LOCAL_WORLD_SIZE``, as torchrun sets it, as GPUs per node), else rank 0 of 1.
A stored assignment (``assignment=NAME``) must have been made for as many workers per rank as the
DataLoader has.

Batch values:

- numeric and tensor columns: ``torch.from_numpy`` tensors, ``(N, *shape)``. In the main process
  (``num_workers=0``) an array that views Arrow's read-only buffers is copied first, so writing
  into the tensor is safe; in a worker the tensor wraps the view, and the DataLoader's transfer to
  the main process copies it into shared memory anyway;
- image and other binary columns: numpy object arrays of ``bytes`` (the encoded image as stored;
  None for a null), since the loader's zero-copy ``memoryview`` slices cannot be pickled to the
  main process. With ``decode_images=True`` images are uint8 tensors ``(N, H, W, C)`` when every
  image of the batch has the same shape, else object arrays of ``(H, W, C)`` numpy arrays;
- string columns: numpy object arrays of ``str``.

The DataLoader's default ``collate``/``convert`` with ``batch_size=None`` passes these through.

Order matters for elastic resume. With ``in_order=True`` (the default), the DataLoader delivers
the workers' batches round robin, worker 0 first, skipping workers that have finished: exactly
what :mod:`shardfeed.planning.resume` assumes when it works out, from the samples a rank has
consumed, which rows each worker has delivered. Keep ``in_order`` on, and count ``samples_seen``
as the samples the training loop has consumed across all ranks.

:meth:`ShardIterableDataset.set_epoch` reaches the workers also with ``persistent_workers=True``:
the epoch is held in a shared-memory tensor the worker processes read when an epoch starts.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

try:
    import torch
except ImportError as err:  # pragma: no cover - the main venv has no torch
    raise ImportError("shardfeed.torch needs PyTorch: pip install 'shardfeed[torch]'") from err
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from shardfeed.assignment import Assignment
from shardfeed.loader import ShardLoader
from shardfeed.loader.shard_loader import DEFAULT_IO_THREADS, Sources
from shardfeed.planning.assign import World

__all__ = ["ShardIterableDataset", "to_torch"]

# torch.from_numpy warns for a read-only array; a worker's batches are copied by the DataLoader
_READ_ONLY = "The given NumPy array is not writable"


class ShardIterableDataset(IterableDataset):
    """Batches (dicts of tensors and object arrays) of one rank's share of an epoch.

    ``dataset`` is what :class:`~shardfeed.loader.ShardLoader` takes: a path or URI, a
    :class:`~shardfeed.formats.reader.Dataset`, or a mixture of them with weights (pass paths
    when the DataLoader spawns its workers: an open ``Dataset`` does not pickle). ``rank`` and
    ``world`` (an ``int`` of single-GPU nodes, or a :class:`World`) go together; without them they
    come from ``torch.distributed`` (see the module docstring). The other arguments are
    ShardLoader's, ``batch_size`` in samples and ``epoch`` the first epoch iterated.
    """

    def __init__(
        self,
        dataset: Sources,
        *,
        batch_size: int,
        rank: int | None = None,
        world: World | int | None = None,
        epoch: int = 0,
        seed: int = 0,
        columns: Sequence[str] | None = None,
        assignment: Assignment | str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | str | None = None,
        prefetch: int = 4,
        decode_images: bool = False,
        io_threads: int = DEFAULT_IO_THREADS,
    ) -> None:
        super().__init__()
        if (rank is None) != (world is None):
            raise ValueError("rank and world go together (or neither, to ask torch.distributed)")
        if rank is None:
            rank, world = distributed_rank()
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.rank, self.world = rank, world
        self.dataset = dataset
        self.batch_size = batch_size
        self._options: dict[str, Any] = {
            "seed": seed,
            "columns": columns,
            "assignment": assignment,
            "cache_dir": cache_dir,
            "cache_bytes": cache_bytes,
            "prefetch": prefetch,
            "decode_images": decode_images,
            "io_threads": io_threads,
        }
        # shared memory: persistent DataLoader workers see set_epoch too
        self._epoch = torch.tensor(epoch, dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` from the next ``iter()`` on (call before each epoch's loop)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch.fill_(epoch)

    def loader(self, worker: int = 0, num_workers: int = 1) -> ShardLoader:
        """The ``ShardLoader`` of ``worker`` (of ``num_workers``) of this rank for the epoch."""
        return ShardLoader(
            self.dataset,
            rank=self.rank,
            world=self.world,
            worker=worker,
            num_workers=num_workers,
            epoch=self.epoch,
            batch_size=self.batch_size,
            **self._options,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        with self.loader(worker, num_workers) as loader:
            for batch in loader:
                yield to_torch(batch, copy=info is None)


def distributed_rank() -> tuple[int, World | int]:
    """``(rank, world)`` of this process: from an initialised ``torch.distributed`` process
    group (as ``World(nodes, LOCAL_WORLD_SIZE, 1)`` when that variable divides the world size,
    else that many single-GPU nodes), else ``(0, 1)``."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    rank, size = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if local > 1 and size % local == 0:
        return rank, World(size // local, local, 1)
    return rank, size


def to_torch(batch: dict[str, np.ndarray], *, copy: bool = True) -> dict[str, Any]:
    """A loader batch as the adapter yields it: numeric arrays as tensors (``copy``: copy a
    read-only array first), binary values as ``bytes``, strings unchanged."""
    out: dict[str, Any] = {}
    for name, values in batch.items():
        if values.dtype == object:
            out[name] = _as_bytes(values)
        elif values.flags.writeable or copy:
            out[name] = torch.from_numpy(values if values.flags.writeable else values.copy())
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_READ_ONLY, category=UserWarning)
                out[name] = torch.from_numpy(values)
    return out


def _as_bytes(values: np.ndarray) -> np.ndarray:
    """Object array with every ``memoryview`` replaced by ``bytes`` (str, None and decoded
    images stay as they are)."""
    if not any(isinstance(v, memoryview) for v in values):
        return values
    out = np.empty(len(values), dtype=object)
    out[:] = [bytes(v) if isinstance(v, memoryview) else v for v in values]
    return out
