"""The manylinux platform tag a wheel's binaries satisfy, checked as `auditwheel show` checks it: every library a
shared library of the wheel needs (DT_NEEDED) is on a policy's whitelist, and every symbol version it requires
(.gnu.version_r: GLIBC_2.34 of libc.so.6, GLIBCXX_3.4.30 of libstdc++.so.6...) is one the policy allows. The tag is
the oldest policy that every binary satisfies, the one the most systems install.

Libraries torch provides (its torch/lib directory, libgomp.so.1 included), CUDA's (the driver's, the toolkit's and the
nvidia-* wheels'), the Python library and the wheel's own are not checked, nor are the symbol versions they define:
they are what PyTorch extension projects pass to `auditwheel repair --exclude`, found at run time beside torch. What
the check reads is the binaries' bytes and the names in torch/lib, so identical builds get identical tags.

auditwheel also refuses a few symbols by name (its policies' blacklists); they are left out here: those of libc,
libm and libpthread (manylinux_2_17's only) are glibc 2.18's, whose GLIBC_2.18 version the check refuses anyway,
and those of libz are zlib's internals.
"""

from __future__ import annotations

import importlib.util
import re
import struct
import sysconfig
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

_VERSIONED = ("GLIBC", "GLIBCXX", "CXXABI", "GCC", "ZLIB", "LIBATOMIC")
# auditwheel's manylinux policies (src/auditwheel/policy/manylinux-policy.json) for x86_64, from manylinux_2_17 (the
# oldest PEP 600 tag; torch itself needs glibc 2.28): the newest version each policy allows of each versioned library's
# symbols, in _VERSIONED's order ("" none). A policy's glibc is its GLIBC column (2.37 has no symbols of its own).
# aarch64's binaries are checked against the same table: it never allows what auditwheel's aarch64 policies refuse
# (checked against every version aarch64's libraries define), and is stricter only in manylinux_2_17 (GLIBC_2.18,
# LIBATOMIC_1.0), manylinux_2_26 (GCC_7.0.0, CXXABI_1.3.11, GLIBCXX_3.4.23 and 3.4.24) and manylinux_2_34 (GCC_11.0).
_POLICY_TABLE = (
    ("2.17", "3.4.19", "1.3.7", "4.8.0", "1.2.5.2", ""),
    ("2.24", "3.4.22", "1.3.10", "4.8.0", "1.2.5.2", "1.2"),
    ("2.26", "3.4.22", "1.3.10", "4.8.0", "1.2.5.2", "1.2"),
    ("2.27", "3.4.24", "1.3.11", "7.0.0", "1.2.9", "1.2"),
    ("2.28", "3.4.24", "1.3.11", "7.0.0", "1.2.9", "1.2"),
    ("2.31", "3.4.28", "1.3.12", "7.0.0", "1.2.9", "1.2"),
    ("2.34", "3.4.29", "1.3.13", "7.0.0", "1.2.9", "1.2"),
    ("2.35", "3.4.30", "1.3.13", "12.0.0", "1.2.9", "1.2"),
    ("2.36", "3.4.30", "1.3.13", "12.0.0", "1.2.9", "1.2"),
    ("2.37", "3.4.30", "1.3.13", "12.0.0", "1.2.12", "1.2"),
    ("2.38", "3.4.30", "1.3.13", "12.0.0", "1.2.12", "1.2"),
    ("2.39", "3.4.33", "1.3.15", "14.0.0", "1.2.12", "1.2"),
    ("2.40", "3.4.33", "1.3.15", "14.0.0", "1.2.12", "1.2"),
    ("2.41", "3.4.33", "1.3.15", "14.0.0", "1.2.12", "1.2"),
)
# Version names that are not numbers, and the glibc of the first policy that allows each.
_NAMED_VERSIONS = {"CXXABI_TM_1": (2, 17), "CXXABI_FLOAT128": (2, 24), "GLIBC_ABI_DT_RELR": (2, 36)}
_WHITELIST = frozenset(
    (
        "libgcc_s.so.1 libstdc++.so.6 libm.so.6 libdl.so.2 librt.so.1 libc.so.6 libnsl.so.1 libutil.so.1 "
        "libpthread.so.0 libresolv.so.2 libX11.so.6 libXext.so.6 libXrender.so.1 libICE.so.6 libSM.so.6 libGL.so.1 "
        "libgobject-2.0.so.0 libgthread-2.0.so.0 libglib-2.0.so.0 libexpat.so.1 libz.so.1 libatomic.so.1 libanl.so.1"
    ).split()
)
_WHITELISTED_FROM = {"libmvec.so.1": (2, 24)}  # whitelisted by this policy and later ones
_LOADERS = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}
# Libraries of CUDA: the driver's (libcuda.so.1, installed with it), the toolkit's and the nvidia-* wheels' that torch
# depends on, and the Python library. Matched by prefix: their file names carry CUDA's major version.
_PROVIDED_PREFIXES = (
    "libcuda.so",
    "libcudart.so",
    "libnvrtc",
    "libcublas",
    "libcudnn",
    "libnvToolsExt",
    "libnvtx",
    "libcufft",
    "libcurand",
    "libcusparse",
    "libcusolver",
    "libnccl",
    "libnvJitLink",
    "libcupti",
    "libcufile",
    "libnvshmem",
    "libpython",
)

