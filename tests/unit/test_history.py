"""The build's history of earlier code (shimgen/cache/history.py): what an undone edit gets back."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from shimgen.cache import history
from shimgen.cache.history import History
from shimgen.results import CodegenResult


def generated(root: Path, structure_key: str, source: str) -> CodegenResult:
    """A unit's code as codegen leaves it under `root`: its sources, its constants and its weights file."""
    root.mkdir(parents=True, exist_ok=True)
    files = {name: root / name for name in ("interface.cpp", "model.cpp", "kernels_0.cpp", "weights.o", "c.json")}
    for name, path in files.items():
        path.write_text(f"{name} of {source}")
    (root / "weights.safetensors").write_bytes(b"\0" * 1024)
    return CodegenResult(
        key=f"{structure_key}+values",
        structure_key=structure_key,
        interface=files["interface.cpp"],
        model=files["model.cpp"],
        kernels=(files["kernels_0.cpp"],),
        weights=files["weights.o"],
        ptx=(),
        triton=(),
        defines=("CPU_CAPABILITY_AVX512",),
        inductor_args=("-ffast-math",),
        out_nodes=(),
        num_outputs=1,
        constants=files["c.json"],
        weights_file=root / "weights.safetensors",
        checked=True,
    )


def test_undone_code_comes_back_without_its_weights(tmp_path: Path) -> None:
    kept = History(tmp_path / "history")
    root = tmp_path / "codegen" / "forward_cpu"
    before = generated(root, "structure-a", "before the edit")
    kept.keep("forward_cpu", before, root)
    generated(root, "structure-b", "after the edit")
    (root / "kernels_1.cpp").write_text("a second kernel file of the edit")

    found = kept.find("forward_cpu", "structure-a", root)
    assert found == before
    kept.restore("forward_cpu", "structure-a", root)
    assert (root / "kernels_0.cpp").read_text() == "kernels_0.cpp of before the edit"
    assert (root / "model.cpp").read_text() == "model.cpp of before the edit"
    assert not (root / "kernels_1.cpp").exists() and not (root / "weights.safetensors").exists()
    assert kept.find("forward_cpu", "structure-b", root) is None
    assert kept.find("other_cpu", "structure-a", root) is None


def test_code_found_where_the_build_directory_moved(tmp_path: Path) -> None:
    kept = History(tmp_path / "history")
    root = tmp_path / "codegen" / "forward_cpu"
    kept.keep("forward_cpu", generated(root, "structure-a", "the first build"), root)
    moved = tmp_path / "elsewhere" / "forward_cpu"
    found = kept.find("forward_cpu", "structure-a", moved)
    assert (
        found is not None and found.model == moved / "model.cpp" and found.weights_file == moved / "weights.safetensors"
    )


def test_each_unit_keeps_its_last_used_codes(tmp_path: Path) -> None:
    kept = History(tmp_path / "history")
    root = tmp_path / "codegen" / "forward_cpu"
    structures = [f"structure-{i}" for i in range(history.KEEP + 1)]
    kept.keep("forward_cpu", generated(root, structures[0], "build 0"), root)
    kept.keep("forward_cpu", generated(root, structures[1], "build 1"), root)
    kept.restore("forward_cpu", structures[0], root)  # used again: build 1's is now the least recently used
    for i, structure in enumerate(structures[2:], start=2):
        kept.keep("forward_cpu", generated(root, structure, f"build {i}"), root)
    found = [s for s in structures if kept.find("forward_cpu", s, root) is not None]
    assert found == [structures[0], *structures[2:]]


def test_code_without_a_structure_key_or_too_large_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = History(tmp_path / "history")
    root = tmp_path / "codegen" / "forward_cpu"
    kept.keep("forward_cpu", replace(generated(root, "structure-a", "a rewrite"), structure_key=""), root)
    monkeypatch.setattr(history, "MAX_UNIT_BYTES", 64)
    kept.keep("forward_cpu", generated(root, "structure-b", "embedded weights"), root)
    assert not list((tmp_path / "history").rglob("*.zip"))


def test_a_unit_keeps_no_more_bytes_than_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = History(tmp_path / "history")
    root = tmp_path / "codegen" / "forward_cpu"
    kept.keep("forward_cpu", generated(root, "structure-a", "the first build"), root)
    (entry,) = (tmp_path / "history").rglob("*.zip")
    monkeypatch.setattr(history, "MAX_UNIT_BYTES", entry.stat().st_size * 2 + 100)
    for structure in ("structure-b", "structure-c"):
        kept.keep("forward_cpu", generated(root, structure, "a later build"), root)
    found = [s for s in ("structure-a", "structure-b", "structure-c") if kept.find("forward_cpu", s, root)]
    assert found == ["structure-b", "structure-c"]


def test_a_damaged_entry_is_no_code(tmp_path: Path) -> None:
    kept = History(tmp_path / "history")
    root = tmp_path / "codegen" / "forward_cpu"
    kept.keep("forward_cpu", generated(root, "structure-a", "a build"), root)
    (entry,) = (tmp_path / "history").rglob("*.zip")
    entry.write_bytes(entry.read_bytes()[:100])
    assert kept.find("forward_cpu", "structure-a", root) is None


def test_units_that_left_the_spec_lose_their_code(tmp_path: Path) -> None:
    kept = History(tmp_path / "history")
    for unit in ("forward_cpu", "renamed_cpu"):
        root = tmp_path / "codegen" / unit
        kept.keep(unit, generated(root, "structure-a", unit), root)
    kept.forget_all_but({"forward_cpu", "forward_cpu__batch1"})
    root = tmp_path / "codegen"
    assert kept.find("forward_cpu", "structure-a", root / "forward_cpu") is not None
    assert kept.find("renamed_cpu", "structure-a", root / "renamed_cpu") is None
