"""Atomic file updates: a failed or interrupted stage never leaves a half-written output."""

from __future__ import annotations

import shutil
from pathlib import Path


def write_if_changed(path: Path, content: str | bytes) -> bool:
    """Write only new content (ninja then rebuilds only what really changed); atomic by rename."""
    data = content.encode() if isinstance(content, str) else content
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
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