_ELF_MAGIC = b"\x7fELF"
_MACHINES = {62: "x86_64", 183: "aarch64"}  # e_machine: EM_X86_64, EM_AARCH64
_SHT_DYNAMIC, _SHT_GNU_VERNEED = 6, 0x6FFFFFFE
_DT_NULL, _DT_NEEDED = 0, 1
_HEADER = struct.Struct("<HHIQQQIHHHHHH")  # Elf64_Ehdr after e_ident: e_type ... e_shstrndx
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_DYN = struct.Struct("<qQ")  # Elf64_Dyn
_VERNEED = struct.Struct("<HHIII")  # Elf64_Verneed: vn_version, vn_cnt, vn_file, vn_aux, vn_next
_VERNAUX = struct.Struct("<IHHII")  # Elf64_Vernaux: vna_hash, vna_flags, vna_other, vna_name, vna_next
_SHARED_LIBRARY = re.compile(r"\.so(\.\d+)*$")


class UnreadableElf(ValueError):
    """A file this check cannot read as a 64-bit little-endian ELF file for x86_64 or aarch64."""


@dataclass(frozen=True)
class Binary:
    """What one shared library asks of the dynamic loader."""

    architecture: str  # x86_64 or aarch64
    needed: tuple[str, ...]  # DT_NEEDED, in order
    versions: tuple[tuple[str, str], ...]  # (library file, version name) from .gnu.version_r


@dataclass(frozen=True)
class Platform:
    """The platform part of a wheel's tag, as its binaries satisfy it."""

    tag: str  # manylinux_2_35_x86_64; this machine's linux_* tag where no manylinux policy fits
    reason: str = ""  # why no manylinux policy fits ("" for a manylinux tag)


@dataclass(frozen=True)
class _Policy:
    glibc: tuple[int, ...]  # (2, 28) for manylinux_2_28
    newest: Mapping[str, tuple[int, ...] | None]  # by versioned library, as _POLICY_TABLE has it

    def allows_library(self, library: str) -> bool:
        since = _WHITELISTED_FROM.get(library)
        return library in _WHITELIST or (since is not None and self.glibc >= since)

    def allows_version(self, version: str) -> bool:
        """Whether the policy allows this symbol version; auditwheel checks only the libraries its policies list."""
        library, _, number = version.partition("_")
        if library not in self.newest:
            return True
        if version in _NAMED_VERSIONS:
            return self.glibc >= _NAMED_VERSIONS[version]
        parsed, newest = parse_version(number), self.newest[library]
        return parsed is not None and newest is not None and parsed <= newest

    def tag(self, architecture: str) -> str:
        return f"manylinux_{self.glibc[0]}_{self.glibc[1]}_{architecture}"


class _Unmet(NamedTuple):
    member: str
    requirement: str  # a library's file name, or a version name
    library: str  # the library the version is of; "" where the requirement is the library


def parse_version(text: str) -> tuple[int, ...] | None:
    """A symbol version's number as a tuple that compares as versions do ("3.4.9" -> (3, 4, 9)); None for a name that
    is not one (TM_1)."""
    parts = text.split(".")
    return tuple(map(int, parts)) if all(part.isdigit() for part in parts) else None


_POLICIES = tuple(
    _Policy(
        glibc=tuple(int(part) for part in row[0].split(".")),
        newest={
            library: parse_version(newest) if newest else None for library, newest in zip(_VERSIONED, row, strict=True)
        },
    )
    for row in _POLICY_TABLE
)


class _Section(NamedTuple):
    type: int
    offset: int
    size: int
    link: int  # the section of its strings
    info: int  # .gnu.version_r: its number of entries


def platform(members: Mapping[str, bytes]) -> Platform:
    """The platform tag of a wheel of `members` (path in the wheel: content), from its shared libraries."""
    host = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    binaries = {}
    for name, data in sorted(members.items()):
        if _SHARED_LIBRARY.search(name):
            try:
                binaries[name] = read_elf(data)
            except UnreadableElf as exc:
                return Platform(host, f"{name} {exc}")
    return satisfied(binaries, torch_libraries() | {name.rpartition("/")[2] for name in members}, host)


