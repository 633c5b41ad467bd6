"""`shimgen merge`: the per-target wheels of one package (built with `--only`, in a matrix's jobs) joined into the
multi-target package a build of all targets makes, from the manifest each wheel carries (render.BUILD_MANIFEST)."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from shimgen import devices
from shimgen.errors import UserError
from shimgen.inductor import weights
from shimgen.package import manylinux
from shimgen.package.wheel import weights_file_of, write_wheel
from shimgen.project.render import BUILD_MANIFEST, render_init


def merge(wheels: list[Path], out: Path) -> Path:
    """One wheel in `out` holding every target of `wheels`: their extensions, kernels and op libraries, and an
    __init__.py that picks a graph's target by its first input's device; for wheels built with external weights, one
    weights file beside it (`weights_file_of`) holding theirs."""
    if len(wheels) < 2:
        raise UserError("merge: name two or more wheels, one per target, of one package")
    parts = [_read(w) for w in wheels]
    first = parts[0]
    for part in parts[1:]:
        for what in ("name", "base", "torch", "python"):
            if part[what] != first[what]:
                raise UserError(
                    f"merge: {part['wheel'].name} and {first['wheel'].name} differ in {what} "
                    f"({part[what]} vs {first[what]}); merge the targets of one build of one package"
                )
        if part["manifest"]["graphs"] != first["manifest"]["graphs"]:
            raise UserError(f"merge: {part['wheel'].name} and {first['wheel'].name} hold different graphs")
    held = [t["device"] for p in parts for t in p["manifest"]["targets"]]
    twice = next((d for i, d in enumerate(held) if held.index(d) != i), None)
    if twice:
        raise UserError(f"merge: two wheels hold a {twice} target; a package has one target per device")
    parts.sort(key=lambda p: [devices.device(t["device"]).build_order for t in p["manifest"]["targets"]])
    label = ".".join([f"torch{first['torch']}", *(p["targets_label"] for p in parts)])
    version = f"{first['base']}+{label}"
    manifest = _merged_manifest(parts, version)
    name = manifest["name"]
    members: dict[str, tuple[bytes, bool]] = {}
    for part in parts:
        members.update(
            {
                k: v
                for k, v in part["members"].items()
                if not k.startswith(f"{name}/__init__.py")
                and k != f"{name}/{BUILD_MANIFEST}"
                and ".dist-info/" not in k
            }
        )
    members[f"{name}/__init__.py"] = (render_init(manifest).encode(), False)
    members[f"{name}/{BUILD_MANIFEST}"] = ((json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode(), False)
    dist_info = f"{name}-{version}.dist-info"
    for member, (data, executable) in first["members"].items():
        if ".dist-info/" in member and not member.endswith("/RECORD"):
            if member.endswith("/METADATA"):
                data = re.sub(rb"^Version: .*$", f"Version: {version}".encode(), data, count=1, flags=re.M)
            members[f"{dist_info}/{member.split('/', 1)[1]}"] = (data, executable)
    platform = manylinux.platform({member: data for member, (data, _) in members.items()}).tag
    wheel = out / f"{name}-{version}-{first['python']}-{platform}.whl"
    out.mkdir(parents=True, exist_ok=True)
    if manifest.get("weights_env"):  # flags.weights = "external": the weights files beside the wheels, joined too
        files = [weights_file_of(p["wheel"]) for p in parts]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise UserError(
                f"merge: the wheels were built with flags.weights = 'external', and their weights files are not beside "
                f"them: {', '.join(missing)}"
            )
        weights_file_of(wheel).write_bytes(weights.external_file([("", f.read_bytes()) for f in files]))
    write_wheel(wheel, members)
    return wheel


def _read(wheel: Path) -> dict:
    try:
        name, version, _, tags = parse_wheel_filename(wheel.name)
        with zipfile.ZipFile(wheel) as zf:
            members = {
                i.filename: (zf.read(i), bool((i.external_attr >> 16) & 0o111)) for i in zf.infolist() if not i.is_dir()
            }
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UserError(f"merge: {wheel}: not a readable wheel ({exc})") from None
    package = str(name).replace("-", "_")
    manifest = members.get(f"{package}/{BUILD_MANIFEST}")
    local = Version(str(version)).local or ""
    found = re.fullmatch(r"torch(\d+\.\d+\.\d+)\.(.+)", local)
    if manifest is None or found is None:
        raise UserError(f"merge: {wheel.name} was not built by this shimgen (no {BUILD_MANIFEST}, or no +torch label)")
    return {
        "wheel": wheel,
        "name": package,
        "base": Version(str(version)).public,
        "torch": found[1],
        "targets_label": found[2],
        "python": "-".join(sorted({f"{t.interpreter}-{t.abi}" for t in tags})),
        "members": members,
        "manifest": json.loads(manifest[0]),
    }


def _merged_manifest(parts: list[dict], version: str) -> dict:
    manifests = [p["manifest"] for p in parts]
    merged = dict(manifests[0])
    merged["version"] = version
    merged["targets"] = [t for m in manifests for t in m["targets"]]
    merged["units"] = [u for m in manifests for u in m["units"]]
    merged["target_ids"] = " and ".join(m["target_ids"] for m in manifests)
    merged["op_libraries"] = list({lib["file"]: lib for m in manifests for lib in m["op_libraries"]}.values())
    merged["op_modules"] = list({mod["module"]: mod for m in manifests for mod in m["op_modules"]}.values())
    return merged
