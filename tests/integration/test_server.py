"""The build server (shimgen/commands/server.py): `shimgen build` and `shimgen check` hand their work to a per-user process that has torch
imported, and the result is the same as a build in the command's own process: an edited model is seen, errors read
the same, a killed server costs nothing but its speed, and an idle one stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import COMMAND, FAST_FLAGS, cache_sharing_the_toolchain, call_in_subprocess, edited, with_flags

from shimgen.spec import load_spec
from shimgen.trace.entry import load_model, make_inputs

pytestmark = pytest.mark.slow


def served_build(
    spec: Path, out: Path, env: dict[str, str], *extra: str, cwd: Path | None = None, command: str = "build"
) -> tuple[int, dict | None, str]:
    """(exit status, --json summary or report (None where it failed), stderr) of the real CLI's build or check, the
    server on."""
    run = subprocess.run(
        [*COMMAND, command, str(spec), "--out", str(out), "--json", *extra],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "SHIMGEN_SERVER": "on"},
        cwd=cwd,
    )
    return run.returncode, json.loads(run.stdout) if run.returncode == 0 else None, run.stderr


@pytest.fixture
def project(workdir: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of mlp.toml and its model under tmp_path, and an environment with a server directory of its own."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mlp.py").write_text((workdir / "projects" / "models" / "mlp.py").read_text())
    spec = tmp_path / "mlp.toml"
    spec.write_text(
        edited(
            with_flags((workdir / "projects" / "mlp.toml").read_text(), **FAST_FLAGS), 'name = "mlp"', 'name = "served"'
        )
    )
    return spec, {"SHIMGEN_CACHE_DIR": str(cache_sharing_the_toolchain(tmp_path)), "SHIMGEN_SERVER_IDLE": "60"}


def stop(*summaries: dict | None) -> None:
    for summary in summaries:
        if summary and summary.get("build_server"):
            try:
                os.kill(summary["build_server"], signal.SIGTERM)
            except ProcessLookupError:
                pass


def eager(spec: Path, x: torch.Tensor) -> torch.Tensor:
    model = load_model(load_spec(spec).graph[0], "graph[0]", spec.parent)
    with torch.no_grad():
        return model(x)


def test_builds_run_in_the_server_and_see_edits(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    spec, env = project
    first = None
    try:
        code, first, err = served_build(spec, tmp_path / "out", env)
        assert code == 0, err
        server = first["build_server"]
        assert server is not None and server != os.getpid(), "the first build starts a server and runs in it"
        x = make_inputs(load_spec(spec).graph[0], {"batch": 3}, seed=2)[0]
        torch.testing.assert_close(call_in_subprocess(first, "forward", tmp_path, x), eager(spec, x))

        model = tmp_path / "models" / "mlp.py"
        model.write_text(edited(model.read_text(), "nn.ReLU()", "nn.GELU()"))  # imported afresh by each build
        code, second, err = served_build(spec, tmp_path / "out", env)
        assert code == 0, err
        assert second["build_server"] == server
        torch.testing.assert_close(call_in_subprocess(second, "forward", tmp_path, x), eager(spec, x))
        # `shimgen check` (a build, then the package against eager) runs in the server too.
        code, report, err = served_build(spec, tmp_path / "out", env, command="check")
        assert code == 0 and report is not None, err
        assert report["ok"] and report["comparisons"] and report["build_server"] == server

        spec.write_text(with_flags(spec.read_text(), no_such_flag="1"))
        code, _, err = served_build(spec, tmp_path / "out", env)
        assert code == 2 and "no_such_flag" in err and "Traceback" not in err
        code, _, err = served_build(spec, tmp_path / "out", env, "--no-such-option")
        assert code == 2 and "unrecognized arguments: --no-such-option" in err and "Traceback" not in err, err
    finally:
        stop(first)


MARKED = """import sys
with open({marker!r}, "a") as seen:
    seen.write(f"{{'docutils' in sys.modules}}\\n")
import docutils  # a library from site-packages, which the server imports ahead after a trace imported it
"""


def test_a_library_the_trace_imported_is_imported_ahead_until_it_changes(
    project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    import docutils

    spec, env = project
    model, marker = tmp_path / "models" / "mlp.py", tmp_path / "seen"
    source = MARKED.format(marker=str(marker)) + model.read_text()

    def build_seeing(activation: str) -> tuple[int, set[str]]:
        """(the build's server, whether each import of the model found docutils imported)."""
        marker.unlink(missing_ok=True)
        model.write_text(source.replace("nn.ReLU()", activation))  # an edit: the model is traced again
        code, built, err = served_build(spec, tmp_path / "out", env)
        assert code == 0 and built is not None, err
        summaries.append(built)
        return built["build_server"], set(marker.read_text().split())

    summaries: list[dict] = []
    library = Path(docutils.__file__)
    mtime = library.stat().st_mtime_ns
    try:
        server, seen = build_seeing("nn.ReLU()")
        assert seen == {"False"}, "a fresh server has not imported it"
        assert build_seeing("nn.GELU()") == (server, {"True"}), "imported ahead after the first build"
        os.utime(library, ns=(mtime, mtime + 1_000_000))  # as a `pip install` of another version would
        again, seen = build_seeing("nn.SiLU()")
        assert again != server and seen == {"False"}, "the server stepped down; a new one imported nothing ahead"
        x = make_inputs(load_spec(spec).graph[0], {"batch": 3}, seed=2)[0]
        torch.testing.assert_close(call_in_subprocess(summaries[-1], "forward", tmp_path, x), eager(spec, x))
    finally:
        os.utime(library, ns=(mtime, mtime))
        stop(*summaries)


def test_a_killed_server_costs_only_speed(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    spec, env = project
    first = again = None
    try:
        code, first, err = served_build(spec, tmp_path / "out", env)
        assert code == 0, err
        os.kill(first["build_server"], signal.SIGKILL)
        time.sleep(0.5)
        code, again, err = served_build(spec, tmp_path / "out", env, "--force")
        assert code == 0, err
        assert again["build_server"] not in (None, first["build_server"]), "a new server is started"
    finally:
        stop(first, again)


@pytest.mark.skipif(
    COMMAND[0] == sys.executable, reason="needs shimgen installed: `python -m shimgen` imports the directory's shimgen"
)
def test_an_idle_server_stops(project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """... and runs the shimgen that started it, whatever the directory the build runs in holds."""
    spec, env = project
    env = {**env, "SHIMGEN_SERVER_IDLE": "2"}
    elsewhere = tmp_path / "elsewhere" / "shimgen"
    elsewhere.mkdir(parents=True)
    (elsewhere / "__init__.py").write_text("raise ImportError('a shimgen directory where the build runs')\n")
    code, built, err = served_build(spec, tmp_path / "out", env, cwd=elsewhere.parent)
    assert code == 0, err
    assert built["build_server"] not in (None, os.getpid()), "the build ran in a server"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(built["build_server"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the server outlived its idle time")
