"""The per-user cache's entries (shimgen/toolchain/entries.py): made once, held while used, the least recently used
removed beyond the size limit."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from shimgen.errors import UserError
from shimgen.results import kernel_compile_args, wrapper_compile_args
from shimgen.spec import Flags
from shimgen.toolchain import entries, prebuilt

MB = 1 << 20


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHIMGEN_CACHE_DIR", str(tmp_path / "toolchain"))
    monkeypatch.delenv(entries.LIMIT_ENV, raising=False)
    return tmp_path


def _maker(size: int, made: list[Path]):  # type: ignore[no-untyped-def]
    def make(staging: Path) -> None:
        staging.mkdir(parents=True)
        (staging / "blob").write_bytes(b"\0" * size)
        made.append(staging)

    return make


def _made_at(key: str, when: float, kind: str = "prebuilt") -> Path:
    root = entries.location(kind, key)
    entries.ensure(root, _maker(MB, []), None, None)
    os.utime(root, (when, when))
    return root


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", entries.DEFAULT_LIMIT),
        ("0", None),
        ("1048576", MB),
        ("500M", 500 * MB),
        ("2G", 2048 * MB),
        ("1.5g", 1536 * MB),
        ("64KiB", 64 << 10),
    ],
)
def test_the_limit_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: int | None
) -> None:
    monkeypatch.setenv(entries.LIMIT_ENV, text)
    assert entries.limit() == expected


def test_a_limit_that_is_not_a_size_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(entries.LIMIT_ENV, "lots")
    with pytest.raises(UserError, match="SHIMGEN_CACHE_LIMIT='lots' is not a size"):
        entries.limit()


def test_a_build_with_a_bad_limit_stops_at_once_with_one_line(tmp_path: Path) -> None:
    from conftest import REPO, shimgen

    env = {**os.environ, entries.LIMIT_ENV: "lots", "SHIMGEN_SERVER": "off"}
    refused = shimgen("build", REPO / "projects" / "mlp.toml", "--out", tmp_path, env=env)
    assert refused.returncode == 2 and "SHIMGEN_CACHE_LIMIT='lots' is not a size" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and "[trace]" not in refused.stderr


def test_an_entry_is_made_once() -> None:
    made: list[Path] = []
    root = entries.location("runtime", "a")
    for _ in range(2):
        entries.ensure(root, _maker(10, made), None, None)
    assert len(made) == 1 and (root / "blob").is_file() and (root / "done").is_file()


def test_making_an_entry_removes_the_least_recently_used_beyond_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    oldest = _made_at("a", 1_000, "runtime")
    older = _made_at("b", 2_000)
    monkeypatch.setenv(entries.LIMIT_ENV, str(int(2.5 * MB)))
    with ExitStack() as held:
        newest = entries.location("prebuilt", "c")
        entries.ensure(newest, _maker(MB, []), held, None)
        assert not oldest.exists() and older.is_dir() and newest.is_dir()
    assert [e.root for e in entries.listed()] == [older, newest]


def test_use_counts_as_recent(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _made_at("a", 1_000)
    second = _made_at("b", 2_000)
    with ExitStack() as held:
        entries.ensure(first, _maker(MB, []), held, None)  # used now: no longer the least recent
    monkeypatch.setenv(entries.LIMIT_ENV, str(int(2.5 * MB)))
    entries.ensure(entries.location("prebuilt", "c"), _maker(MB, []), None, None)
    assert first.is_dir() and not second.exists()


def test_an_entry_a_build_holds_is_kept_beyond_the_limit() -> None:
    with ExitStack() as held:
        oldest = _made_at("a", 1_000)
        entries.ensure(oldest, _maker(MB, []), held, None)
        os.utime(entries.location("prebuilt", "a.use"), (1_000, 1_000))
        older = _made_at("b", 2_000)
        removed = entries.prune(MB)
        assert [e.root for e in removed] == [older]
        assert (oldest / "blob").is_file()
    assert [e.root for e in entries.prune(1)] == [oldest]


def test_a_removed_entry_is_made_again_when_next_used() -> None:
    made: list[Path] = []
    root = entries.location("prebuilt", "a")
    entries.ensure(root, _maker(MB, made), None, None)
    assert [e.root for e in entries.prune(1)] == [root]
    entries.ensure(root, _maker(MB, made), None, None)
    assert len(made) == 2 and (root / "done").is_file()


def test_no_limit_keeps_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    roots = [_made_at(key, 1_000 + n) for n, key in enumerate("abc")]
    assert entries.prune(None) == []
    assert all(root.is_dir() for root in roots)


def test_what_interrupted_builds_left_is_removed_unless_it_is_being_made() -> None:
    from shimgen.files import exclusive

    abandoned = entries.location("prebuilt", "a.new")
    in_progress = entries.location("runtime", "b.new")
    half_removed = entries.location("prebuilt", "c.removing")
    for folder in (abandoned, in_progress, half_removed):
        folder.mkdir(parents=True)
    with exclusive(entries.location("runtime", "b.lock")):
        entries.prune(None)
        assert not abandoned.exists() and not half_removed.exists()
        assert in_progress.is_dir()
    assert entries.listed() == []


def test_kernel_opt_keys_the_kernels_header_alone() -> None:
    """A project that differs from another in kernel_opt alone shares its wrapper's prebuilt pieces (three quarters of
    the compiling); one that differs in wrapper_opt or in its runtime interface shares the kernels' header."""

    def keys(interface: bytes = b"interface", **flags: Any) -> tuple[str, str]:
        return prebuilt.entry_keys("toolchain", "cpu", ["-DCPU_CAPABILITY_AVX2"], Flags(**flags), interface)

    wrapper, kernel = keys()
    other_kernel_opt, other_wrapper_opt, other_interface = keys(kernel_opt="O1"), keys(wrapper_opt="O2"), keys(b"other")
    assert other_kernel_opt[0] == wrapper and other_kernel_opt[1] != kernel
    assert other_wrapper_opt[0] != wrapper and other_wrapper_opt[1] == kernel
    assert other_interface[0] != wrapper and other_interface[1] == kernel
    assert not {wrapper, kernel} & set(keys(pch=False))


def test_kernel_flags_key_the_kernels_header_alone() -> None:
    """Projects whose kernels differ (scalar kernels, math flags that differ with the compiler's name) share the wrapper's
    prebuilt pieces; a different ISA baseline or a define the wrapper reads does not. Embedded and external weights
    share the kernels' header: only the wrapper reads where the weights are."""
    vectorized = ["-DCPU_CAPABILITY_AVX512", "-DUSE_MMAP_EXTERNAL", "-fexcess-precision=fast", "-march=native", "-mfma"]
    scalar = ["-DUSE_MMAP_EXTERNAL", "-ffp-contract=off", "-march=native"]
    portable = ["-DUSE_MMAP_EXTERNAL", "-march=x86-64"]
    embedded = ["-DCPU_CAPABILITY_AVX512", "-fexcess-precision=fast", "-march=native", "-mfma"]

    def keys(args: list[str]) -> tuple[str, str]:
        return prebuilt.entry_keys("toolchain", "cpu", args, Flags(), b"interface")

    assert wrapper_compile_args(vectorized) == ["-DUSE_MMAP_EXTERNAL", "-march=native"] == wrapper_compile_args(scalar)
    assert keys(vectorized)[0] == keys(scalar)[0] and keys(vectorized)[1] != keys(scalar)[1]
    assert len({keys(args)[0] for args in (vectorized, portable, embedded)}) == 3
    assert keys(embedded)[1] == keys(vectorized)[1] and kernel_compile_args(vectorized) == embedded
