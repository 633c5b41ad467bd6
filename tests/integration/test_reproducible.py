"""Reproducible builds: one spec built twice at once, into different output directories by different users (their own
HOME, so their own shimgen and Inductor caches), gives byte-identical wheels with sorted members, SOURCE_DATE_EPOCH's
timestamps, and no path of the build machine inside. One user starts from an empty per-user cache, in a HOME whose path
holds a quote, a space and non-ASCII text (its prebuilt pieces and runtime library are built there); the other links
the session's, built by another HOME at other paths. Both use the session's compiler cache, as users of one machine
can: it answers only a compile whose source, headers and command line are the same, so a path of either user that
reaches an object file is compiled afresh and shows in the comparison. Kernel choices by timing are the lockfile's
concern, so the spec's GEMMs are not autotuned here."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from conftest import COMMAND, REPO, cache_sharing_the_toolchain, spec_of_its_own, with_flags

pytestmark = pytest.mark.slow

# What would share a cache between the two builds, or give them the same HOME.
_PER_USER = (
    "HOME",
    "XDG_CACHE_HOME",
    "SHIMGEN_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "CCACHE_DIR",
    "SCCACHE_DIR",
)


def _spec_without_autotuning(workdir: Path, tmp_path: Path) -> Path:
    text = with_flags((workdir / "projects" / "mlp.toml").read_text(), gemm_autotune="false")
    return spec_of_its_own(workdir, tmp_path / "spec" / "mlp.toml", text)


def _session_ccache() -> str | None:
    """The compiler cache this session's builds use, where ccache is installed."""
    ccache = shutil.which("ccache")
    if ccache is None:
        return None
    found = subprocess.run([ccache, "--get-config", "cache_dir"], capture_output=True, text=True)
    return found.stdout.strip() or None


def _build_as(user: Path, inductor: Path, spec: Path, out: Path, *, session_pieces: bool) -> subprocess.Popen[str]:
    """A build by `user` (a HOME), with an Inductor cache of its own at `inductor`."""
    user.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in _PER_USER}
    env.update(HOME=str(user), TORCHINDUCTOR_CACHE_DIR=str(inductor))
    if ccache_dir := _session_ccache():
        env["CCACHE_DIR"] = ccache_dir
    if session_pieces:
        env["SHIMGEN_CACHE_DIR"] = str(cache_sharing_the_toolchain(user))
    return subprocess.Popen(
        [*COMMAND, "build", str(spec), "--out", str(out)],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(procs: list[subprocess.Popen[str]]) -> None:
    try:
        # communicate, not wait: a build whose output fills the pipe would otherwise never end.
        outputs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:  # a build still running after a timeout is stopped, its ninja and compilers with it
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err


def _members(wheel: Path) -> dict[str, tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(wheel) as zf:
        return {info.filename: (info, zf.read(info)) for info in zf.infolist()}


def _differences(a: Path, b: Path) -> list[str]:
    """What tells two wheels apart, member by member."""
    ma, mb = _members(a), _members(b)
    found = [] if list(ma) == list(mb) else [f"member order: {list(ma)} vs {list(mb)}"]
    for name in sorted(set(ma) | set(mb)):
        if name not in ma or name not in mb:
            found.append(f"{name}: only in {'the first' if name in ma else 'the second'}")
            continue
        (ia, da), (ib, db) = ma[name], mb[name]
        if da != db:
            first = next((i for i, (x, y) in enumerate(zip(da, db, strict=False)) if x != y), min(len(da), len(db)))
            found.append(f"{name}: contents differ from byte {first} ({len(da)} vs {len(db)} bytes)")
        entries = [(i.date_time, oct(i.external_attr >> 16), i.compress_type) for i in (ia, ib)]
        if entries[0] != entries[1]:
            found.append(f"{name}: zip entry (time, mode, compression) {entries[0]} vs {entries[1]}")
    return found


def test_same_wheel_from_any_output_directory_and_user(workdir: Path, tmp_path: Path) -> None:
    spec = _spec_without_autotuning(workdir, tmp_path)
    outs = [tmp_path / "a", tmp_path / "elsewhere" / "deeper" / "b"]
    users = [tmp_path / "users" / "ann's ü home", tmp_path / "users" / "bob"]
    # Inductor's caches at plain paths: Inductor runs its compiler through a command line it does not quote.
    inductor = [tmp_path / "inductor" / name for name in ("ann", "bob")]
    _finish(
        [
            _build_as(user, cache, spec, out, session_pieces=user.name == "bob")
            for user, cache, out in zip(users, inductor, outs, strict=True)
        ]
    )
    assert list((users[0] / ".cache" / "shimgen" / "prebuilt").glob("*/build")), "the first user made no pieces"
    wheels = [next((out / "dist").glob("*.whl")) for out in outs]
    assert wheels[0].name == wheels[1].name

    digests = [hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels]
    assert digests[0] == digests[1], "the wheels differ:\n" + "\n".join(_differences(*wheels))

    members = _members(wheels[0])
    names = list(members)
    dist_info = [n for n in names if n.split("/")[0].endswith(".dist-info")]
    assert names == sorted(set(names) - set(dist_info)) + sorted(set(dist_info) - {dist_info[-1]}) + [dist_info[-1]]
    assert names[-1].endswith(".dist-info/RECORD") and not any(n.endswith(".pyc") for n in names)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or 315532800)
    assert {info.date_time for info, _ in members.values()} == {time.gmtime(max(epoch, 315532800))[:6]}
    import torch

    from shimgen import toolchain

    # The session's per-user cache too: the second user links its pieces, and the compiler cache may give the first
    # user the objects compiled there.
    session = toolchain.cache_dir().parent
    build_paths = [str(tmp_path), str(REPO), str(Path(torch.__file__).parent), str(session)]
    leaks = [f"{name}: {path}" for name, (_, data) in members.items() for path in build_paths if path.encode() in data]
    assert not leaks, leaks

    # The C++ package's archive too: the same bytes from either build (it names the torch it was built against, the
    # same here, in lib<name>.so's RUNPATH and its CMake and pkg-config files, and no path of either build).
    archives = [next((out / "dist").glob("*-cpp.tar.gz")) for out in outs]
    assert archives[0].read_bytes() == archives[1].read_bytes()
    assert not any(str(out).encode() in archives[0].read_bytes() for out in outs)
