"""What a build server imports ahead for its builds (shimgen/build/libraries.py): the site-packages modules a trace
imported, in order, the files they came from, and the environment variables read while importing them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from shimgen.build import libraries


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A site-packages directory of the test's own, on sys.path, with a package `fakelib` in it; and a project
    directory beside it, with a module `fakeproject`."""
    site_dir, project = tmp_path / "site-packages", tmp_path / "project"
    (site_dir / "fakelib").mkdir(parents=True)
    (site_dir / "fakelib" / "__init__.py").write_text("import os\nOPTION = os.environ.get('FAKELIB_OPTION')\n")
    (site_dir / "fakelib" / "part.py").write_text("from fakelib import OPTION\n")
    (site_dir / "broken.py").write_text("raise ImportError('not here')\n")
    (site_dir / "fakelib" / "lazy.py").write_text("import torch._lazy.metrics\n")  # torch's: the server's own
    project.mkdir()
    (project / "fakeproject.py").write_text("import fakelib.part\nimport fakelib.lazy\n")
    torch_dir = os.path.dirname(os.path.dirname(torch.__file__))
    monkeypatch.setattr(libraries, "site_dirs", lambda: (os.path.join(str(site_dir), ""), os.path.join(torch_dir, "")))
    monkeypatch.syspath_prepend(str(site_dir))
    monkeypatch.syspath_prepend(str(project))
    yield site_dir
    for name in ("fakelib", "fakelib.part", "fakelib.lazy", "fakeproject", "broken"):
        sys.modules.pop(name, None)


