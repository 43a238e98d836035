"""Beam's per-run costs that a local shardfeed run does not need to pay, taken out.

A conversion's graph is small and fixed, its bundles few and long; Beam's in-process runner was
built for many small bundles and graphs built once. Three of its costs showed in every local run
(a one-thread text conversion of 5-6 s, BENCHMARKS.md):

- Each bundle's end waits for its state sampler thread to wake, up to 200 ms once the bundle has
  run about 2 s: 0.30 s over 11 bundles. Sampled every 10 ms: 0.05 s.
- Beam reads the signature of every method of every DoFn (``inspect.signature``), again when the
  graph is translated and when each bundle's steps are made: 6,752 calls for 27 ParDos, about
  0.18 s. A function's signature never changes, so each is read once.
- ``PipelineOptions.view_as`` builds an argument parser and parses the flags on every call: 160
  calls, about 0.15 s. Views of one options object share its values, so one view per class does.

Each change is made only when Beam's code is as expected (else that change is skipped); the
results are the same (same signatures, views over the same values), only computed less often.
Applied by a lean import (``beam_import.import_beam``): a conversion on the local runner (the
``shardfeed`` command, or ``main()`` called by another program) and its ``multi_processing`` workers.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

#: How often a local run's state sampler wakes (Beam's default: 200 ms)
SAMPLING_PERIOD_MS = 10


def tune_local_beam() -> None:
    """Apply every change below (each once per process)."""
    shorten_state_sampling()
    read_signatures_once()
    share_option_views()


def shorten_state_sampling(period_ms: int = SAMPLING_PERIOD_MS) -> bool:
    """Make Beam's state samplers wake every ``period_ms``; True when done. Only a sampler that
    takes its period as its one default argument, Beam's default, is changed."""
    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    if init.__defaults__ == (statesampler.DEFAULT_SAMPLING_PERIOD_MS,):
        init.__defaults__ = (period_ms,)
    return init.__defaults__ == (period_ms,)


def read_signatures_once() -> bool:
    """Beam's ``get_signature`` (in ``typehints.decorators`` and the copy ``transforms.core``
    calls) remembers the signature of each Python function and method; True when in place."""
    from apache_beam.transforms import core
    from apache_beam.typehints import decorators

    current = decorators.get_signature
    if getattr(current, "_shardfeed_once", False):
        return True
    if core.get_signature is not current:
        return False  # Beam's layout changed: leave it alone
    once = signature_once(current)
    decorators.get_signature = core.get_signature = once
    return True


def signature_once(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``read`` (a function -> its signature), remembered for plain functions and for methods
    bound to plain functions (a bound method's signature depends only on its function); other
    callables (builtins, partials, classes, callable objects) are read every time. Entries go
    with their functions (weak keys)."""
    plain: weakref.WeakKeyDictionary[types.FunctionType, Any] = weakref.WeakKeyDictionary()
    bound: weakref.WeakKeyDictionary[types.FunctionType, Any] = weakref.WeakKeyDictionary()

    def get_signature(func: Any) -> Any:
        kind = type(func)
        if kind is types.FunctionType:
            table, key = plain, func
        elif kind is types.MethodType and type(func.__func__) is types.FunctionType:
            table, key = bound, func.__func__
        else:
            return read(func)
        found = table.get(key)
        if found is None:
            found = table[key] = read(func)
        return found

    get_signature._shardfeed_once = True  # type: ignore[attr-defined]
    get_signature.__doc__ = read.__doc__
    return get_signature


def share_option_views() -> bool:
    """``PipelineOptions.view_as(cls)`` returns the one view of that class it made first for
    each options object; True when in place."""
    from apache_beam.options.pipeline_options import PipelineOptions

    current = PipelineOptions.view_as
    if getattr(current, "_shardfeed_once", False):
        return True
    views: weakref.WeakKeyDictionary[Any, dict[type, Any]] = weakref.WeakKeyDictionary()

    def view_as(self: Any, cls: type) -> Any:
        try:
            made = views.setdefault(self, {})
        except TypeError:  # an options class made unhashable or without weak references
            return current(self, cls)
        view = made.get(cls)
        if view is None:
            view = made[cls] = current(self, cls)
        return view

    view_as._shardfeed_once = True  # type: ignore[attr-defined]
    view_as.__doc__ = current.__doc__
    PipelineOptions.view_as = view_as  # type: ignore[method-assign]
    return True
