"""``pipelines/beam_tuning.py``: Beam computes the same signatures and option views, less often."""

from __future__ import annotations

import functools
import gc
import inspect
import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("apache_beam")

from shardfeed.pipelines.beam_tuning import signature_once


def _sample(a, b=2, *rest, key=None):
    return a


class _Thing:
    def method(self, x, y=1):
        return x

    def __call__(self, z):
        return z


def test_a_remembered_signature_is_the_signature():
    reads: list[object] = []

    def read(func):
        reads.append(func)
        return inspect.signature(func)

    once = signature_once(read)
    thing, other = _Thing(), _Thing()
    for func in (
        _sample,
        thing.method,
        other.method,
        _Thing.method,
        len,
        thing,
        functools.partial(_sample, 1),
    ):
        assert once(func) == inspect.signature(func)
        assert once(func) == inspect.signature(func)
    # functions and bound methods are read once (both instances' methods share one entry);
    # the builtin, the callable object and the partial every time
    assert reads.count(_sample) == 1
    assert sum(1 for r in reads if getattr(r, "__func__", None) is _Thing.method) == 1
    assert reads.count(_Thing.method) == 1
    assert reads.count(len) == 2 and reads.count(thing) == 2


def test_a_remembered_signature_goes_with_its_function():
    once = signature_once(inspect.signature)

    def make():
        def short_lived(q):
            return q

        return short_lived

    func = make()
    once(func)
    table = once.__closure__  # the cache is held in the closure: find it by its entries
    tables = [c.cell_contents for c in table if hasattr(c.cell_contents, "keyrefs")]
    assert any(func in t for t in tables)
    del func
    gc.collect()
    assert all(len(t) == 0 for t in tables)


def _python(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_option_views_are_shared_and_see_the_same_values():
    found = _python(
        """
        import json, pickle
        from shardfeed.pipelines.beam_tuning import share_option_views, read_signatures_once
        assert share_option_views() and read_signatures_once()
        from apache_beam.options.pipeline_options import (
            DirectOptions, PipelineOptions, StandardOptions, TypeOptions)
        options = PipelineOptions(["--direct_num_workers=2", "--runner=DirectRunner"])
        direct = options.view_as(DirectOptions)
        again = options.view_as(DirectOptions)
        direct.direct_running_mode = "multi_threading"  # a view's change reaches every view
        other = PipelineOptions(["--direct_num_workers=3"])
        copy = pickle.loads(pickle.dumps(options))
        print(json.dumps({
            "same": direct is again,
            "workers": direct.direct_num_workers,
            "mode": options.view_as(DirectOptions).direct_running_mode,
            "runner": options.view_as(StandardOptions).runner,
            "type_check": options.view_as(TypeOptions).pipeline_type_check,
            "other": other.view_as(DirectOptions).direct_num_workers,
            "copy": copy.view_as(DirectOptions).direct_running_mode,
            "all": options.get_all_options()["direct_running_mode"],
        }))
        """
    )
    assert found == {
        "same": True,
        "workers": 2,
        "mode": "multi_threading",
        "runner": "DirectRunner",
        "type_check": True,
        "other": 3,
        "copy": "multi_threading",
        "all": "multi_threading",
    }


def test_a_tuned_beam_reads_each_dofn_signature_once_and_runs_the_same():
    """A pipeline of Maps and a stateful DoFn gives the same result tuned; the tuned build
    reads far fewer signatures (6,752 reads for a text conversion's 27 ParDos before)."""
    code = """
        import inspect, json, sys
        tuned = sys.argv[1] == "1"
        if tuned:
            from shardfeed.pipelines.beam_tuning import tune_local_beam
            tune_local_beam()
        import apache_beam as beam
        from apache_beam.transforms.userstate import CombiningValueStateSpec
        from apache_beam.testing.util import assert_that, equal_to
        reads = [0]
        original = inspect.signature
        def counting(*a, **k):
            reads[0] += 1
            return original(*a, **k)
        inspect.signature = counting

        class Count(beam.DoFn):
            STATE = CombiningValueStateSpec("n", sum)
            def process(self, item, state=beam.DoFn.StateParam(STATE)):
                state.add(1)
                yield item[0], state.read()

        with beam.Pipeline() as p:
            out = (p | beam.Create(range(20)) | beam.Map(lambda x: (x % 2, x))
                   | beam.ParDo(Count()) | beam.Filter(lambda kv: kv[1] == 10)
                   | beam.Map(lambda kv: kv[0]))
            assert_that(out, equal_to([0, 1]))
        print(json.dumps({"reads": reads[0]}))
    """
    plain = _python(code.replace('sys.argv[1] == "1"', "False"))
    tuned = _python(code.replace('sys.argv[1] == "1"', "True"))
    assert tuned["reads"] * 3 < plain["reads"], (tuned, plain)