def test_a_trace_notes_the_site_packages_modules_it_imported_in_order(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    noted = tmp_path / "server.imports"
    monkeypatch.setenv(libraries.IMPORTS_ENV, str(noted))
    before = set(sys.modules)
    assert "torch._lazy.metrics" not in before
    import fakeproject  # noqa: F401

    libraries.note(before)
    libraries.note(before)  # a second trace of the same
    expected = [
        ("fakelib", str(site / "fakelib" / "__init__.py")),
        ("fakelib.part", str(site / "fakelib" / "part.py")),
        ("fakelib.lazy", str(site / "fakelib" / "lazy.py")),
    ]
    assert "torch._lazy.metrics" in sys.modules, "imported in site-packages, but torch's"
    assert libraries.take_noted(noted) == expected, "neither the project's module nor torch's is noted; each once"
    assert libraries.take_noted(noted) == []


def test_nothing_is_noted_outside_a_server(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(libraries.IMPORTS_ENV, raising=False)
    before = set(sys.modules)
    import fakeproject  # noqa: F401

    libraries.note(before)  # no file to write: nothing happens
    assert [name for name, _ in libraries.imported_since(before)] == ["fakelib", "fakelib.part", "fakelib.lazy"]


def test_importing_ahead_imports_what_was_noted_and_keeps_its_files(site: Path) -> None:
    noted = [
        ("fakelib.part", str(site / "fakelib" / "part.py")),
        ("broken", str(site / "broken.py")),
        ("fakelib", str(site / "fakelib" / "elsewhere.py")),  # already imported by then: skipped
    ]
    failed, files = libraries.import_ahead(noted, refused=set())
    assert "fakelib.part" in sys.modules and failed == ["broken"]
    assert set(files) == {str(site / "fakelib" / "__init__.py"), str(site / "fakelib" / "part.py")}
    assert libraries.changed(files) is None
    part = site / "fakelib" / "part.py"
    os.utime(part, ns=(files[str(part)], files[str(part)] + 1_000_000))
    assert libraries.changed(files) == str(part)
    part.unlink()
    assert libraries.changed(files) == str(part)


def test_a_module_is_not_imported_where_its_name_finds_another_file_or_its_package_is_refused(site: Path) -> None:
    failed, files = libraries.import_ahead([("fakelib", str(site / "other" / "__init__.py"))], refused=set())
    assert "fakelib" not in sys.modules and failed == [] and files == {}
    failed, files = libraries.import_ahead([("fakelib", str(site / "fakelib" / "__init__.py"))], refused={"fakelib"})
    assert "fakelib" not in sys.modules and files == {}


def test_the_variables_read_while_importing_are_known(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKELIB_OPTION", "a")
    with libraries.reading_env() as read:
        libraries.import_ahead([("fakelib", str(site / "fakelib" / "__init__.py"))], refused=set())
        os.environ["WRITTEN_IN_THE_BLOCK"] = "1"  # writes reach the real environment
    monkeypatch.delenv("WRITTEN_IN_THE_BLOCK")
    assert "FAKELIB_OPTION" in read and type(os.environ) is not libraries._RecordingEnviron
    values = {name: os.environ.get(name) for name in read}
    assert libraries.env_differs(values, dict(os.environ)) is None
    assert libraries.env_differs(values, {**os.environ, "FAKELIB_OPTION": "b"}) == "FAKELIB_OPTION"
    assert libraries.env_differs(values, {**os.environ, "UNREAD": "1"}) is None

    with libraries.reading_env() as read:
        dict(os.environ)  # a library that copies the whole environment depends on all of it
    assert libraries.ALL in read
    everything: dict[str, str | None] = {libraries.ALL: None, **os.environ}
    assert libraries.env_differs(everything, {**os.environ, "PWD": "/elsewhere"}) is None
    assert libraries.env_differs(everything, {**os.environ, "UNREAD": "1"}) == "UNREAD"


def test_a_server_serves_only_environments_that_agree_with_what_its_imports_read(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shimgen.commands.server import _ImportedAhead

    (site / "fakelib" / "__init__.py").write_text(
        "import os\nOPTION = os.environ.get('FAKELIB_OPTION')\nos.environ.setdefault('FAKELIB_SET', 'by fakelib')\n"
    )
    monkeypatch.delenv("FAKELIB_OPTION", raising=False)
    monkeypatch.delenv("FAKELIB_SET", raising=False)
    ahead = _ImportedAhead(tmp_path / "key")
    (tmp_path / "key.imports").write_text(f"fakelib\t{site / 'fakelib' / '__init__.py'}\n")
    assert ahead.noted()
    try:
        assert ahead.import_noted() is None, "safe to fork: no thread, no CUDA"
        assert "fakelib" in sys.modules and not ahead.noted()
        client = {k: v for k, v in os.environ.items() if k != "FAKELIB_SET"}
        assert ahead.unusable_for(client) is None, "the variable the import set is not one the client must have"
        assert ahead.child_env()["FAKELIB_SET"] == "by fakelib", "a child gets it as a fresh import would set it"
        assert "FAKELIB_OPTION" in (ahead.unusable_for({**client, "FAKELIB_OPTION": "1"}) or "")
    finally:
        os.environ.pop("FAKELIB_SET", None)


def test_a_library_that_starts_a_thread_on_import_is_refused_from_then_on(site: Path, tmp_path: Path) -> None:
    """A server with a thread of a library's cannot fork its builds safely: it steps down, and the next server does not
    import that library ahead."""
    from shimgen.commands.server import _ImportedAhead

    (site / "fakelib" / "__init__.py").write_text(
        "import threading\nSTOP = threading.Event()\nthreading.Thread(target=STOP.wait, daemon=True).start()\n"
    )
    noted = f"fakelib\t{site / 'fakelib' / '__init__.py'}\n"
    (tmp_path / "key.imports").write_text(noted)
    try:
        why = _ImportedAhead(tmp_path / "key").import_noted()
        assert why is not None and why.startswith("importing libraries ahead started a thread that a fork keeps")
    finally:
        sys.modules["fakelib"].STOP.set()
    assert (tmp_path / "key.unsafe-imports").read_text().split() == ["fakelib"]
    del sys.modules["fakelib"]
    (tmp_path / "key.imports").write_text(noted)
    assert _ImportedAhead(tmp_path / "key").import_noted() is None
    assert "fakelib" not in sys.modules, "refused"


def test_a_library_whose_threads_stop_at_a_fork_is_imported_ahead(site: Path, tmp_path: Path) -> None:
    """A pool that a library stops when the process forks and starts again when used, as OpenBLAS does (scipy and
    OpenCV start it on import), leaves the server safe to fork its builds."""
    from shimgen.commands.server import _ImportedAhead

    (site / "fakelib" / "__init__.py").write_text(
        "import os, threading\n"
        "STOP = threading.Event()\n"
        "POOL = threading.Thread(target=STOP.wait, daemon=True)\n"
        "POOL.start()\n"
        "os.register_at_fork(before=lambda: (STOP.set(), POOL.join()))\n"
    )
    (tmp_path / "key.imports").write_text(f"fakelib\t{site / 'fakelib' / '__init__.py'}\n")
    assert _ImportedAhead(tmp_path / "key").import_noted() is None
    assert "fakelib" in sys.modules and not sys.modules["fakelib"].POOL.is_alive()
    assert not (tmp_path / "key.unsafe-imports").exists()
