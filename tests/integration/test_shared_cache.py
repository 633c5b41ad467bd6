"""The build cache shared across machines, on a real Redis server (redis-server, started here on localhost) and in
a directory; and the lockfile that makes kernel choices, and so wheels, the same on every machine."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FAST_FLAGS, REPO, import_package, shimgen, with_flags

from shimgen.cache import shared_cache
from shimgen.commands import report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (scripts/system_packages.sh installs it where it can)")
    port = _free_port()
    directory = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail(f"redis-server did not start on port {port}")
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize("kind", ["redis", "directory"])
def test_backends_keep_any_bytes(kind: str, redis_url: str, tmp_path: Path) -> None:
    backend = shared_cache.backend(redis_url if kind == "redis" else str(tmp_path / "cache"))
    data = bytes(range(256)) * 1000 + b"\r\n$-1\r\n"
    assert backend.get("absent") is None
    backend.put("k\r\n y", data)
    assert backend.get("k\r\n y") == data


def test_an_unreachable_server_turns_the_cache_off_not_the_build() -> None:
    cache = shared_cache.SharedCache(shared_cache.backend(f"redis://127.0.0.1:{_free_port()}"))
    assert cache.get("trace", "k") is None
    assert cache.error and "127.0.0.1" in cache.error
    cache.put("trace", "k", b"x")  # ignored, no exception
    assert cache.stored == []


def test_bad_cache_urls_are_refused(tmp_path: Path) -> None:
    for url in ("http://example.com/cache", "redis://host:6379/notanumber"):
        refused = shimgen("build", REPO / "projects" / "mlp.toml", "--cache", url, "--out", tmp_path)
        assert refused.returncode == 2 and f"--cache {url}:" in refused.stderr, refused.stderr


def _copy_projects(root: Path) -> Path:
    """projects/ without its lockfiles, in `root`: its mlp.toml at example batch 8, where the Linear layers' candidates
    are timed (kernel_choice.untimed_kernel)."""
    shutil.copytree(REPO / "projects", root / "projects", ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
    spec = root / "projects" / "mlp.toml"
    text = spec.read_text()
    assert "example = 4" in text
    spec.write_text(text.replace("example = 4", "example = 8"))
    return spec


def _build(spec: Path, out: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    built = shimgen("build", spec, "--out", out, "--json", *args, env=env)
    assert built.returncode == 0, built.stderr
    return json.loads(built.stdout)


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


ONLY = ("--only", "cp*-cpu-native")


@pytest.fixture(scope="module")
def first_machine(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A checkout that built one identifier of mlp.toml, filling the shared cache: its spec and build summary."""
    root = tmp_path_factory.mktemp("one")
    spec = _copy_projects(root)
    return spec, _build(spec, root, *ONLY, "--cache", redis_url)


