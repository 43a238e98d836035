"""Per-sample logic as plain functions (decode, validate, hash, sizes), plus thin Beam wrappers.

The conversion pipeline fills this layer; nothing here may import Beam at module level except the
``*_fn.py`` wrappers that ``shardfeed.pipelines`` loads.
"""
