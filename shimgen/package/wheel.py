"""Package stage: the wheel, written once from Meson's install plan, and the importable package directory, written
from the same bytes. Both are replaced only after the package imports in a fresh interpreter (and computes what its
traced programs do), so a build that reports success always leaves a package that imports.

The wheel holds what the plan installs into Python's library directory (install tags 'runtime' and 'python-runtime',
read from the build directory, where Meson left them as they install: no build RPATH to strip), and a .dist-info made
from the generated pyproject.toml's [project] table, as meson-python would make it. The generated project stays a
meson-python project (`pip wheel build/<name>/project` makes the same package); shimgen does not run meson-python,
which would deflate 50-100 MB of weights only for them to be written again.

The wheel is reproducible: members in sorted order (the .dist-info directory last, RECORD last of all), with
SOURCE_DATE_EPOCH's timestamp and permissions that do not depend on the umask. A member is deflated only where that
pays: weights (float data, in a .safetensors file or as most of an extension module's bytes) hardly deflate (to about
93%), and deflating MiniLM's 90 MB of them took 3 s of every build on 2 cores. The choice is made from the member's
content alone, so identical members still give an identical wheel.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import pickle
import shutil
import stat
import sys
import sysconfig
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from packaging.utils import canonicalize_name, parse_wheel_filename

from shimgen.build.meson import ZIP_EPOCH, install_plan, source_date_epoch
from shimgen.build.process import run_python
from shimgen.errors import BuildError, MismatchError
from shimgen.files import replace_dir
from shimgen.inductor import weights
from shimgen.package import manylinux, verify
from shimgen.project.render import weights_env
from shimgen.results import PackageResult

# Whether to deflate a member is judged on a sample of this many bytes: the whole member when it is smaller, else
# _SAMPLE_CHUNKS pieces taken at the middles of equal strides over it. An extension module with compiled-in weights
# starts with its code (deflates to 70%) and carries the weights after it: its first bytes alone would mislead.
_SAMPLE_BYTES = 1 << 20
_SAMPLE_CHUNKS = 16
_STORE_ABOVE = 0.9  # store a member whose sample deflates (zlib level 6, ZipFile's default) to more than this
_ALWAYS_STORED = (".safetensors",)
WHEEL_TAGS = ("runtime", "python-runtime")  # the C++ package's files carry 'cpp'
_PYTHON_DIRS = ("{py_platlib}/", "{py_purelib}/")


def build_and_unpack(
    source: Path,
    build_dir: Path,
    dist: Path,
    site: Path,
    name: str,
    key: str,
    module_dirs: tuple[Path, ...] = (),
    plan: verify.Plan | verify.ReferenceRun | None = None,
    external_weights: list[tuple[str, Path]] | None = None,
    beside: Callable[[Path, Path | None], None] | None = None,
) -> PackageResult:
    """The wheel of the project in `source` compiled in `build_dir`, in `dist`, and its contents in `site` (a
    directory that can go on sys.path); `module_dirs` hold the Python modules the package imports besides torch (the
    spec's directory, for its custom ops' modules). `external_weights`: flags.weights = "external", the units' weights
    files (by unit), written as one file beside the wheel (`weights_file_of`). `beside(tree, weights_file)` runs
    while the package is checked, given its staged contents: the package is installed once both succeeded."""
    members = {path: (file.read_bytes(), file.suffix == ".so") for path, file in planned_members(build_dir).items()}
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    distribution = f"{canonicalize_name(project['name']).replace('-', '_')}-{project['version']}"
    platform = manylinux.platform({name: data for name, (data, _) in members.items()})
    tag = wheel_tag(platform.tag)
    members[f"{distribution}.dist-info/METADATA"] = (_metadata(project), False)
    members[f"{distribution}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: shimgen\nRoot-Is-Purelib: false\nTag: {tag}\n\n".encode(),
        False,
    )
    dist.mkdir(parents=True, exist_ok=True)
    staging = site.with_name(site.name + ".new")
    _write_tree(members, staging)
    with tempfile.TemporaryDirectory(prefix=".shimgen-wheel-", dir=dist) as tmp:
        wheel = Path(tmp) / f"{distribution}-{tag}.whl"
        write_wheel(wheel, members)
        weights_file = None
        if external_weights is not None:
            weights_file = weights_file_of(wheel)
            weights_file.write_bytes(
                weights.external_file([(unit, path.read_bytes()) for unit, path in external_weights])
            )
        packaged = _install(wheel, staging, dist, site, name, key, module_dirs, plan, weights_file, beside)
    return dataclasses.replace(packaged, platform_reason=platform.reason)


def planned_members(build_dir: Path) -> dict[str, Path]:
    """The wheel's members (their paths in the wheel) and the files of `build_dir`'s project they are, as Meson's
    install plan has them."""
    members = {}
    for entries in install_plan(build_dir).values():
        for file, entry in entries.items():
            if entry.get("tag") not in WHEEL_TAGS:
                continue
            destination = entry["destination"]
            if not destination.startswith(_PYTHON_DIRS) or entry.get("build_rpaths") or Path(file).is_dir():
                raise BuildError(
                    f"the generated Meson project installs {file} to {destination} with install tag {entry['tag']}: "
                    "a wheel holds plain files in the Python package (a shimgen bug)"
                )
            members[destination.split("/", 1)[1]] = Path(file)
    return members


def wheel_tag(platform: str) -> str:
    """This Python's wheel tag for extension modules of `platform` (manylinux_2_35_x86_64, or linux_x86_64 where no
    manylinux policy fits): cp311-cp311-manylinux_2_35_x86_64."""
    interpreter = f"{sys.implementation.name[:2]}{sys.version_info.major}{sys.version_info.minor}"
    soabi = sysconfig.get_config_var("SOABI") or ""
    # cpython-311-x86_64-linux-gnu -> cp311 (cpython-313t-... -> cp313t, the free-threaded ABI)
    abi = (
        f"cp{soabi.split('-')[1]}" if soabi.startswith("cpython-") else soabi.split("-")[0].replace(".", "_") or "none"
    )
    return f"{interpreter}-{abi}-{platform}"


def _metadata(project: dict[str, Any]) -> bytes:
    readme = project.get("readme", {})
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
        f"Requires-Python: {project['requires-python']}",
        *(f"Requires-Dist: {requirement}" for requirement in project.get("dependencies", ())),
        *([f"Description-Content-Type: {readme['content-type']}"] if readme else []),
    ]
    return ("\n".join(lines) + "\n\n" + readme.get("text", "")).encode()


def _write_tree(members: dict[str, tuple[bytes, bool]], root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    for name, (data, executable) in members.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755 if executable else 0o644)


def write_wheel(wheel: Path, members: dict[str, tuple[bytes, bool]], epoch: int | None = None) -> None:
    """A wheel of `members` (name: (content, executable)), atomically: members sorted (.dist-info last, its RECORD
    regenerated in that order and last), every timestamp `epoch` (default SOURCE_DATE_EPOCH's), modes 0644 or 0755,
    each member deflated or stored as `compress_type` decides from its name and content."""
    epoch = source_date_epoch() if epoch is None else epoch
    members = {name: member for name, member in members.items() if not name.endswith(".dist-info/RECORD")}
    names = sorted(members, key=lambda name: (name.split("/")[0].endswith(".dist-info"), name))
    record = next(name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")) + "/RECORD"
    rewritten = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in names:
            data, executable = members[name]
            zf.writestr(_zip_entry(name, epoch, executable, compress_type(name, data)), data)
        record_data = _record(names, members, record)
        zf.writestr(_zip_entry(record, epoch, False, compress_type(record, record_data)), record_data)
    rewritten.replace(wheel)


def compress_type(name: str, data: bytes) -> int:
    return zipfile.ZIP_DEFLATED if worth_deflating(name, data) else zipfile.ZIP_STORED


def worth_deflating(name: str, data: bytes) -> bool:
    """Whether deflate shrinks a file of this name and content more than a little (judged on a sample of it): what
    the wheel and the C++ package's archive store as it is instead (weights, mostly) costs no time to pack or unpack."""
    if name.endswith(_ALWAYS_STORED):
        return False
    if len(data) <= _SAMPLE_BYTES:
        sample = data
    else:
        chunk, stride = _SAMPLE_BYTES // _SAMPLE_CHUNKS, len(data) / _SAMPLE_CHUNKS
        starts = (int(stride * (k + 0.5)) - chunk // 2 for k in range(_SAMPLE_CHUNKS))
        sample = b"".join(data[start : start + chunk] for start in starts)
    if not sample:
        return True
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate, as a zip member holds it (no zlib header)
    deflated = len(deflate.compress(sample)) + len(deflate.flush())
    return deflated <= _STORE_ABOVE * len(sample)


def _zip_entry(name: str, epoch: int, executable: bool, compress: int) -> zipfile.ZipInfo:
    # A zip timestamp has no time zone: UTC, as reproducible-builds.org has it (and meson-python does).
    info = zipfile.ZipInfo(name, time.gmtime(max(epoch, ZIP_EPOCH))[:6])
    info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
    info.create_system = 3  # Unix, whatever the build machine (the modes above are Unix modes)
    info.compress_type = compress
    return info


def _record(names: list[str], members: dict[str, tuple[bytes, bool]], record: str) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    for name in names:
        data = members[name][0]
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow((name, f"sha256={digest}", len(data)))
    writer.writerow((record, "", ""))
    return text.getvalue().encode()


def _unpack(wheel: Path, staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(staging)
    for member in staging.rglob("*.so"):
        member.chmod(0o755)


def weights_file_of(wheel: Path) -> Path:
    """Where the weights of a wheel built with flags.weights = "external" are: beside it, named by its distribution
    and version (resnet-0.1.0+torch2.13.0.cpu.native.safetensors)."""
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return wheel.with_name(f"{canonicalize_name(name).replace('-', '_')}-{version}.safetensors")


def _check(
    staging: Path,
    site: Path,
    name: str,
    module_dirs: tuple[Path, ...],
    given: verify.Plan | verify.ReferenceRun | None,
    weights_file: Path | None,
) -> verify.Report:
    """The unpacked package imported in a fresh interpreter (an "external" package given `weights_file` through its
    variable, as a user gives it) and, given a plan, its graphs run against their traced programs
    (shimgen/package/verify.py); where either fails, `staging` is removed and the build fails."""
    plan = given.for_check() if isinstance(given, verify.ReferenceRun) else given
    with tempfile.TemporaryDirectory(prefix="shimgen-verify-") as tmp:
        plan_file, report_file = Path(tmp) / "plan.pickle", Path(tmp) / "report.json"
        if plan is not None:
            plan_file.write_bytes(pickle.dumps(plan))
        checked = run_python(
            "shimgen.package.verify:main",
            [str(staging), name, str(report_file), str(plan_file) if plan else "-", *map(str, module_dirs)],
            fresh=(name, *(plan.op_modules if plan else ())),
            env={weights_env(name): str(weights_file)} if weights_file else None,
        )
        report = verify.Report(**json.loads(report_file.read_text())) if report_file.is_file() else verify.Report()
    if checked.ok:
        return report
    shutil.rmtree(staging, ignore_errors=True)
    kept = "the previous package is left in place" if site.is_dir() else "no package is written"
    if report.failure.startswith("import: ") or (not report.failure and not report.running):
        crash = f" (it crashed with signal {checked.signal})" if checked.signal else ""
        raise BuildError(
            f"the built package '{name}' does not import{crash}; {kept}: {report.failure.removeprefix('import: ') or checked.tail(1)}"
        )
    if report.failure:
        raise MismatchError(
            f"the built package '{name}' does not compute what its traced program does; {kept}: {report.failure}",
            report.failure,
            report.program,
        )
    said = f" ({checked.tail(1)})" if checked.signal and checked.tail(1) else ""
    crash = f"crashed with signal {checked.signal}{said}" if checked.signal else f"failed: {checked.tail(1)}"
    raise BuildError(f"the built package '{name}' {crash} at {report.running}; {kept}")


def install(
    wheel: Path,
    dist: Path,
    site: Path,
    name: str,
    key: str,
    module_dirs: tuple[Path, ...] = (),
    plan: verify.Plan | None = None,
) -> PackageResult:
    """`wheel` (from the shared cache, with its external weights file beside it where it has one) moved into `dist`
    and unpacked in `site`, once it imports here and, given a plan, computes what its traced programs do."""
    dist.mkdir(parents=True, exist_ok=True)
    staging = site.with_name(site.name + ".new")
    _unpack(wheel, staging)
    weights_file = weights_file_of(wheel)
    return _install(
        wheel, staging, dist, site, name, key, module_dirs, plan, weights_file if weights_file.is_file() else None
    )


def _install(
    wheel: Path,
    staging: Path,
    dist: Path,
    site: Path,
    name: str,
    key: str,
    module_dirs: tuple[Path, ...],
    plan: verify.Plan | verify.ReferenceRun | None,
    weights_file: Path | None = None,
    beside: Callable[[Path, Path | None], None] | None = None,
) -> PackageResult:
    with ThreadPoolExecutor(max_workers=1) as pool:  # where the check fails, `beside` is waited for all the same
        besides = pool.submit(beside, staging, weights_file) if beside else None
        report = _check(staging, site, name, module_dirs, plan, weights_file)
        error = besides.exception() if besides is not None else None
    if error is not None:
        shutil.rmtree(staging, ignore_errors=True)
        raise error
    final = dist / wheel.name
    if weights_file is not None:
        weights_file = weights_file.replace(dist / weights_file.name)
    wheel.replace(final)
    replace_dir(staging, site)
    return PackageResult(
        key=key,
        wheel=final,
        site=site,
        weights_file=weights_file,
        verified=tuple(report.cases),
        verify_skipped=tuple(report.skipped),
        verify_seconds=report.seconds,
        verify_beforehand=report.beforehand,
        verify_settled=tuple(report.settled),
    )
