"""On-disk formats, with no Beam: the dataset layout, its writer and fast reader."""
