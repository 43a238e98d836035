"""The schema step of a data-typed source, inside the conversion pipeline.

Every file's inference part (``.shardfeed-work/infer/``) meets in one GroupByKey; one call merges
them in file order, asks the source for the features and saves them as ``spec.json`` in the work
directory, where the scan and the shard writers load them (once per process). Running it in the
same pipeline as the scan saves a pipeline start: about 0.3 s in process, and about 4 s with two
``multi_processing`` workers, which a runner starts once per pipeline.

A schema the source refuses (no text field, a cost kind the features cannot give) is saved as
``spec-error.json`` instead and the step emits no file, so nothing is scanned; the driver raises
it as the run's one-line error.

A source whose inference rides on its scan (``InferringSource``: JSONL, TFRecord) saves a *guess*, from
each piece's head (``spec-guess.json``); the scan types with it and counts every piece's full part;
``confirm_spec`` then decides ``spec.json`` from those and says which pieces to scan again (all of
them, when the decision is not the guess).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Iterable
from typing import Any

from apache_beam.typehints.decorators import no_annotations

from shardfeed.formats.cost import resolve_cost_kind
from shardfeed.formats.sources import SourceReader
from shardfeed.formats.sources.base import InferringSource
from shardfeed.formats.store_path import StorePath
from shardfeed.formats.unit_table import work_part
from shardfeed.pipelines.worker_guard import guard_worker
from shardfeed.schemas.errors import ShardfeedError
from shardfeed.schemas.features import FeatureSpec

SPEC = "spec.json"
SPEC_ERROR = "spec-error.json"
#: the features guessed from a sample of every piece, which the fused scan types with
GUESS = "spec-guess.json"


#: one piece of a file as it travels between stages: (file, index, start, stop, first position)
PieceTuple = tuple[str, int, int, int, int]


def piece_name(file: str, index: int) -> str:
    """The name a piece's work parts are filed under (NUL never occurs in a path)."""
    return f"{file}\0{index}"


def part_name(name: str | PieceTuple) -> str:
    """A file's or a piece's work-part name."""
    return name if isinstance(name, str) else piece_name(name[0], name[1])


def infer_part_path(work: StorePath, name: str | PieceTuple, kind: str = "infer") -> StorePath:
    """Where a file's or a piece's inference part (``kind`` "guess": its sample's) is saved."""
    return work_part(work, kind, part_name(name), ".json")


def save_inferred(source: SourceReader, work: StorePath, name: str | PieceTuple) -> None:
    """Infer a file's (or a piece's) part of the schema and save it as JSON (never pickled),
    with the piece's span of positions."""
    if isinstance(name, str):
        inferred, span = source.infer(name), 0
    else:
        inferred, span = source.infer_piece(name[0], name[2], name[3])
    save_part(work, name, inferred, span)


def save_part(
    work: StorePath, name: str | PieceTuple, inferred: Any, span: int = 0, kind: str = "infer"
) -> None:
    """Save one inference part as JSON (never pickled); scratch, which a re-run redoes."""
    part = {"inferred": dataclasses.asdict(inferred), "span": span}
    infer_part_path(work, name, kind).write_bytes(json.dumps(part, sort_keys=True).encode())


def _read_part(work: StorePath, name: str | PieceTuple, kind: str = "infer") -> dict[str, Any]:
    return json.loads(infer_part_path(work, name, kind).read_bytes())


def merge_inferred(
    source: SourceReader,
    work: StorePath,
    names: Iterable[str | PieceTuple],
    kind: str = "infer",
) -> Any:
    """Merge the saved parts in order (the merge is associative and commutative)."""
    merged = None
    for name in names:
        part = source.inferred_type(**_read_part(work, name, kind)["inferred"])
        merged = part if merged is None else type(source).merge_inferred(merged, part)
    return merged


def number_pieces(
    pieces: Iterable[PieceTuple], spans: Iterable[int], first: int
) -> list[PieceTuple]:
    """Each piece with its first position: a file's first piece starts at ``first``, each later
    piece where the one before it ends (pieces sorted by file, then index)."""
    out: list[PieceTuple] = []
    position, previous = first, None
    for (file, index, start, stop, _), span in zip(pieces, spans, strict=True):
        if file != previous:
            position, previous = first, file
        out.append((file, index, start, stop, position))
        position += span
    return out


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def decide_spec(
    item: tuple[Any, Iterable[str | PieceTuple]], source: SourceReader, work: StorePath, cost: str
) -> Iterable[str | PieceTuple]:
    """(key, every inferred file or piece) -> the files, or the pieces with their first
    positions, to scan, once ``spec.json`` is saved; none when the source refuses the schema
    (``spec-error.json`` says why)."""
    guard_worker()
    started = time.time()
    names = sorted(item[1])
    spec = _decided(source, work, names, cost)
    if spec is None:
        return []
    state = {"features": spec.to_json(), "started": started, "finished": time.time()}
    (work / SPEC).write_bytes(json.dumps(state).encode())
    if names and not isinstance(names[0], str):  # pieces: their first positions
        spans = [_read_part(work, name)["span"] for name in names]
        return number_pieces(names, spans, source.first_position)
    return names


