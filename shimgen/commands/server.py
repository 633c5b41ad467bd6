"""The build server: a per-user process that imports torch, Inductor and shimgen once and runs each `shimgen build`
and `shimgen check` handed to it in a child forked from that state, so that an edit-rebuild loop does not pay Python's
and torch's start-up (3-6 s on 2 cores) at every build.

The server itself never builds: it holds only imported modules (no thread of its own, no OpenMP team, no CUDA
driver asked anything), so each child starts as a fresh `shimgen build` would, less the imports, and imports the project's own
modules itself (an edited model is always seen). A child runs with the client's arguments, working directory,
environment and standard streams (passed over the socket), and its exit status is the client's. The build's own
locks are the same; the server adds none. What every build would otherwise redo, the server does once before it forks
them: it compiles shimgen's templates, resolves its modules' real paths and freezes its heap (`_freeze_heap`).

One server per user, Python, torch, shimgen and import-time environment (`server_key`), started on demand by the
first build that finds none, stopped after `SHIMGEN_SERVER_IDLE` seconds (default 600) without a build. The server
holds `<key>.lock` while it lives, so that two clients starting one at once leave one, and listens on `<key>.sock`,
both in `$TMPDIR/shimgen-<uid>/` (`server_dir`); a server that died leaves a socket nobody answers, and
its client builds in its own process. Where importing Inductor has asked the CUDA driver anything, no child could use
CUDA: the server then refuses (`<key>.refused`) and builds run in their own process. `SHIMGEN_SERVER=off` builds
in-process always.

After a build, the server imports the site-packages libraries its trace imported (shimgen/build/libraries.py), so
that the next build's children have them. Where one of their files has changed since, or a client's environment
differs in a variable they read while imported, the server steps down and the client starts a new one.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.metadata
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import cast

from shimgen.build import libraries, process
from shimgen.files import exclusive_if_free, shimgen_fingerprint
from shimgen.inductor import internals

IDLE_SECONDS = 600.0
START_SECONDS = 120.0  # a server not answering by then is given up on; the client builds in its own process
# Variables read while torch, Inductor or Triton are imported (their configs take TORCHINDUCTOR_* then): a server
# imported under other values serves no build. Cache directories are read at each use, not at import.
_IMPORT_ENV = ("TORCH", "PYTORCH", "TRITON", "CUDA", "NVIDIA", "OMP_", "MKL_", "KMP_", "LD_", "PYTHON")
_SOCKET_LIMIT = 100  # sun_path holds 108 bytes
_STEPPED_DOWN = -1  # the status a server that steps down answers with: the client starts a new one


def server_key(env: dict[str, str]) -> str:
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = ""
    imported_under = sorted((k, v) for k, v in env.items() if k.startswith(_IMPORT_ENV) and not k.endswith("CACHE_DIR"))
    from shimgen.toolchain import cache_dir

    text = json.dumps(
        [str(cache_dir()), sys.executable, sys.version, torch_version, shimgen_fingerprint(), imported_under]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def server_dir() -> Path | None:
    """This user's servers' sockets, locks and logs: `$TMPDIR/shimgen-<uid>/` (mode 0700, checked), a short path since
    a socket's holds 108 bytes, and no part of the per-user cache; None where there is no such place."""
    directory = Path(tempfile.gettempdir()) / f"shimgen-{os.getuid()}"
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        info = directory.stat()
    except OSError:
        return None
    return directory if info.st_uid == os.getuid() and not info.st_mode & 0o077 else None


def hand_over(argv: list[str], again: bool = True) -> int | None:
    """Run `shimgen <argv>` in this user's build server (started if there is none) and return its exit status; None
    where no server can take it (then the caller builds in its own process)."""
    if os.environ.get("SHIMGEN_SERVER", "").lower() in ("off", "0", "no", "false") or os.environ.get(
        "SHIMGEN_SERVER_CHILD"
    ):
        return None
    directory = server_dir()
    if directory is None:
        return None
    base = directory / server_key(dict(os.environ))
    path = socket_path(base)
    if path is None or base.with_suffix(".refused").exists():
        return None
    conn = _connect(path) or _start(base, path)
    if conn is None:
        return None
    with conn:
        request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode(
            "utf-8", "surrogateescape"
        )
        try:
            socket.send_fds(conn, [struct.pack("<Q", len(request))], [0, 1, 2])
            conn.sendall(request)
            status = _receive_status(conn)
        except OSError:
            status = None
    if status == _STEPPED_DOWN:
        return hand_over(argv, again=False) if again else None
    if status is not None and status > 128 and status != 130:
        print(f"shimgen: the build crashed with signal {status - 128}", file=sys.stderr)
    return status


def socket_path(base: Path) -> Path | None:
    path = base.with_suffix(".sock")
    return path if len(os.fsencode(path)) <= _SOCKET_LIMIT else None


