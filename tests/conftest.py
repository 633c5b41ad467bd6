from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _import_torchvision_anywhere() -> None:
    """What projects/models/torchvision_ops.py does for the projects' models, for models the tests build in their own
    process: torchvision (which transformers and timm import) imports even where its ops library does not load."""
    spec = importlib.util.spec_from_file_location(
        "shimgen_tests_torchvision_ops", REPO / "projects" / "models" / "torchvision_ops.py"
    )
    assert spec and spec.loader
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


_import_torchvision_anywhere()


# scripts/test.sh runs the suite on two workers with --dist loadgroup: each group of tests runs on one worker, with its
# module's fixtures, and the groups start slowest first (by their seconds in a measured `.ci/run`; test_matrix.py and
# the last two by the run with torch 2.14.1, where they build), so that no long group is left to start last. A test
# file is a group unless its tests are marked with groups of their own (the zoo's checks).
SLOWEST_FIRST = (
    "test_build.py",
    "test_custom_ops.py",
    "test_rebuild.py",
    "test_fallbacks.py",
    "test_server.py",
    "test_spec_errors.py",
    "test_matrix.py",
    "test_weights.py",
    "zoo-hf",
    "test_shared_cache.py",
    "test_variants.py",
    "test_concurrency.py",
    "zoo-vision",
    "test_state.py",
    "test_llm.py",
    "test_numerics.py",
    "test_outputs.py",
    "test_cpp_package.py",
    "test_reproducible.py",
    "test_dependencies.py",
    "test_compat.py",
    "zoo-aoti",
    "test_zoo.py",
    "test_codegen.py",
    "test_runtime.py",
    "test_units.py",
    "test_process.py",
    "test_runtime_cpp.py",
    "test_report.py",
    "test_fake_prop.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def group(item: pytest.Item) -> str:
        marker = item.get_closest_marker("xdist_group")
        return str(marker.args[0]) if marker else item.path.name

    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    rank = {name: k for k, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(group(item), len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", "no") == "loadgroup" and not _groups_reach_xdist():
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores the groups that pytest-xdist {importlib.metadata.version('pytest-xdist')}"
            " puts in node ids, so --dist loadgroup would schedule every test alone (each file's builds made on both "
            "workers): install the pytest that scripts/setup.sh pins"
        )
    if not hasattr(config, "workerinput") and (stale := _installed_file_unlike_checkout()):  # once, not per worker
        raise pytest.UsageError(
            f"the tests run the installed shimgen, whose {stale} differs from this checkout's: install the checkout "
            "(`bash scripts/setup.sh`, or pip install --no-build-isolation --no-deps . in the venv)"
        )


def _installed_file_unlike_checkout() -> str:
    """The first file (shimgen/...) in which the shimgen that the tests import differs from the checkout's; ''."""
    import shimgen

    installed, checkout = Path(shimgen.__file__).parent, REPO / "shimgen"
    if installed.resolve() == checkout.resolve():
        return ""

    def names(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    ours, theirs = names(checkout), names(installed)
    for name in sorted(ours | theirs):
        if name not in ours or name not in theirs or (checkout / name).read_bytes() != (installed / name).read_bytes():
            return f"shimgen/{name}"
    return ""


def _groups_reach_xdist() -> bool:
    """Whether a test's node id shows the group that pytest-xdist's workers append to `item._nodeid` for --dist loadgroup
    (its remote.py), which is all its scheduler reads; pytest 9.2 derives node ids from another attribute."""
    probe = types.SimpleNamespace(_nodeid="test@group", _id="test")
    try:
        return bool(pytest.Item.nodeid.fget(probe) == "test@group")  # type: ignore[attr-defined]
    except AttributeError:
        return False


# `shimgen build` runs in the user's build server, as a user's does; the servers a session starts stop soon after it.
os.environ.setdefault("SHIMGEN_SERVER_IDLE", "30")

# The installed console script when there is one (CI installs shimgen), else the source tree.
SCRIPT = Path(sys.executable).with_name("shimgen")
COMMAND = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "shimgen"]


def shimgen(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [*COMMAND, *map(str, args)],
        cwd=REPO if COMMAND[0] == sys.executable else None,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


# Specs whose tests check what a package computes and how it rebuilds, not how fast it runs: their copies build with
# ATen's GEMMs (no template to time and compile) and -O1 kernels, half the compile time. The workdir's mlp.toml keeps
# shimgen's defaults (its kernel choices and lockfile are tested); a test that copies it may use these flags too.
FAST_FLAGS = {"gemm_autotune": "false", "kernel_opt": '"O1"'}
FAST_SPECS = (
    "hf.toml",
    "shapes.toml",
    "outputs.toml",
    "zoo.toml",
    "multi.toml",
    "custom_ops.toml",
    "py_ops.toml",
    "aoti_shapes.toml",
)
# vision.toml keeps gemm_autotune, shimgen's default (its batched matmuls have too many rows to be timed).
O1_SPECS = ("vision.toml",)


def edited(text: str, old: str, new: str, count: int = -1) -> str:
    """`text` with `old` replaced by `new`: a test's edit of a spec or source, which fails where `old` is not there (an
    edit that silently changed nothing would test the unedited spec)."""
    assert old in text, f"{old!r} is not in the text to edit"
    return text.replace(old, new, count)


def with_flags(text: str, **flags: str) -> str:
    """A spec's text with these [flags] keys set (TOML values, as written)."""
    lines = text.splitlines()
    if "[flags]" not in lines:
        lines += ["", "[flags]"]
    start = lines.index("[flags]") + 1
    end = next((k for k in range(start, len(lines)) if lines[k].startswith("[")), len(lines))
    kept = [line for line in lines[start:end] if line.split("=")[0].strip() not in flags]
    return "\n".join(lines[:start] + [f"{key} = {value}" for key, value in flags.items()] + kept + lines[end:]) + "\n"


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of projects/ (specs and models) and kernels/ (custom ops' sources) with room for build/ and dist/ beside it."""
    root = tmp_path_factory.mktemp("shimgen")
    for directory in ("projects", "kernels"):
        shutil.copytree(REPO / directory, root / directory, ignore=shutil.ignore_patterns("__pycache__"))
    for name in FAST_SPECS + O1_SPECS:
        spec = root / "projects" / name
        spec.write_text(
            with_flags(
                spec.read_text(), **(FAST_FLAGS if name in FAST_SPECS else {"kernel_opt": FAST_FLAGS["kernel_opt"]})
            )
        )
    return root


def spec_of_its_own(workdir: Path, spec: Path, text: str) -> Path:
    """`text` written to `spec`, with the workdir's models importable beside it: a test's own spec, whose lockfile
    and edits stay in the test's directory."""
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(text)
    (spec.parent / "models").symlink_to(workdir / "projects" / "models")
    return spec


def cache_sharing_the_toolchain(root: Path) -> Path:
    """A per-user cache of its own under `root` (the value for $SHIMGEN_CACHE_DIR: a build server of its own, kernel
    choices of its own) whose proved toolchains, prebuilt headers and runtime libraries are the session's: for a test
    that checks something else than how those are built (about a minute of compiling each, on two cores)."""
    from shimgen import toolchain

    session = toolchain.cache_dir().parent
    own = root / "cache"
    own.mkdir(parents=True)
    for part in ("toolchain", "prebuilt", "runtime"):
        (session / part).mkdir(parents=True, exist_ok=True)
        (own / part).symlink_to(session / part)
    return own / "toolchain"


def build_json(spec: Path, out: Path) -> dict[str, Any]:
    result = shimgen("build", spec, "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def import_package(summary: dict[str, Any]) -> Any:
    """A built package, imported from its site directory (sys.path is left as it was)."""
    sys.path.insert(0, summary["package_dir"])
    try:
        return importlib.import_module(summary["name"])
    finally:
        sys.path.remove(summary["package_dir"])


@pytest.fixture(scope="session")
def built_mlp(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "mlp.toml", workdir)


@pytest.fixture(scope="session")
def built_multi(workdir: Path) -> dict[str, Any]:
    return build_json(workdir / "projects" / "multi.toml", workdir)


RSS_SCRIPT = """
import os, sys, torch
sys.path.insert(0, sys.argv[1])
forward = __import__(sys.argv[2]).forward
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
x = torch.randn(*map(int, sys.argv[3:]))
for _ in range(2000):
    forward(x)
before = rss()
for _ in range(10000):
    forward(x)
print(rss() - before)
"""


def rss_growth_over_10000_calls(summary: dict[str, Any], *shape: int) -> int:
    """Bytes of resident memory a built package's `forward` gains over 10,000 calls on one input, after 2,000."""
    run = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, summary["package_dir"], summary["name"], *map(str, shape)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return int(run.stdout)


CALL_SCRIPT = """
import sys, torch
sys.path.insert(0, sys.argv[1])
package = __import__(sys.argv[2])
case = torch.load(sys.argv[4])
try:
    out = getattr(package, sys.argv[3])(*case["args"], **case["kwargs"])
except (TypeError, ValueError) as exc:
    out = f"{type(exc).__name__}: {exc}"
torch.save(out, sys.argv[5])
"""


def call_in_subprocess(summary: dict[str, Any], graph: str, tmp: Path, *args: Any, **kwargs: Any) -> Any:
    """Call a built package's graph in a fresh interpreter (a rebuilt package is never a stale import)."""
    import torch

    case, result = tmp / f"{graph}-case.pt", tmp / f"{graph}-result.pt"
    torch.save({"args": args, "kwargs": kwargs}, case)
    run = subprocess.run(
        [sys.executable, "-c", CALL_SCRIPT, summary["package_dir"], summary["name"], graph, str(case), str(result)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return torch.load(result)
