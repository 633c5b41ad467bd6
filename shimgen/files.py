"""Atomic file updates, file locks and content keys: a failed or interrupted stage never leaves a
half-written output, builds that run at once never write the same files together, and a stage's
key changes exactly when what it depends on does."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


def stage_key(*parts: Any) -> str:
    """A hash of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def file_hash(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


@functools.cache
def shimgen_fingerprint() -> str:
    """Every file of shimgen's own (code, templates, runtime sources), by path and content: part of every key that
    depends on what shimgen does, so a changed shimgen never reuses what an older one made."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0".encode() + path.read_bytes())
    return digest.hexdigest()


def write_if_changed(path: Path, content: str | bytes) -> bool:
    """Write only new content (ninja then rebuilds only what really changed); atomic by rename."""
    data = content.encode() if isinstance(content, str) else content
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return True


def replace_dir(new: Path, final: Path) -> None:
    """Put directory `new` in the place of `final`, by renames."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.replace(old)
    new.replace(final)
    shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class LockHeld:
    """A lock that another process holds, as the holder wrote it into the lock file."""

    lock_file: Path
    pid: int | None  # None: a holder that wrote nothing in time

    def __str__(self) -> str:
        holder = f"shimgen process {self.pid}" if self.pid is not None else "another process"
        return f"waiting for {holder} (lock {self.lock_file})"


@contextmanager
def exclusive(lock_file: Path, waiting: Callable[[LockHeld], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` (created if needed) for the duration of the block.

    Another process that holds it is waited for; `waiting` is told who it is first. The OS drops
    the lock when its holder exits, so a killed build never leaves it held."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting(LockHeld(lock_file, _holder(handle)))
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.truncate(0)
        handle.write(f"{_HOLDER}{os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def exclusive_if_free(lock_file: Path) -> Iterator[bool]:
    """Hold an exclusive lock on `lock_file` (created if needed) for the block where no other process holds it; yields
    whether this one does."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


_HOLDER = "shimgen process "


def _holder(handle: IO[str]) -> int | None:
    """The pid a lock's holder wrote into its file; it writes just after taking the lock, so allow it a moment."""
    for _ in range(20):
        handle.seek(0)
        written = handle.read().strip()
        if written.startswith(_HOLDER) and written.removeprefix(_HOLDER).isdigit():
            return int(written.removeprefix(_HOLDER))
        time.sleep(0.05)
    return None