def _receive_status(conn: socket.socket) -> int | None:
    """The child's exit status; Ctrl-C or SIGTERM here closes the connection, which interrupts the child."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        data = b""
        while len(data) < 4:
            chunk = conn.recv(4 - len(data))
            if not chunk:
                return None  # the server went away before the child ended
            data += chunk
        return int(struct.unpack("<i", data)[0])
    except KeyboardInterrupt:
        conn.close()
        print("shimgen: interrupted; previous outputs are left as they were", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    return conn


def _start(base: Path, path: Path) -> socket.socket | None:
    with open(base.with_suffix(".log"), "ab") as log:
        server = subprocess.Popen(
            process.python_command("shimgen.commands.server:main", [str(base)]),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # not in the terminal's process group: a Ctrl-C of this build leaves it
        )
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        conn = _connect(path)
        if conn is not None:
            return conn
        if server.poll() is not None:  # it refused to serve, or another client's server holds the lock
            conn = _connect(path)
            if conn is not None or not _held(base.with_suffix(".lock")):
                return conn
        time.sleep(0.05)
    return None


def _held(lock: Path) -> bool:
    with exclusive_if_free(lock) as free:
        return not free


def serve(base: Path) -> None:
    """Listen on `base`'s socket until idle; each request runs in a forked child."""
    import fcntl

    path = socket_path(base)
    if path is None:
        return
    lock = open(base.with_suffix(".lock"), "a")  # noqa: SIM115  (held while the server takes builds)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another server for this key is starting or running
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # the imports below must not ask the CUDA driver (fork_is_safe)
    internals.import_build_modules()
    import shimgen.commands.cli  # noqa: F401
    from shimgen.project import render
    from shimgen.trace import entry

    render.load_templates()
    entry.resolve_module_paths()
    _freeze_heap()

    if not internals.fork_is_safe():
        base.with_suffix(".refused").write_text(
            "importing torch and Inductor initialised CUDA's driver here; a child forked from it cannot use CUDA, so "
            "builds run in their own process\n"
        )
        return

    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    bound = path.stat().st_ino
    listener.listen(16)
    idle = float(os.environ.get("SHIMGEN_SERVER_IDLE", IDLE_SECONDS))
    ahead = _ImportedAhead(base)
    children: dict[int, socket.socket] = {}
    ended: dict[int, int] = {}  # child -> its pidfd, readable once it ended
    interrupted: set[int] = set()
    last = time.monotonic()
    serving = True

    def step_down(why: str) -> None:
        """Take no more builds, and let a new server start at once; the builds running go on."""
        nonlocal serving
        print(f"shimgen build server {os.getpid()} steps down: {why}", flush=True)
        serving = False
        if path.exists() and path.stat().st_ino == bound:
            path.unlink()
        listener.close()
        lock.close()

    try:
        while children or (serving and time.monotonic() - last < idle):
            waited = [*([listener] if serving else []), *children.values(), *ended.values()]
            readable, _, _ = select.select(waited, [], [], 0.2)
            for conn in readable:
                if isinstance(conn, int):
                    continue  # a child ended: waited for below
                if conn is listener:
                    received = _receive(listener)
                    if received is None:
                        continue
                    why = ahead.unusable_for(cast(dict[str, str], received[1]["env"]))
                    if why is not None:
                        _answer(received[0], _STEPPED_DOWN)
                        for fd in received[2]:
                            os.close(fd)
                        step_down(why)
                        continue
                    own = [lock.fileno(), listener.fileno(), *(c.fileno() for c in children.values()), *ended.values()]
                    pid = _fork_child(*received, ahead.child_env(), own)
                    children[pid] = received[0]
                    try:
                        ended[pid] = os.pidfd_open(pid)
                    except OSError:  # a kernel before Linux 5.3: the select's timeout finds it ended
                        pass
                else:  # a client closed its end (Ctrl-C, killed) before its child ended: the build is interrupted
                    pid = next(p for p, c in children.items() if c is conn)
                    if pid not in interrupted:
                        interrupted.add(pid)
                        _signal(pid, signal.SIGINT)
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    conn = children.pop(pid)
                    if pid in ended:
                        os.close(ended.pop(pid))
                    interrupted.discard(pid)
                    code = os.waitstatus_to_exitcode(status)
                    _answer(conn, code if code >= 0 else 128 - code)
                    last = time.monotonic()
            if serving and not children and ahead.noted():
                unsafe = ahead.import_noted()
                if unsafe is not None:
                    step_down(unsafe)
                entry.resolve_module_paths()
                _freeze_heap()
    finally:
        if serving:
            step_down("idle")


def _freeze_heap() -> None:
    """Put what the server holds in the garbage collector's permanent generation: a forked build's collections then
    skip it instead of walking it and copying every page whose object headers they touch (0.25 s of a MiniLM trace)."""
    gc.collect()
    gc.freeze()


