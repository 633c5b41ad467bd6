"""The per-user cache's built entries: the prebuilt pieces (prebuilt.py) and the runtime libraries (runtime_lib.py).

Each entry is a folder named by its key, with two files beside it: `<key>.lock`, held while the entry is made, and
`<key>.use`, held shared by every build that compiles against the entry; its time is when a build last used it. Keys
hold the toolchain (the venv's Python among it), the flags and shimgen's version, so entries pile up as those change, a
few hundred MB each (mostly precompiled headers). After an entry is made, the least recently used ones are removed until
the entries fit in the limit, skipping any that a build holds."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from shimgen.errors import UserError
from shimgen.files import LockHeld, exclusive, exclusive_if_free
from shimgen.toolchain import cache_dir

LIMIT_ENV = "SHIMGEN_CACHE_LIMIT"
DEFAULT_LIMIT = 4 << 30
KINDS = ("prebuilt", "runtime")
_STAGING = ".new"
_REMOVING = ".removing"


def location(kind: str, key: str) -> Path:
    return _folder(kind) / key


def _folder(kind: str) -> Path:
    return cache_dir().parent / kind


def limit() -> int | None:
    """The entries' size limit in bytes: $SHIMGEN_CACHE_LIMIT (a number of bytes, or with a K, M or G suffix; 0 for
    none), else DEFAULT_LIMIT. None: no limit."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_LIMIT
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)i?B?", text, re.IGNORECASE)
    if match is None:
        raise UserError(f"${LIMIT_ENV}={text!r} is not a size: write bytes, or a number with K, M or G (0: no limit)")
    size = int(float(match[1]) * (1 << (10 * " KMG".index(match[2].upper() or " "))))
    return size or None


def ensure(
    root: Path, make: Callable[[Path], None], held: ExitStack | None, waiting: Callable[[LockHeld], None] | None
) -> None:
    """The entry at `root`, made by `make(staging)` where it is missing, then held until `held` closes (None: not held,
    for a warm-up that only makes it). Making one removes the least recently used entries beyond the limit."""
    made = False
    with exclusive(beside(root, ".lock"), waiting):
        if not (root / "done").is_file():
            shutil.rmtree(root, ignore_errors=True)  # what an interrupted build left
            staging = beside(root, _STAGING)
            shutil.rmtree(staging, ignore_errors=True)
            make(staging)
            (staging / "done").write_text("")
            staging.replace(root)
            made = True
        # Held before the making lock is let go: a removal takes that lock first, so it never sees the entry unheld.
        if held is not None:
            held.enter_context(_in_use(root))
    if made:
        prune(limit())


@dataclass(frozen=True)
class Entry:
    root: Path
    size: int
    last_used: float


def listed() -> list[Entry]:
    """The cache's entries, least recently used first."""
    entries = []
    for kind in KINDS:
        folder = _folder(kind)
        for root in folder.iterdir() if folder.is_dir() else ():
            if root.is_dir() and "." not in root.name:
                use = beside(root, ".use")
                last_used = (use if use.exists() else root).stat().st_mtime
                entries.append(Entry(root, _size(root), last_used))
    return sorted(entries, key=lambda e: e.last_used)


def prune(size_limit: int | None) -> list[Entry]:
    """Remove the least recently used entries until the rest fit in `size_limit`, and what interrupted builds left;
    entries being made or used are kept. Returns the entries removed."""
    _remove_abandoned()
    entries = listed()
    total = sum(e.size for e in entries)
    removed = []
    for entry in entries:
        if size_limit is None or total <= size_limit:
            break
        if _remove_unheld(entry.root):
            total -= entry.size
            removed.append(entry)
    return removed


@contextmanager
def _in_use(root: Path) -> Iterator[None]:
    use = beside(root, ".use")
    with open(use, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        os.utime(use)
        yield


def _remove_unheld(root: Path) -> bool:
    """Remove `root` unless a build is making or using it."""
    with ExitStack() as stack:
        if not all(stack.enter_context(exclusive_if_free(beside(root, suffix))) for suffix in (".lock", ".use")):
            return False
        # Renamed first: an entry half removed must not look like one to use. The lock files stay (empty): one
        # unlinked while another process waits on it would let two hold "the" lock at once.
        doomed = beside(root, _REMOVING)
        if root.exists():
            root.replace(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return True


def _remove_abandoned() -> None:
    """The staging folders of interrupted builds and the remains of interrupted removals."""
    for kind in KINDS:
        folder = _folder(kind)
        for suffix in (_STAGING, _REMOVING):
            for path in folder.glob(f"*{suffix}") if folder.is_dir() else ():
                with exclusive_if_free(beside(path.with_name(path.name.removesuffix(suffix)), ".lock")) as free:
                    if free:  # else it is being made now
                        shutil.rmtree(path, ignore_errors=True)


def beside(root: Path, suffix: str) -> Path:
    """A file beside the entry at `root`: its lock (".lock"), its users' lock (".use"), or a caller's marker."""
    return root.with_name(root.name + suffix)


def being_made(root: Path) -> bool:
    """Whether another process is making the entry at `root` now (it holds the making lock)."""
    with exclusive_if_free(beside(root, ".lock")) as free:
        return not free


def _size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total
