"""Path templates from dataset metadata are checked before they are expanded
(``schemas/path_template.py``): only LeRobot's placeholders, at most a zero-padded width."""

from __future__ import annotations

import pytest

from shardfeed.schemas.errors import SchemaError
from shardfeed.schemas.path_template import MAX_WIDTH, check_template, expand

V30_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V21_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


@pytest.mark.parametrize("template", [V30_DATA, V30_VIDEO, V21_DATA, V21_VIDEO])
def test_lerobot_s_own_templates_pass(template):
    assert check_template(template, "data_path") == template


def test_expand_fills_a_checked_template():
    assert expand(V30_DATA, "data_path", chunk_index=1, file_index=27) == (
        "data/chunk-001/file-027.parquet"
    )
    assert expand("d/{chunk_index}/{file_index:d}", "data_path", chunk_index=3, file_index=4) == (
        "d/3/4"
    )


@pytest.mark.parametrize(
    "template, says",
    [
        ("data/{chunk_index:>999999999}.parquet", "zero-padded integer width"),
        ("data/{chunk_index:0999999999d}.parquet", "zero-padded integer width"),
        (f"data/{{chunk_index:0{MAX_WIDTH + 1}d}}.parquet", "zero-padded integer width"),
        ("data/{chunk_index:03x}.parquet", "zero-padded integer width"),
        ("data/{chunk_index:{file_index}}.parquet", "zero-padded integer width"),
        ("data/{chunk_index.__class__}.parquet", "is not one of"),
        ("data/{chunk_index[0]}.parquet", "is not one of"),
        ("data/{x[0]}.parquet", "is not one of"),
        ("data/{}.parquet", "is not one of"),
        ("data/{0}.parquet", "is not one of"),
        ("data/{home}.parquet", "is not one of"),
        ("data/{chunk_index!r}.parquet", "is refused"),
        ("videos/{video_key:>40}/x.mp4", "takes no format spec"),
        ("data/{chunk_index.parquet", "malformed"),
        ("data/chunk}.parquet", "malformed"),
        ("d/" + "x" * 2000 + "{chunk_index}", "characters"),
        ("/abs/{chunk_index}.parquet", "absolute"),
    ],
)
def test_hostile_templates_are_refused_before_any_expansion(template, says):
    with pytest.raises(SchemaError) as refused:
        expand(template, "data_path", chunk_index=1, file_index=2, video_key="cam")
    assert refused.value.field == "data_path"
    assert says in str(refused.value)


def test_a_template_missing_a_needed_placeholder_names_it():
    with pytest.raises(SchemaError, match=r"lacks \['\{file_index\}'\]"):
        check_template("data/{chunk_index}.parquet", "data_path", ("chunk_index", "file_index"))
