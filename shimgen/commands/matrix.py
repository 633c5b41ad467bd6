"""Build identifiers: one per CI job, every target x torch x Python (x CUDA for a cuda target), as cibuildwheel prints
them, with the axes it lacks. `shimgen build --only ID` builds one; each gets a wheel of its own (a local version label
names its torch and target), and `shimgen merge` joins one package's per-target wheels."""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass

from shimgen import devices
from shimgen.errors import UserError
from shimgen.spec import ProjectSpec, Target
from shimgen.toolchain.cuda import torch_cuda_version


@dataclass(frozen=True, kw_only=True)
class BuildId:
    """One job of the matrix."""

    python: str  # '3.11'
    torch: str  # '2.13.0'
    cuda: str | None  # '13.0' for a cuda target
    target: Target

    @property
    def identifier(self) -> str:
        """'cp311-torch2.13.0-cpu-native', 'cp311-torch2.14.1-cu130-sm_90'."""
        return f"cp{self.python.replace('.', '')}-torch{self.torch}-{target_label(self.target, self.cuda, '-')}"

    def as_json(self) -> dict[str, object]:
        return {
            "identifier": self.identifier,
            "python": self.python,
            "torch": self.torch,
            "cuda": self.cuda,
            "device": self.target.device,
            "isa": self.target.isa,
            "archs": self.target.archs,
        }


def target_label(target: Target, cuda: str | None, sep: str) -> str:
    if not devices.device(target.device).gpu:
        return f"{target.device}{sep}{target.isa}"
    return sep.join([f"cu{(cuda or '').replace('.', '')}", *target.archs])


def local_version(torch: str, targets: list[Target], cuda: str | None) -> str:
    """The wheel's local version label: 'torch2.13.0.cpu.native', 'torch2.14.1.cpu.native.cu130.sm90'."""
    parts = [f"torch{torch}"] + [target_label(t, cuda, ".").replace("_", "") for t in targets]
    return ".".join(parts).lower()


def running() -> tuple[str, str, str | None]:
    """(Python, torch, torch's CUDA or None) of this process, without importing torch."""
    import importlib.metadata

    try:
        cuda: str | None = torch_cuda_version()
    except UserError:
        cuda = None
    return f"{sys.version_info.major}.{sys.version_info.minor}", importlib.metadata.version("torch").split("+")[0], cuda


def identifiers(spec: ProjectSpec) -> list[BuildId]:
    python, torch, cuda = running()
    cuda_versions = spec.matrix.cuda or ([cuda] if cuda else [])
    ids = []
    for target in spec.target:
        if devices.device(target.device).gpu and not cuda_versions:
            raise UserError(
                "the spec has a cuda target and this torch is a CPU build: list the CUDA versions to build for in "
                'matrix.cuda, such as ["13.0"]'
            )
        for py in spec.matrix.python or [python]:
            for version in spec.matrix.torch or [torch]:
                for cu in cuda_versions if devices.device(target.device).gpu else [None]:
                    ids.append(BuildId(python=py, torch=version, cuda=cu, target=target))
    return ids


def select(spec: ProjectSpec, pattern: str) -> BuildId:
    """The one identifier `pattern` (a name or a glob) picks, checked against this process's Python, torch and CUDA."""
    ids = identifiers(spec)
    picked = [b for b in ids if fnmatch.fnmatchcase(b.identifier, pattern)]
    listed = ", ".join(b.identifier for b in ids)
    if not picked:
        raise UserError(f"--only {pattern}: no build identifier of the spec matches; it has {listed}")
    if len(picked) > 1:
        raise UserError(
            f"--only {pattern}: matches {len(picked)} identifiers ({', '.join(b.identifier for b in picked)}); name one"
        )
    build = picked[0]
    python, torch, cuda = running()
    needs = [
        (what, want, have)
        for what, want, have in (
            ("Python", build.python, python),
            ("torch", build.torch, torch),
            ("CUDA", build.cuda, cuda if build.cuda else None),
        )
        if want != have
    ]
    if needs:
        wanted = ", ".join(f"{what} {want}" for what, want, _ in needs)
        found = ", ".join(f"{what} {have or 'none (a CPU build)'}" for what, _, have in needs)
        raise UserError(
            f"--only {build.identifier} builds with {wanted}; this environment has {found}. Run it in the matrix job "
            "whose environment has them (shimgen matrix --json lists each job's versions)"
        )
    return build
