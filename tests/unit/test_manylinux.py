"""The manylinux tag a wheel's binaries satisfy (shimgen/package/manylinux.py): ELF files read as auditwheel reads
them, and the oldest policy whose libraries and symbol versions they keep to. The integration tests compare the tags
of built wheels with `auditwheel show`."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest
import torch

from shimgen.package import manylinux
from shimgen.package.manylinux import Binary

TORCH_LIB = Path(torch.__file__).parent / "lib"
TORCH_TAG = next(
    line.split("-")[-1]
    for dist_info in TORCH_LIB.parents[1].glob("torch-*.dist-info")
    for line in (dist_info / "WHEEL").read_text().splitlines()
    if line.startswith("Tag:")
)


def binary(*versions: tuple[str, str], needed: tuple[str, ...] = ()) -> dict[str, Binary]:
    libraries = tuple(dict.fromkeys((*needed, *(library for library, _ in versions))))
    return {"pkg/_graph.so": Binary(architecture="x86_64", needed=libraries, versions=versions)}


def tag(binaries: dict[str, Binary]) -> manylinux.Platform:
    return manylinux.satisfied(binaries, frozenset({"libtorch_cpu.so", "libc10.so", "libgomp.so.1"}), "linux_x86_64")


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ((("libc.so.6", "GLIBC_2.2.5"), ("libstdc++.so.6", "GLIBCXX_3.4.19")), "manylinux_2_17_x86_64"),
        ((("libc.so.6", "GLIBC_2.17"), ("libstdc++.so.6", "CXXABI_1.3.9")), "manylinux_2_24_x86_64"),
        ((("libc.so.6", "GLIBC_2.28"), ("libstdc++.so.6", "GLIBCXX_3.4.21")), "manylinux_2_28_x86_64"),
        ((("libc.so.6", "GLIBC_2.34"),), "manylinux_2_34_x86_64"),
        ((("libstdc++.so.6", "GLIBCXX_3.4.30"), ("libgcc_s.so.1", "GCC_3.0")), "manylinux_2_35_x86_64"),
        ((("libc.so.6", "GLIBC_ABI_DT_RELR"),), "manylinux_2_36_x86_64"),
        ((("libgomp.so.1", "GOMP_4.0"), ("libc10.so", "SOMETHING_9")), "manylinux_2_17_x86_64"),  # torch's own
        ((("libcudart.so.13", "libcudart.so.13"),), "manylinux_2_17_x86_64"),  # CUDA's
    ],
)
def test_the_oldest_policy_the_symbol_versions_allow(versions: tuple[tuple[str, str], ...], expected: str) -> None:
    assert tag(binary(*versions)) == manylinux.Platform(expected)


def test_what_no_policy_allows_gives_the_host_tag_and_says_why() -> None:
    assert tag(binary(("libc.so.6", "GLIBC_2.99"))) == manylinux.Platform(
        "linux_x86_64", "pkg/_graph.so needs GLIBC_2.99 of libc.so.6, which no manylinux policy allows"
    )
    assert tag(binary(needed=("libssl.so.3",))) == manylinux.Platform(
        "linux_x86_64",
        "pkg/_graph.so needs libssl.so.3, which no manylinux policy allows and neither torch nor CUDA provides",
    )
    mixed = {**binary(), "pkg/_other.so": Binary(architecture="aarch64", needed=(), versions=())}
    assert tag(mixed).reason == "its shared libraries are for aarch64 and x86_64"


def test_elf_files_read_as_readelf_reads_them() -> None:
    library = TORCH_LIB / "libc10.so"
    read = manylinux.read_elf(library.read_bytes())
    shown = subprocess.run(["readelf", "-dV", "-W", str(library)], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in shown.splitlines() if "(NEEDED)" in line]
    versions, file = [], ""
    for line in shown.split("Version needs section")[1].splitlines():
        if "File:" in line:
            file = line.split("File:")[1].split()[0]
        elif "Name:" in line:
            versions.append((file, line.split("Name:")[1].split()[0]))
    assert read.architecture == platform.machine()
    assert list(read.needed) == needed and list(read.versions) == versions
    with pytest.raises(manylinux.UnreadableElf, match="is not an ELF file"):
        manylinux.read_elf(b"#!/bin/sh\n")
    with pytest.raises(manylinux.UnreadableElf, match="truncated or malformed"):
        manylinux.read_elf(library.read_bytes()[:200])


def test_torchs_own_libraries_get_no_newer_tag_than_torchs_wheel() -> None:
    """auditwheel tagged torch's wheel: its libraries, checked here, satisfy that policy or an older one."""
    members = {f"torch/lib/{p.name}": p.read_bytes() for p in TORCH_LIB.iterdir() if ".so" in p.name and p.is_file()}
    ours = manylinux.satisfied(
        {name: manylinux.read_elf(data) for name, data in members.items()},
        frozenset(name.rpartition("/")[2] for name in members),
        "linux_x86_64",
    )

    def glibc(platform_tag: str) -> tuple[int, int]:
        major, minor = platform_tag.split("_")[1:3]
        return int(major), int(minor)

    assert ours.tag.startswith("manylinux_"), ours.reason
    assert glibc(ours.tag) <= glibc(TORCH_TAG)
