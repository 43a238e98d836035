"""Packaging: the layer folders install as ``shardfeed.<layer>`` and never as top-level packages.

Also checks that a user's own ``formats/`` or ``transforms.py`` cannot shadow ours, and that the
core (reader, CLI) never imports Beam.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("schemas", "formats", "transforms", "pipelines")
# what a regular (non-editable) build needs from the work tree
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "shardfeed", *LAYERS)


def _can_build_without_isolation() -> bool:
    """pyproject asks for setuptools>=69; bdist_wheel lives in setuptools>=70.1 or in ``wheel``."""
    try:
        from importlib.metadata import version

        major, minor = (int(p) for p in version("setuptools").split(".")[:2])
    except Exception:
        return False
    return major >= 69 and (
        (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None
    )


def _run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build a wheel from a copy of the sources (so the work tree gets no build/ or egg-info)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        elif path.exists():
            shutil.copy2(path, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist")]
    if _can_build_without_isolation():
        cmd.append("--no-build-isolation")
    result = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert result.returncode == 0, f"pip wheel failed:\n{result.stdout}\n{result.stderr}"
    wheels = sorted((tmp / "dist").glob("shardfeed-*.whl"))
    assert len(wheels) == 1, f"expected one shardfeed wheel, got {wheels}"
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_wheel_maps_layers_under_shardfeed(wheel_names: list[str]) -> None:
    names = set(wheel_names)
    for required in (
        "shardfeed/__init__.py",
        "shardfeed/cli/main.py",
        "shardfeed/planning/__init__.py",
        "shardfeed/formats/reader.py",
        "shardfeed/formats/dataset_writer.py",
        "shardfeed/schemas/manifest.py",
        "shardfeed/pipelines/__init__.py",
        "shardfeed/transforms/__init__.py",
    ):
        assert required in names, f"{required} missing from the wheel"


def _wheel_path(source: Path) -> str:
    """Where a source file lands in the wheel: layer folders map to ``shardfeed/<layer>/``."""
    rel = source.relative_to(REPO)
    folder = rel.parts[0]
    return rel.as_posix() if folder == "shardfeed" else f"shardfeed/{rel.as_posix()}"


def test_wheel_ships_every_module(wheel_names: list[str]) -> None:
    """Every .py file under a layer folder or shardfeed/ lands in the wheel, subpackages included."""
    names = set(wheel_names)
    sources = [
        p for folder in ("shardfeed", *LAYERS) for p in sorted((REPO / folder).rglob("*.py"))
    ]
    assert len(sources) > 20
    missing = [str(p.relative_to(REPO)) for p in sources if _wheel_path(p) not in names]
    assert not missing, f"not in the wheel (list their packages in pyproject.toml): {missing}"


def test_wheel_ships_jsonschema_files(wheel_names: list[str]) -> None:
    shipped = {n for n in wheel_names if n.startswith("shardfeed/schemas/jsonschema/")}
    expected = {
        f"shardfeed/schemas/jsonschema/{p.name}"
        for p in (REPO / "schemas" / "jsonschema").glob("*.json")
    }
    assert shipped == expected


def test_wheel_has_no_top_level_layer_packages(wheel_names: list[str]) -> None:
    top_level = {n.split("/", 1)[0] for n in wheel_names if "/" in n}
    assert not top_level & set(LAYERS), f"top-level layer packages in the wheel: {top_level}"
    assert top_level <= {"shardfeed"} | {n for n in top_level if n.endswith(".dist-info")}


def test_wheel_declares_console_script(wheel: Path, wheel_names: list[str]) -> None:
    entry_points = [n for n in wheel_names if n.endswith(".dist-info/entry_points.txt")]
    assert len(entry_points) == 1, "no entry_points.txt in the wheel"
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(entry_points[0]).decode()
    lines = [line.replace(" ", "") for line in text.splitlines()]
    assert "[console_scripts]" in lines
    assert "shardfeed=shardfeed.cli.main:entry" in lines


def test_layers_are_not_importable_top_level(tmp_path: Path) -> None:
    """The installed package exposes the layers only as ``shardfeed.<layer>``."""
    result = _run_python(
        f"""
        import importlib.util
        for name in {LAYERS!r}:
            spec = importlib.util.find_spec(name)
            print(name, spec.origin if spec else None)
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == [f"{name} None" for name in LAYERS]


def test_user_modules_do_not_shadow_ours(tmp_path: Path) -> None:
    """A user's cwd holding ``transforms.py`` and a ``formats/`` package must not win."""
    (tmp_path / "transforms.py").write_text("raise RuntimeError('user transforms.py imported')\n")
    (tmp_path / "formats").mkdir()
    (tmp_path / "formats" / "__init__.py").write_text("USER = True\n")
    (tmp_path / "formats" / "reader.py").write_text(
        "raise RuntimeError('user formats/reader.py imported')\n"
    )
    (tmp_path / "schemas.py").write_text("raise RuntimeError('user schemas.py imported')\n")
    result = _run_python(
        """
        import json  # `python -c` puts the cwd first on sys.path, like a user's script dir
        import shardfeed.formats.reader, shardfeed.transforms, shardfeed.schemas.manifest
        import formats  # the user's own package still imports as itself
        print(json.dumps({
            "reader": shardfeed.formats.reader.__file__,
            "transforms": shardfeed.transforms.__file__,
            "manifest": shardfeed.schemas.manifest.__file__,
            "user_formats": formats.__file__,
        }))
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    files = {k: Path(v).resolve() for k, v in json.loads(result.stdout).items()}
    for key in ("reader", "transforms", "manifest"):
        assert tmp_path.resolve() not in files[key].parents, f"{key} came from the user's cwd"
    assert files["reader"].name == "reader.py"
    assert files["reader"].parent.name == "formats"
    assert (files["reader"].parent / "dataset_writer.py").exists()
    assert files["transforms"].parent.name == "transforms"
    assert files["user_formats"] == (tmp_path / "formats" / "__init__.py").resolve()


def test_core_imports_do_not_load_beam(tmp_path: Path) -> None:
    result = _run_python(
        """
        import sys
        import shardfeed
        import shardfeed.formats.reader, shardfeed.formats.dataset_writer, shardfeed.cli.main
        import shardfeed.schemas.manifest, shardfeed.planning, shardfeed.transforms
        shardfeed.cli.main.build_parser()
        beam = sorted(m for m in sys.modules if m == "apache_beam" or m.startswith("apache_beam."))
        print("BEAM:" + ",".join(beam))
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "BEAM:", f"core imports loaded Beam: {result.stdout}"


# A training container has no Beam. Block the import (as if it were absent) so this runs even in
# the test venv, which has the [beam] extra for the pipeline tests.
_NO_BEAM = "import sys\nsys.modules['apache_beam'] = None\n"


def test_pipelines_without_beam_names_the_extra(tmp_path: Path) -> None:
    result = _run_python(
        _NO_BEAM
        + """
try:
    import shardfeed.pipelines
except ImportError as err:
    print("IMPORTERROR:" + str(err))
else:
    print("IMPORTED")
""",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("IMPORTERROR:"), result.stdout
    assert "shardfeed[beam]" in result.stdout


def test_convert_without_beam_says_what_to_install(tmp_path: Path) -> None:
    result = _run_python(
        _NO_BEAM
        + """
from shardfeed.cli.main import main
raise SystemExit(main(["convert", "src", "dst"]))
""",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "pip install 'shardfeed[beam]'" in result.stderr
    assert "Traceback" not in result.stderr