class _ImportedAhead:
    """The libraries this server imported for its builds' children (shimgen/build/libraries.py)."""

    def __init__(self, base: Path) -> None:
        self.noted_file = base.with_suffix(".imports")
        self.unsafe_file = base.with_suffix(".unsafe-imports")  # libraries never to import ahead again, by name
        self.files: dict[str, int] = {}  # file -> modification time, of every module imported ahead
        self.read_env: dict[str, str | None] = {}  # variable -> value before the import, of those it read
        self.set_env: dict[str, str] = {}  # variables the imports set, as a fresh import would set them in the child

    def child_env(self) -> dict[str, str]:
        return {**self.set_env, libraries.IMPORTS_ENV: str(self.noted_file)}

    def noted(self) -> bool:
        return self.noted_file.exists()

    def unusable_for(self, env: dict[str, str]) -> str | None:
        """Why a build with `env` cannot run in a child of this server, if it cannot."""
        changed = libraries.changed(self.files)
        if changed is not None:
            return f"{changed} changed since the server imported it"
        differs = libraries.env_differs(self.read_env, env)
        if differs is not None:
            return f"${differs} differs from its value when the server imported libraries"
        return None

    def import_noted(self) -> str | None:
        """Import what builds noted; why that made forking unsafe, if it did (those libraries are then refused)."""
        names = libraries.take_noted(self.noted_file)
        try:
            refused = set(self.unsafe_file.read_text().split())
        except OSError:
            refused = set()
        forkable, kept = internals.fork_is_safe(), Counter(process.threads_a_fork_keeps())
        own = {"PYTORCH_NVML_BASED_CUDA_CHECK"}  # set by the server itself, for its own imports
        before = {k: v for k, v in os.environ.items() if k not in own}
        with libraries.reading_env() as read:
            _, files = libraries.import_ahead(names, refused)
        self.files.update(files)
        if libraries.ALL in read:
            self.read_env = {libraries.ALL: None, **before}
        self.read_env.update({k: before.get(k) for k in read - own if k != libraries.ALL})
        self.set_env.update({k: v for k, v in os.environ.items() if k not in own and before.get(k) != v})
        started = Counter(process.threads_a_fork_keeps()) - kept
        if started:
            why = f"importing libraries ahead started a thread that a fork keeps ({', '.join(sorted(started))})"
        elif forkable and not internals.fork_is_safe():
            why = "importing libraries ahead initialised CUDA's driver"
        else:
            return None
        with open(self.unsafe_file, "a") as unsafe:
            unsafe.write("".join(f"{name}\n" for name in dict.fromkeys(name.split(".")[0] for name, _ in names)))
        return why


def _answer(conn: socket.socket, status: int) -> None:
    try:
        conn.sendall(struct.pack("<i", status))
    except OSError:
        pass
    conn.close()


def _receive(listener: socket.socket) -> tuple[socket.socket, dict[str, object], list[int]] | None:
    """The next request: (its connection, the request, the client's standard streams)."""
    conn, _ = listener.accept()
    conn.settimeout(10)
    try:
        header, fds, _, _ = socket.recv_fds(conn, 8, 3)
        (length,) = struct.unpack("<Q", header)
        data = b""
        while len(data) < length:
            chunk = conn.recv(min(1 << 20, length - len(data)))
            if not chunk:
                raise OSError("the client went away")
            data += chunk
        request = json.loads(data.decode("utf-8", "surrogateescape"))
        if len(fds) != 3 or not isinstance(request.get("env"), dict):
            raise OSError("no standard streams or environment passed")
    except (OSError, ValueError, struct.error):
        conn.close()
        return None
    conn.settimeout(None)
    return conn, request, fds


def _fork_child(
    conn: socket.socket, request: dict[str, object], fds: list[int], env: dict[str, str], servers: list[int]
) -> int:
    """Fork a child for `request`, with `env` added to the client's; `servers`, the server's own descriptors, are
    closed in the child."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child; its coverage is the build's)
        for fd in [conn.fileno(), *servers]:
            os.close(fd)
        os._exit(_run_child(request, fds, env))
    try:
        os.setpgid(pid, pid)  # also here, before any signal of the server's can reach the group
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    return pid


def _run_child(request: dict[str, object], fds: list[int], server_env: dict[str, str]) -> int:
    code = 3
    try:
        # A process group of its own, as a terminal gives a command: an interrupted build's SIGINT reaches ninja and the
        # compilers too. It is interrupted as well where the server dies under it (Linux's parent-death signal).
        os.setpgid(0, 0)
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        env, argv, cwd = request["env"], request["argv"], request["cwd"]
        assert isinstance(env, dict) and isinstance(argv, list) and isinstance(cwd, str)
        os.environ.clear()
        os.environ.update({**env, **server_env, "SHIMGEN_SERVER_CHILD": "1"})
        os.chdir(cwd)
        process.fork_spare_interpreter()
        sys.argv = ["shimgen", *argv]
        from shimgen.commands.cli import main

        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors and --help: the status a process would exit with
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001  (reported as main reports a bug; the server stays up)
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
    return code


def _signal(pid: int, sig: int) -> None:
    """`sig` to the build child `pid` and every process of its group."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    serve(Path(argv[0]))
    return 0
