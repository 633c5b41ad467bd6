"""Earlier builds' generated code, kept beside the last build's (<out>/build/<name>/history/): an edit that is undone
finds the code it had before here instead of generating it again.

Only the code is kept, by its structure key (the code key without the weights' values): the weights file is made
again from the traced program, as a weights-only edit makes it. So an entry is the sources Inductor wrote (a few
megabytes), whatever the model's size, unless the weights are embedded in the code. Each unit keeps its last KEEP
codes, in MAX_UNIT_BYTES at most.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import zipfile
from pathlib import Path

from shimgen.cache.shared_cache import pack, relocate, unpack
from shimgen.files import replace_dir
from shimgen.results import CodegenResult, from_json, to_json

KEEP = 8
MAX_UNIT_BYTES = 256 << 20  # weights embedded in the code make entries of the model's size


class History:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _entry(self, unit: str, structure_key: str) -> Path:
        return self.directory / unit / f"{hashlib.sha256(structure_key.encode()).hexdigest()[:32]}.zip"

    def keep(self, unit: str, code: CodegenResult, root: Path) -> None:
        """Keep `code`'s files under `root` (its codegen directory), all but its weights file, before they are
        replaced. Code without a structure key (its weights file being rewritten) is not kept."""
        if not code.structure_key:
            return
        files = [p for p in code.files if p != code.weights_file and p.is_file()]
        if not all(p.is_relative_to(root) for p in files) or sum(p.stat().st_size for p in files) > MAX_UNIT_BYTES:
            return
        meta = json.dumps(relocate(to_json(code), {str(root): "$ROOT"})).encode()
        entry = self._entry(unit, code.structure_key)
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
        partial.write_bytes(pack(root, files, meta))
        partial.replace(entry)
        _used(entry)
        kept, total = 0, 0
        for older in sorted(entry.parent.glob("*.zip"), key=lambda p: p.stat().st_mtime_ns, reverse=True):
            kept, total = kept + 1, total + older.stat().st_size
            if kept > KEEP or total > MAX_UNIT_BYTES:
                older.unlink(missing_ok=True)

    def find(self, unit: str, structure_key: str, root: Path) -> CodegenResult | None:
        """The code kept under `structure_key`, its paths under `root` (its codegen directory); None where none is."""
        try:
            with zipfile.ZipFile(self._entry(unit, structure_key)) as entry:
                meta = json.loads(entry.read("meta.json"))
            return from_json(CodegenResult, relocate(meta, {"$ROOT": str(root)}))
        except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):  # damaged, or another shimgen's
            return None

    def restore(self, unit: str, structure_key: str, root: Path) -> None:
        """The files of the code kept under `structure_key` in place of `root`'s (all but its weights file, which the
        caller makes)."""
        entry = self._entry(unit, structure_key)
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.history-", dir=root.parent))
        try:
            unpack(entry.read_bytes(), staging)
            replace_dir(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _used(entry)

    def forget_all_but(self, units: set[str]) -> None:
        """Drop the code of units not in `units` (graphs or targets that left the spec)."""
        if self.directory.is_dir():
            for kept in self.directory.iterdir():
                if kept.name not in units:
                    shutil.rmtree(kept, ignore_errors=True)


def _used(entry: Path) -> None:
    """`entry` marked the most recently used (pruned last), to the nanosecond: the file system's own times may tie."""
    now = time.time_ns()
    os.utime(entry, ns=(now, now))
