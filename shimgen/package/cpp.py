"""Package stage, C++ side: the C++ package (lib<name>.so with its header, CMake package and pkg-config file, each
graph's model libraries and weights) installed under the build's cpp/ prefix and packed as
dist/<name>-<version>-<target>-cpp.tar.gz.

Meson installs what only the C++ package has (install tag 'cpp'); what it shares with the Python package (variant
libraries, custom-op libraries, weights files) is copied from the verified Python package, as its manifest names it.
The prefix and the archive are replaced only once lib<name>.so has loaded the package in a fresh process.

The archive is reproducible: members sorted, SOURCE_DATE_EPOCH's time, owner root, modes 0755 or 0644, and a gzip
header with neither time nor file name. Weights are stored in it, not deflated, as in the wheel.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import tarfile
import tempfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from shimgen.build import meson
from shimgen.build.process import run
from shimgen.errors import BuildError
from shimgen.files import replace_dir
from shimgen.package.wheel import worth_deflating
from shimgen.project.render import BUILD_MANIFEST, weights_env
from shimgen.results import CppPackageResult
from shimgen.toolchain import Toolchain

# Loads the package with lib<name>.so alone (it finds torch by its RUNPATH): no torch imported, no Python face.
_CHECK = (
    "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL); "
    "check = lib.shimgen_check_package; check.restype = ctypes.c_char_p; error = check(sys.argv[2].encode()); "
    "sys.exit(error.decode() if error else 0)"
)


def archive_name(name: str, version: str, target: str) -> str:
    return f"{name}-{version}-{target}-cpp"


class Staged:
    """The C++ package staged beside `prefix` and checked, with its archive written beside `final`; `commit` moves both
    into place, `discard` removes them. Staged while the Python package is checked (wheel.build_and_unpack's
    `beside`), committed only once both checks passed."""

    def __init__(self, dist: Path, prefix: Path, name: str, archive: str, key: str):
        self.dist, self.prefix, self.name, self.archive, self.key = dist, prefix, name, archive, key
        self.staging = prefix.with_name(prefix.name + ".new")
        self.tarball = dist / f".{archive}.tar.gz.new"
        self.final = dist / f"{archive}.tar.gz"

    def prepare(self, build_dir: Path, tree: Path, weights_file: Path | None, tc: Toolchain) -> None:
        """Staged from the project compiled in `build_dir` and `tree`, the Python package's files (the shared ones are
        copied from it), and checked with `weights_file`, an "external" package's weights."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".shimgen-cpp-", dir=self.prefix.parent) as tmp:
            meson.install_tagged(build_dir, "cpp", Path(tmp), tc).replace(self.staging)
        private = self.staging / "lib" / self.name
        for shared in shared_files(json.loads((tree / self.name / BUILD_MANIFEST).read_text())):
            (private / shared).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / self.name / shared, private / shared)
        self.dist.mkdir(parents=True, exist_ok=True)
        # Packed while the check runs in its own process: both only read the staged tree.
        with ThreadPoolExecutor(max_workers=1) as pool:
            packed = pool.submit(
                lambda: self.tarball.write_bytes(pack(self.staging, self.archive, meson.source_date_epoch()))
            )
            _check(self.staging, self.tarball, self.name, tc, weights_file, packed)

    def unpack(self, data: bytes, tc: Toolchain) -> None:
        """Staged from its archive's bytes (the shared cache's), and checked."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".shimgen-cpp-", dir=self.prefix.parent) as tmp:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                if hasattr(tarfile, "data_filter"):  # no links out, no devices (Python 3.10.12+, 3.11.4+)
                    tar.extractall(tmp, filter="data")
                else:
                    tar.extractall(tmp)
            (Path(tmp) / self.archive).replace(self.staging)
        self.dist.mkdir(parents=True, exist_ok=True)
        self.tarball.write_bytes(data)
        _check(self.staging, self.tarball, self.name, tc)

    def commit(self) -> CppPackageResult:
        self.tarball.replace(self.final)
        replace_dir(self.staging, self.prefix)
        return CppPackageResult(key=self.key, prefix=self.prefix, archive=self.final)

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.tarball.unlink(missing_ok=True)


def shared_files(manifest: dict[str, object]) -> list[str]:
    """The files of the Python package the C++ package holds too, relative to the package directory."""
    units = manifest["units"]
    assert isinstance(units, list)
    files = [u["weights_file"] for u in units if u.get("weights_file")]
    files += [v["library"] for u in units for v in u.get("variants", ())]
    libraries = manifest.get("op_libraries", [])
    assert isinstance(libraries, list)
    return files + [f"ops/{lib['file']}" for lib in libraries]


def pack(root: Path, top: str, epoch: int) -> bytes:
    """A .tar.gz of `root`'s tree under the directory `top`, the same bytes for the same files: its files that deflate
    would hardly shrink (weights) stored as they are, the rest deflated (level 1)."""
    raw = io.BytesIO()
    stored: list[tuple[int, int]] = []  # spans of the tar kept as they are
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in [root, *sorted(root.rglob("*"))]:
            info = tarfile.TarInfo(top if path == root else f"{top}/{path.relative_to(root).as_posix()}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "root", "root"
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                data = path.read_bytes()
                info.size, info.mode = len(data), 0o755 if path.suffix == ".so" else 0o644
                start = raw.tell()
                tar.addfile(info, io.BytesIO(data))
                if not worth_deflating(path.name, data):
                    stored.append((start, raw.tell()))
    return gzip_of(raw.getbuffer(), stored)


def gzip_of(data: memoryview, stored: list[tuple[int, int]]) -> bytes:
    """One gzip member of `data`, no name and no time, its `stored` spans (in order) kept as deflate's stored blocks
    and the rest deflated at level 1. A deflate stream may end a block at a byte boundary and go on with a fresh
    compressor's blocks (as pigz joins its pieces): ResNet-18's 91 MB of weights deflate by 6% in 3.7 s, and are
    stored in 0.3 s."""
    pieces: list[tuple[memoryview, int]] = []
    at = 0
    for start, end in stored:
        pieces += [(data[at:start], 1), (data[start:end], 0)]
        at = end
    pieces.append((data[at:], 1))
    out = [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"]  # magic, deflate, no flags, time 0, no extra flags, OS unknown
    for k, (piece, level) in enumerate(pieces):
        deflate = zlib.compressobj(level, zlib.DEFLATED, -15)
        out.append(deflate.compress(piece))
        out.append(deflate.flush(zlib.Z_FINISH if k == len(pieces) - 1 else zlib.Z_SYNC_FLUSH))
    out.append(struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF))
    return b"".join(out)


def _check(
    staging: Path,
    tarball: Path,
    name: str,
    tc: Toolchain,
    weights_file: Path | None = None,
    packed: Future[int] | None = None,
) -> None:
    """The staged package loaded by lib<name>.so in a fresh process; where that fails, or `packed` (the archive still
    being written) failed, the staged package and `tarball` are removed and the build fails."""
    checked = run(
        [tc.python, "-c", _CHECK, str(staging / "lib" / f"lib{name}.so"), str(staging)],
        env={**os.environ, weights_env(name): str(weights_file)} if weights_file else None,
    )
    pack_error = packed.exception() if packed is not None else None  # once the archive is written
    if not checked.ok or pack_error is not None:
        shutil.rmtree(staging, ignore_errors=True)
        tarball.unlink(missing_ok=True)
        if pack_error is not None:
            raise pack_error
        crash = f"crashed with signal {checked.signal}" if checked.signal else checked.tail(3)
        raise BuildError(f"the built C++ package '{name}' does not load; the previous one is left in place: {crash}")
