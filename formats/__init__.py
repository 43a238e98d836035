"""On-disk formats, with no Beam: the dataset layout, its writer, the fast reader and the verifier."""

from shardfeed.formats.dataset_writer import DatasetWriter, write_dataset
from shardfeed.formats.errors import CorruptShardError, IncompleteDatasetError
from shardfeed.formats.reader import Dataset, open_dataset
from shardfeed.formats.verify import VerifyReport, verify_dataset

__all__ = [
    "CorruptShardError",
    "Dataset",
    "DatasetWriter",
    "IncompleteDatasetError",
    "VerifyReport",
    "open_dataset",
    "verify_dataset",
    "write_dataset",
]