@pytest.mark.slow
def test_a_second_machine_builds_from_the_shared_cache(
    first_machine: tuple[Path, dict[str, Any]], redis_url: str, tmp_path: Path
) -> None:
    """The first machine built one identifier and filled the cache; a second one (empty HOME: no per-user caches,
    another checkout and output directory) finds trace, code, wheel and C++ package there, compiles nothing, proves no
    compiler, and gets a byte-identical wheel that imports and computes what the first one's does."""
    import torch

    first = first_machine[1]
    assert first["wheel"].endswith(
        f"+torch{torch.__version__.split('+')[0]}.cpu.native-" + Path(first["wheel"]).name.split("-", 2)[2]
    )
    assert {"trace", "codegen", "wheel", "cpp"} <= set(first["shared_cache"]["stored"])
    spec = _copy_projects(tmp_path / "two" / "deeper")
    home = tmp_path / "home"
    home.mkdir()
    second = _build(
        spec,
        tmp_path / "two" / "out",
        *ONLY,
        env={"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), shared_cache.ENV: redis_url},
    )
    assert second["shared_cache"]["found"] == ["trace", "codegen", "wheel", "cpp"]
    assert not {"trace", "codegen", "toolchain", "prebuilt", "compile"} & set(second["stages"])
    assert not (home / ".cache" / "shimgen").exists()
    assert _sha256(second["wheel"]) == _sha256(first["wheel"])
    # The C++ package came with it: the same archive, unpacked and loaded before the build reported it.
    assert _sha256(second["cpp_archive"]) == _sha256(first["cpp_archive"])
    assert Path(second["cpp_prefix"], "lib", "libmlp.so").is_file()
    x = torch.randn(3, 32)
    assert torch.equal(import_package(second).forward(x), _call_first(first, x, tmp_path))


def _call_first(summary: dict[str, Any], x: Any, tmp: Path) -> Any:
    import torch

    torch.save(x, tmp / "x.pt")
    code = (
        f"import sys, torch; sys.path.insert(0, {summary['package_dir']!r}); import {summary['name']} as m; "
        f"torch.save(m.forward(torch.load({str(tmp / 'x.pt')!r})), {str(tmp / 'y.pt')!r})"
    )
    subprocess.run([os.sys.executable, "-c", code], check=True)
    return torch.load(tmp / "y.pt")


@pytest.mark.slow
def test_the_lockfile_replays_kernel_choices_and_retune_measures_again(
    first_machine: tuple[Path, dict[str, Any]],
) -> None:
    """The first build wrote <spec>.lock; a build with the lockfile edited so that the slower candidate wins takes
    the edited timings without measuring (the pick follows the file); a set of another kind of machine (other
    candidates) beside it changes neither the pick nor the file; --retune measures and replaces this machine's set
    only."""
    spec, first = first_machine
    out = spec.parent.parent
    lock = spec.with_name(spec.name + ".lock")
    [choice] = first["kernel_choices"]["forward_cpu"]
    data = json.loads(lock.read_text())
    [(section, unit)] = data["units"].items()
    [own] = unit["machines"]
    assert section.startswith("forward_cpu torch") and own["choices"][0]["picked"] == choice["picked"]
    reported = report.collect(spec, out, ONLY[1])
    assert reported["lockfile"] == str(lock) and reported["units"]["forward_cpu"]["kernel_choices"] == own["choices"]
    loser = next(name for name in choice["us"] if name != choice["picked"])
    for precisions in own["timings"][choice["op"]].values():
        for timings in precisions.values():
            for candidate in timings:
                if loser.split()[-1].rstrip("0123456789_") in candidate:
                    timings[candidate] = 1e-6  # ms: now the fastest
    lock.write_text(json.dumps(data))
    replayed = _build(spec, out, *ONLY)
    assert replayed["kernel_choices"]["forward_cpu"][0]["picked"] == loser
    assert replayed["kernel_choices"]["forward_cpu"][0]["us"][loser] == 0.001
    assert "codegen" in replayed["stages"]  # the lockfile changed, so the code is generated again
    again = _build(spec, out, *ONLY)
    assert "codegen:forward_cpu" in again["skipped"]  # and a build with the lockfile it wrote is up to date

    other = json.loads(json.dumps(own).replace('": 1e-06', '": 5.0'))
    for precisions in other["timings"][choice["op"]].values():
        for by_precision in precisions.values():
            for candidate in list(by_precision):
                by_precision[candidate + "-another-vector-width"] = by_precision.pop(candidate)
    data = json.loads(lock.read_text())
    data["units"][section]["machines"].insert(0, other)
    lock.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    with_other = lock.read_text()
    beside = _build(spec, out, *ONLY)
    assert beside["kernel_choices"]["forward_cpu"][0]["picked"] == loser and lock.read_text() == with_other

    retuned = _build(spec, out, *ONLY, "--retune")
    assert retuned["kernel_choices"]["forward_cpu"][0]["us"][loser] != 0.001
    machines = json.loads(lock.read_text())["units"][section]["machines"]
    assert len(machines) == 2 and other in machines
    assert retuned["kernel_choices"]["forward_cpu"] in [m["choices"] for m in machines]


def test_two_builds_in_one_process_each_use_their_own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build leaves its process as it found it: the second build of a process gets the cache it names, not the first
    one's ccache storage, and the environment, sys.path and loggers are as before."""
    import logging
    import sys

    from shimgen.pipeline import build

    spec = _copy_projects(tmp_path)
    spec.write_text(with_flags(spec.read_text(), **FAST_FLAGS))
    for name in ("first", "second"):
        monkeypatch.setenv(
            "CCACHE_DIR", str(tmp_path / f"ccache-{name}")
        )  # misses: the objects go to the remote storage
        environ, path = dict(os.environ), list(sys.path)
        levels = {n: lg.level for n, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
        cache = tmp_path / f"cache-{name}"
        built = build(spec, tmp_path / f"out-{name}", cache_url=cache.as_uri())
        assert built.shared_cache is not None and built.shared_cache["url"] == cache.as_uri()
        assert "wheel" in built.shared_cache["stored"] and any(cache.rglob("*")), built.shared_cache
        if built.compiler_cache and Path(built.compiler_cache).name == "ccache":
            assert any(p.is_file() for p in (cache / "ccache").rglob("*")), (
                f"ccache stored nothing in {cache / 'ccache'}"
            )
        assert dict(os.environ) == environ and sys.path == path
        assert {n: logging.getLogger(n).level for n in levels} == levels
