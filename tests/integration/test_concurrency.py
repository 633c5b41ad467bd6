"""Several `shimgen build` runs at once on one machine, starting from an empty per-user cache: the
same project into the same output directory twice, and another project beside them. Each ends
correct (one waits for the other, saying so), no failure is cached, and building again works."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import COMMAND, FAST_FLAGS, REPO, call_in_subprocess, edited, shimgen, spec_of_its_own, with_flags

from shimgen import toolchain
from shimgen.spec import load_spec
from shimgen.toolchain import probe
from shimgen.trace.entry import load_model, make_inputs

pytestmark = pytest.mark.slow


def _eager(spec: Path, sizes: dict[str, int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    graph = load_spec(spec).graph[0]
    inputs = make_inputs(graph, sizes, seed=3)
    with torch.no_grad():
        return inputs, load_model(graph, "graph[0]", spec.parent)(*inputs)


def test_builds_at_once_on_an_empty_cache(workdir: Path, tmp_path: Path) -> None:
    env = {"SHIMGEN_CACHE_DIR": str(tmp_path / "cache" / "toolchain")}
    mlp = workdir / "projects" / "mlp.toml"
    geometry = spec_of_its_own(
        workdir,
        tmp_path / "geometry.toml",
        with_flags(
            edited((REPO / "projects" / "multi.toml").read_text(), 'name = "multi"', 'name = "geometry"'), **FAST_FLAGS
        ),
    )
    jobs = [(mlp, tmp_path / "a"), (mlp, tmp_path / "a"), (geometry, tmp_path / "b")]
    procs = [
        subprocess.Popen(
            [*COMMAND, "build", str(spec), "--out", str(out), "--json"],
            cwd=REPO,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for spec, out in jobs
    ]
    try:
        # communicate, not wait: a build whose output fills the pipe would otherwise never end.
        outputs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:  # a build still running after a timeout is stopped, its ninja and compilers with it
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
    for code, _, err in results:
        assert code == 0, err
        assert "Traceback" not in err
    summaries = [json.loads(out) for _, out, _ in results]
    # The two builds of one project into one directory took turns: one waited and then found it done.
    waited = [err for _, _, err in results[:2] if "[lock] waiting for " in err]
    assert len(waited) == 1, [err for _, _, err in results[:2]]
    assert summaries[0]["wheel"] == summaries[1]["wheel"]

    verdicts = list((tmp_path / "cache" / "toolchain").glob("*/verdict.json"))
    assert verdicts and all(json.loads(v.read_text())["ok"] for v in verdicts)
    # The runtime library (made by the first build's warm-up) and the prebuilt pieces compile behind the compiler cache
    # on PATH, as projects do: a per-user cache made again (for another shimgen, or here) compiles the same sources.
    launcher = toolchain.compiler_cache()
    made = [*(tmp_path / "cache").glob("runtime/*/build"), *(tmp_path / "cache").glob("prebuilt/*/build")]
    # The runtime library, the wrapper's pieces (the two projects differ only in kernel_opt), a kernels' header for each.
    assert len(made) == 4, made
    commands = [c["command"] for d in made for c in json.loads((d / "compile_commands.json").read_text())]
    assert commands and all(c.startswith(f"{launcher} ") == bool(launcher) for c in commands), commands

    again = [shimgen("build", spec, "--out", out, "--json", env=env) for spec, out in jobs]
    for result in again:
        assert result.returncode == 0, result.stderr
        assert "package" in json.loads(result.stdout)["skipped"]

    inputs, want = _eager(mlp, {"batch": 5})
    torch.testing.assert_close(
        call_in_subprocess(summaries[0], "forward", tmp_path, *inputs), want, rtol=1e-5, atol=1e-5
    )
    a, b = make_inputs(load_spec(geometry).graph[1], {"n": 4, "m": 3}, seed=3)
    distance = load_model(load_spec(geometry).graph[1], "graph[1]", geometry.parent)
    torch.testing.assert_close(
        call_in_subprocess(summaries[2], "distance", tmp_path, a, b), distance(a, b), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "meson_body,cached", [("kill -KILL $$", False), ("echo 'meson: broken install' >&2; exit 1", True)]
)
def test_only_lasting_probe_failures_are_cached(tmp_path: Path, meson_body: str, cached: bool) -> None:
    """A probe step killed from outside may pass next time, so its failure is not remembered."""
    meson = tmp_path / "meson"
    meson.write_text(f"#!/bin/sh\n{meson_body}\n")
    meson.chmod(0o755)
    tc = dataclasses.replace(toolchain.detect(), meson=str(meson))
    verdict = probe.prove(tc, tmp_path / "cache")
    assert not verdict.ok
    assert (tmp_path / "cache" / probe.probe_key(tc) / "verdict.json").is_file() == cached