def _decided(
    source: SourceReader, work: StorePath, names: Iterable[str | PieceTuple], cost: str
) -> FeatureSpec | None:
    """The features the saved parts give, or None once ``spec-error.json`` says why the
    source (or the cost kind) refuses them."""
    try:
        spec = source.spec(merge_inferred(source, work, names))
        resolve_cost_kind(spec, cost)
    except ShardfeedError as err:
        (work / SPEC_ERROR).write_bytes(json.dumps({"error": str(err)}).encode())
        return None
    return spec


# --- the fused scan's guess (InferringSource) ---------------------------------------------------


def save_sample(source: InferringSource, work: StorePath, piece: PieceTuple) -> None:
    """Save a piece's sampled inference part, with its exact span of positions."""
    inferred, span = source.sample_piece(piece[0], piece[2], piece[3])
    save_part(work, piece, inferred, span, kind="guess")


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def decide_guess(
    item: tuple[Any, Iterable[PieceTuple]], source: SourceReader, work: StorePath, cost: str
) -> list[PieceTuple]:
    """(key, every sampled piece) -> the pieces with their first positions, once the features
    the samples give are saved as the guess (``features`` null when the samples give none the
    source accepts: the first scan then only counts)."""
    guard_worker()
    started = time.time()
    pieces = sorted(item[1])
    try:
        spec = source.spec(merge_inferred(source, work, pieces, kind="guess"))
        resolve_cost_kind(spec, cost)
        features = spec.to_json()
    except ShardfeedError:
        features = None
    state = {"features": features, "started": started, "finished": time.time()}
    (work / GUESS).write_bytes(json.dumps(state).encode())
    spans = [_read_part(work, piece, kind="guess")["span"] for piece in pieces]
    return number_pieces(pieces, spans, source.first_position)


@no_annotations  # a SourceReader is a Protocol, which Beam 2.78's type check cannot compare
def confirm_spec(
    item: tuple[Any, Iterable[PieceTuple]], source: SourceReader, work: StorePath, cost: str
) -> list[tuple[PieceTuple, bool]]:
    """(key, every scanned piece) -> each piece with whether to scan it again, once the features
    of the full counts are saved: again, every piece, when they are not the guess the scan
    typed with; none when the source refuses them (``spec-error.json`` says why)."""
    guard_worker()
    pieces = sorted(item[1])
    guess = json.loads((work / GUESS).read_bytes())
    spec = _decided(source, work, pieces, cost)
    if spec is None:
        return []
    features = json.loads(json.dumps(spec.to_json()))  # as the guess was saved
    again = features != guess["features"]
    finished = time.time() if again else guess["finished"]
    state = {"features": features, "started": guess["started"], "finished": finished}
    (work / SPEC).write_bytes(json.dumps(state).encode())
    return [(piece, again) for piece in pieces]


def load_guess(work: StorePath) -> FeatureSpec | None:
    """The guessed features (None: the samples gave none), parsed once per process."""
    return _load_features(work / GUESS, "the guessed features")


def load_spec(work: StorePath) -> FeatureSpec:
    """The saved features, parsed once per process and work dir."""
    spec = _load_features(work / SPEC, "the features")
    if spec is None:
        raise ShardfeedError(f"{work / SPEC}: no features saved")
    return spec


def _load_features(path: StorePath, what: str) -> FeatureSpec | None:
    stamp = path.stamp()
    if stamp is None:
        raise FileNotFoundError(f"{path}: the schema step has not saved {what}")
    return _load_spec(path, stamp)


@functools.lru_cache(maxsize=4)
def _load_spec(path: StorePath, stamp: int) -> FeatureSpec | None:
    features = json.loads(path.read_bytes())["features"]
    return None if features is None else FeatureSpec.from_json(features)


def spec_outcome(work: StorePath) -> tuple[FeatureSpec, float, float]:
    """After the pipeline: the features and when the step started and finished; raises the
    saved refusal, or an error when the step never ran."""
    try:
        error = json.loads((work / SPEC_ERROR).read_bytes())
    except FileNotFoundError:
        pass
    else:
        raise ShardfeedError(error["error"])
    try:
        state = json.loads((work / SPEC).read_bytes())
    except FileNotFoundError:
        raise ShardfeedError(
            "the runner finished without deciding the schema; nothing was published"
        ) from None
    return FeatureSpec.from_json(state["features"]), state["started"], state["finished"]
