"""A build cache shared across machines: traced programs, generated code and wheels, by keys that hold no paths of
the machine (so a second machine, with an empty HOME and other directories, finds what the first stored).

Configured per machine, not per spec: `--cache URL` or $SHIMGEN_SHARED_CACHE, where URL is `redis://host:port[/db]`
(a Redis server; shimgen speaks its protocol itself, no client library) or a directory (`file:///path` or a path).
Entries are written whole: a reader never sees half an entry. An unreachable server is reported once and the build
goes on without it: a cache never fails a build.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlparse

from shimgen.errors import UserError
from shimgen.results import from_json, to_json

R = TypeVar("R")

ENV = "SHIMGEN_SHARED_CACHE"
NAMESPACE = "shimgen:v1:"


class Backend(Protocol):
    url: str

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes) -> None: ...


class Directory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"file://{path}"

    def _file(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.path / digest[:2] / digest

    def get(self, key: str) -> bytes | None:
        try:
            return self._file(key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        final = self._file(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(final)


class Redis:
    """GET and SET over the Redis protocol (RESP2), one connection per call."""

    def __init__(self, url: str, host: str, port: int, db: int, password: str | None) -> None:
        self.url, self.host, self.port, self.db, self.password = url, host, port, db, password

    def _call(self, *commands: list[bytes]) -> list[bytes | None]:
        with socket.create_connection((self.host, self.port), timeout=30) as sock:
            stream = sock.makefile("rwb")
            prelude = ([[b"AUTH", self.password.encode()]] if self.password else []) + (
                [[b"SELECT", str(self.db).encode()]] if self.db else []
            )
            for command in (*prelude, *commands):
                stream.write(
                    b"*%d\r\n" % len(command) + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in command)
                )
            stream.flush()
            replies = [_reply(stream) for _ in (*prelude, *commands)]
            return replies[len(prelude) :]

    def get(self, key: str) -> bytes | None:
        return self._call([b"GET", (NAMESPACE + key).encode()])[0]

    def put(self, key: str, data: bytes) -> None:
        self._call([b"SET", (NAMESPACE + key).encode(), data])


def _reply(stream: io.BufferedRWPair) -> bytes | None:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("the server closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise ConnectionError(rest.decode(errors="replace"))
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = stream.read(size + 2)
        return data[:-2]
    return rest  # +OK, :integer


def backend(url: str) -> Backend:
    """The backend a `--cache` URL names; a clear error for one it cannot name."""
    parsed = urlparse(url)
    if parsed.scheme == "redis":
        try:
            db = int(parsed.path.strip("/") or 0)
            return Redis(
                url,
                parsed.hostname or "localhost",
                parsed.port or 6379,
                db,
                unquote(parsed.password) if parsed.password else None,
            )
        except ValueError:
            raise UserError(
                f"--cache {url}: a Redis URL is redis://[:password@]host[:port][/db], the db a number"
            ) from None
    if parsed.scheme == "file":
        return Directory(Path(unquote(parsed.path)))
    if parsed.scheme == "" and url:
        return Directory(Path(url).absolute())
    raise UserError(f"--cache {url}: use redis://host:port[/db], file:///path or a directory path")


def configured(url: str | None) -> str | None:
    return url or os.environ.get(ENV) or None


def ccache_remote(backend: Backend) -> str:
    """The same place as ccache's remote storage (its C++ objects beside shimgen's entries)."""
    if isinstance(backend, Redis):
        auth = f":{backend.password}@" if backend.password else ""
        return f"redis://{auth}{backend.host}:{backend.port}" + (f"/{backend.db}" if backend.db else "")
    assert isinstance(backend, Directory)
    return f"file:{backend.path / 'ccache'}"


@dataclass
class SharedCache:
    """A backend with what this build did with it, for the summary; errors turn it off for the rest of the build."""

    backend: Backend
    hits: list[str] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)
    error: str | None = None

    def get(self, kind: str, key: str) -> bytes | None:
        if self.error:
            return None
        try:
            data = self.backend.get(f"{kind}:{key}")
        except OSError as exc:
            self.error = f"{self.backend.url}: {exc}"
            return None
        if data is not None:
            self.hits.append(kind)
        return data

    def put(self, kind: str, key: str, data: bytes) -> None:
        if self.error:
            return
        try:
            self.backend.put(f"{kind}:{key}", data)
            self.stored.append(kind)
        except OSError as exc:
            self.error = f"{self.backend.url}: {exc}"


def pack(root: Path, files: list[Path], meta: bytes) -> bytes:
    """`files` (under `root`) and `meta` in one archive, deterministic."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(zipfile.ZipInfo("meta.json", (1980, 1, 1, 0, 0, 0)), meta)
        for path in sorted(files):
            zf.writestr(
                zipfile.ZipInfo(f"files/{path.relative_to(root).as_posix()}", (1980, 1, 1, 0, 0, 0)), path.read_bytes()
            )
    return buffer.getvalue()


def unpack(data: bytes, root: Path) -> bytes:
    """Write an archive's files under `root`; its meta."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for name in zf.namelist():
            if name.startswith("files/"):
                target = root / name[len("files/") :]
                if not target.resolve().is_relative_to(root.resolve()):
                    raise ValueError(f"an entry outside its directory: {name}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
        return zf.read("meta.json")


def store(cache: SharedCache, kind: str, key: str, result: Any, roots: dict[str, Path]) -> None:
    """Put a stage's result and its files (all under roots["ROOT"]) in the cache, its paths made relative to `roots`."""
    files = [p for p in result.files if p.is_file()]
    meta = json.dumps(relocate(to_json(result), {str(path): f"${name}" for name, path in roots.items()})).encode()
    cache.put(kind, key, pack(roots["ROOT"], files, meta))


def fetch(cache: SharedCache, kind: str, key: str, cls: type[R], roots: dict[str, Path]) -> R | None:
    """A result `store`d under `key`, its files written under roots["ROOT"] (each replaced whole), its paths under `roots`."""
    data = cache.get(kind, key)
    if data is None:
        return None
    root = roots["ROOT"]
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.shared-", dir=root.parent))
    try:
        meta = unpack(data, staging)
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            final = root / path.relative_to(staging)
            final.parent.mkdir(parents=True, exist_ok=True)
            path.replace(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return from_json(cls, relocate(json.loads(meta), {f"${name}": str(path) for name, path in roots.items()}))


def relocate(value: Any, prefixes: dict[str, str]) -> Any:
    """Strings that start with a key of `prefixes` (followed by / or alone) rewritten to start with its value."""
    if isinstance(value, dict):
        return {k: relocate(v, prefixes) for k, v in value.items()}
    if isinstance(value, list):
        return [relocate(v, prefixes) for v in value]
    if isinstance(value, str):
        for old, new in sorted(prefixes.items(), key=lambda kv: -len(kv[0])):
            if value == old or value.startswith(old + "/"):
                return new + value[len(old) :]
    return value
