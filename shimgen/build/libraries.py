"""Libraries a build's trace imported from site-packages (transformers, timm, ...), which the build server imports after
the build so that the next build's children have them already (3 s of a MiniLM trace on 2 cores).

A trace notes them in the file named by $SHIMGEN_SERVER_IMPORTS (set in a server's child). The server imports them
where that leaves it safe to fork (no thread started that a fork keeps, CUDA's driver not asked), and keeps the
modification time of every file it imported: a library changed since (a `pip install`) makes the server step down,
so that no build sees a stale module. Project code is never imported ahead: only modules whose file is in a
site-packages directory."""

from __future__ import annotations

import importlib
import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

IMPORTS_ENV = "SHIMGEN_SERVER_IMPORTS"
# Imported by the server on its own terms (internals.import_build_modules, kept safe to fork): the parts of torch and
# its compilers that a trace imports lazily may ask the device's driver, which a forked child could not use.
SERVER_OWNED = ("torch", "triton", "functorch", "torchgen", "shimgen")


def site_dirs() -> tuple[str, ...]:
    """This interpreter's site-packages directories, each as given and resolved, with a trailing separator."""
    paths = sysconfig.get_paths()
    dirs = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return tuple({os.path.join(form, "") for d in dirs for form in (d, os.path.realpath(d))})


def imported_since(before: Iterable[str]) -> list[tuple[str, str]]:
    """(name, file) of the modules imported since `before` (names in sys.modules) whose files are in site-packages, in
    import order, but for the server's own (SERVER_OWNED)."""
    dirs, seen = site_dirs(), set(before)
    found = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        owned = name.split(".")[0] in SERVER_OWNED
        if (
            name not in seen
            and not owned
            and isinstance(file, str)
            and file.startswith(dirs)
            and "\t" not in name + file
        ):
            found.append((name, file))
    return found


def note(before: Iterable[str]) -> None:
    """Add what was imported since `before` to the server's list, where this process is a server's child."""
    path = os.environ.get(IMPORTS_ENV)
    found = imported_since(before) if path else []
    if path and found:
        with open(path, "a") as noted:  # one write: children that end together do not interleave lines
            noted.write("".join(f"{name}\t{file}\n" for name, file in found))


def take_noted(path: Path) -> list[tuple[str, str]]:
    """The (name, file) pairs noted in `path` since it was last taken, each once."""
    try:
        taken = path.with_name(path.name + ".taken")
        path.replace(taken)
        lines = taken.read_text().splitlines()
        taken.unlink()
    except OSError:
        return []
    pairs = (tuple(line.split("\t")) for line in lines)
    return list(dict.fromkeys((p[0], p[1]) for p in pairs if len(p) == 2))


def import_ahead(noted: Iterable[tuple[str, str]], refused: set[str]) -> tuple[list[str], dict[str, int]]:
    """Import the `noted` modules not yet imported, in order, each only where its name still finds the file it was
    noted with, and none of a package in `refused`: (the names that failed to import, the modification times of the
    files of every module this imported)."""
    before = set(sys.modules)
    failed = []
    for name, file in noted:
        if name in sys.modules or name.split(".")[0] in refused:
            continue
        try:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin != file:
                continue  # an alias, or a module made at run time: importing it by name would make another
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001  (a library's import failing here is only a missed speed-up)
            failed.append(name)
    return failed, files_of(n for n in sys.modules if n not in before)


def files_of(names: Iterable[str]) -> dict[str, int]:
    files = {}
    for name in names:
        file = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(file, str):
            try:
                files[file] = os.stat(file).st_mtime_ns
            except OSError:
                pass
    return files


def changed(files: dict[str, int]) -> str | None:
    """A file of `files` modified or removed since its time was taken, else None."""
    for file, mtime in files.items():
        try:
            if os.stat(file).st_mtime_ns != mtime:
                return file
        except OSError:
            return file
    return None


class _RecordingEnviron(os._Environ[str]):
    """os.environ, over the same variables, noting each name read (`ALL` where all were)."""

    def __init__(self, real: os._Environ[str], read: set[str]) -> None:
        super().__init__(real._data, real.encodekey, real.decodekey, real.encodevalue, real.decodevalue)  # type: ignore[attr-defined]
        self.read = read

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[str]:
        self.read.add(ALL)
        return super().__iter__()


ALL = "\0all"  # read_env's name for "every variable": a library that copied or walked the environment


@contextmanager
def reading_env() -> Iterator[set[str]]:
    """The names of the environment variables read in the block (os.environ and os.getenv)."""
    real, read = os.environ, set[str]()
    os.environ = _RecordingEnviron(real, read)  # noqa: B003  (the same variables, read through a recorder)
    try:
        yield read
    finally:
        os.environ = real  # noqa: B003


def env_differs(read: dict[str, str | None], env: dict[str, str]) -> str | None:
    """A variable read while libraries were imported ahead (name -> its value then) whose value in `env` differs."""
    if ALL in read:
        ignored = {"PWD", "OLDPWD", "SHLVL", "_"}
        now = {k: v for k, v in env.items() if k not in ignored}
        then = {k: v for k, v in read.items() if k not in ignored and k != ALL and v is not None}
        return next((k for k in sorted(now.keys() | then.keys()) if now.get(k) != then.get(k)), None)
    return next((k for k, v in read.items() if env.get(k) != v), None)