def satisfied(binaries: Mapping[str, Binary], excluded: frozenset[str], host: str) -> Platform:
    """The oldest manylinux policy whose rules `binaries` (by member) keep, leaving `excluded` libraries unchecked;
    `host` (linux_x86_64) where none is."""
    architectures = sorted({binary.architecture for binary in binaries.values()}) or [host.partition("_")[2]]
    if len(architectures) > 1:
        return Platform(host, f"its shared libraries are for {' and '.join(architectures)}")
    unmet = None
    for policy in _POLICIES:
        unmet = next(_unmet(binaries, policy, excluded), None)
        if unmet is None:
            return Platform(policy.tag(architectures[0]))
    assert unmet is not None  # what the newest policy does not allow
    if unmet.library:
        return Platform(
            host, f"{unmet.member} needs {unmet.requirement} of {unmet.library}, which no manylinux policy allows"
        )
    return Platform(
        host,
        f"{unmet.member} needs {unmet.requirement}, which no manylinux policy allows and neither torch nor CUDA provides",
    )


def torch_libraries() -> frozenset[str]:
    """The file names in the installed torch's torch/lib directory, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return frozenset(path.name for path in lib.iterdir() if path.is_file()) if lib.is_dir() else frozenset()


def read_elf(data: bytes) -> Binary:
    """The libraries and symbol versions a shared library needs: its dynamic section's DT_NEEDED entries and its
    .gnu.version_r section (SHT_GNU_verneed), found by section type."""
    if not data.startswith(_ELF_MAGIC):
        raise UnreadableElf("is not an ELF file")
    if data[4:6] != b"\x02\x01":  # EI_CLASS, EI_DATA: ELFCLASS64, ELFDATA2LSB
        raise UnreadableElf("is not a 64-bit little-endian ELF file")
    try:
        _, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, _ = _HEADER.unpack_from(data, 16)
        if machine not in _MACHINES:
            raise UnreadableElf(f"is an ELF file for machine {machine}, neither x86_64 nor aarch64")
        sections = _sections(data, shoff, shentsize, shnum)
        return Binary(
            architecture=_MACHINES[machine],
            needed=tuple(_needed(data, sections)),
            versions=tuple(_versions(data, sections)),
        )
    except UnreadableElf:
        raise
    except (struct.error, IndexError, ValueError) as exc:
        raise UnreadableElf(f"is a truncated or malformed ELF file ({exc})") from None


def _unmet(binaries: Mapping[str, Binary], policy: _Policy, excluded: frozenset[str]) -> Iterator[_Unmet]:
    """What `binaries` need that `policy` does not allow, leaving out the dynamic loader and `excluded` libraries (and
    what CUDA and Python provide)."""
    for member, binary in binaries.items():
        checked = {
            library
            for library in (*binary.needed, *(library for library, _ in binary.versions))
            if library != _LOADERS[binary.architecture]
            and library not in excluded
            and not library.startswith(_PROVIDED_PREFIXES)
        }
        for library in binary.needed:
            if library in checked and not policy.allows_library(library):
                yield _Unmet(member, library, "")
        for library, version in binary.versions:
            if library in checked and not policy.allows_version(version):
                yield _Unmet(member, version, library)


def _sections(data: bytes, shoff: int, shentsize: int, shnum: int) -> list[_Section]:
    def section(index: int) -> _Section:
        _, kind, _, _, offset, size, link, info, _, _ = _SECTION.unpack_from(data, shoff + index * shentsize)
        return _Section(kind, offset, size, link, info)

    if shoff == 0:
        return []
    # e_shnum 0: the file has 0xff00 sections or more, and section 0's sh_size counts them
    return [section(index) for index in range(shnum or section(0).size)]


def _needed(data: bytes, sections: list[_Section]) -> Iterator[str]:
    for section in sections:
        if section.type == _SHT_DYNAMIC:
            for offset in range(section.offset, section.offset + section.size, _DYN.size):
                tag, value = _DYN.unpack_from(data, offset)
                if tag == _DT_NULL:
                    break
                if tag == _DT_NEEDED:
                    yield _string(data, sections[section.link], value)


def _versions(data: bytes, sections: list[_Section]) -> Iterator[tuple[str, str]]:
    for section in sections:
        if section.type == _SHT_GNU_VERNEED:
            strings, entry = sections[section.link], section.offset
            for _ in range(section.info):
                _, count, file, aux, following = _VERNEED.unpack_from(data, entry)
                library, name_entry = _string(data, strings, file), entry + aux
                for _ in range(count):
                    _, _, _, name, next_name = _VERNAUX.unpack_from(data, name_entry)
                    yield library, _string(data, strings, name)
                    name_entry += next_name
                entry += following


def _string(data: bytes, strings: _Section, offset: int) -> str:
    start = strings.offset + offset
    return data[start : data.index(b"\0", start)].decode()
