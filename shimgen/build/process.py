"""The one way shimgen runs another program: its output captured (stdout and stderr interleaved, as
a terminal would show them), optionally streamed line by line and kept whole in a log file; the
caller judges the exit status."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# A process ended by one of these was stopped from outside; its failure says nothing about its input.
INTERRUPTING_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGHUP}


@dataclass(frozen=True)
class Completed:
    command: tuple[str, ...]
    returncode: int
    output: str
    log: Path | None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def signal(self) -> int | None:
        """The signal that ended the process, if one did."""
        return -self.returncode if self.returncode < 0 else None

    @property
    def interrupted(self) -> bool:
        return self.signal in INTERRUPTING_SIGNALS

    def tail(self, lines: int) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])


def run(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Completed:
    """Run `command` to completion. A program that cannot be started at all reads as exit status 127."""
    proc = _popen(command, env, cwd)
    if isinstance(proc, str):
        output, returncode = proc, 127
    else:
        lines: list[str] = []
        with proc:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    lines.append(line)
                    if on_line is not None:
                        on_line(line.rstrip("\n"))
            except BaseException:
                # Interrupted (Ctrl-C reaches the program's group too): it ends before the build lets go of its locks,
                # or its compilers could still write or delete outputs under the next build (Popen waits 0.25 s).
                _end(proc)
                raise
            returncode = proc.wait()
        output = "".join(lines)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(command)}\n{output}")
    return Completed(tuple(command), returncode, output, log)


def _end(proc: subprocess.Popen[str], grace: float = 30.0) -> None:
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _popen(
    command: Sequence[str], env: Mapping[str, str] | None, cwd: Path | None = None, stdin: int | None = None
) -> subprocess.Popen[str] | str:
    """`command` started, its output and errors captured together as text; where it cannot be started, why."""
    try:
        return subprocess.Popen(
            list(command),
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        return f"{command[0]}: {exc.strerror or exc}\n"


@dataclass(frozen=True)
class Started:
    """A program started by `start`; `finish` hands it its input and waits for it."""

    command: tuple[str, ...]
    proc: subprocess.Popen[str] | str  # a str: why it could not be started

    def finish(self, stdin: str) -> Completed:
        """The program's end once it has read `stdin`; one that could not be started reads as exit status 127."""
        if isinstance(self.proc, str):
            return Completed(self.command, 127, self.proc, None)
        output, _ = self.proc.communicate(stdin)  # a program that ended without reading it is no error here
        return Completed(self.command, self.proc.returncode, output, None)


def start(command: Sequence[str], *, env: Mapping[str, str] | None = None) -> Started:
    """`command` started now, to run beside the caller's work until `Started.finish`."""
    return Started(tuple(command), _popen(command, env, stdin=subprocess.PIPE))


@dataclass(frozen=True)
class _Spare:
    pid: int
    request: int  # the pipe it reads its one request from
    modules: frozenset[str]  # what it has imported
    parent: int  # the process that forked it: only it can hand it work and wait for it


_spare: _Spare | None = None  # run_python's
_background_spare: _Spare | None = None  # start_in_spare's


def fork_spare_interpreter() -> None:
    """Fork two children that each later run one Python function in place of a new interpreter, one for `run_python`
    and one for `start_in_spare`. Called where this process is what a new interpreter would be once it has imported
    torch (a build server's child, before the build): a build then does not pay again for starting Python and
    importing torch to check its package. Nothing is forked from a process whose threads a fork keeps: a child forked
    after torch has run an op on OpenMP's threads hangs in its first parallel op (their pool is not forked)."""
    global _spare, _background_spare
    if threads_a_fork_keeps():
        return
    _spare = _fork_spare()
    _background_spare = _fork_spare(_spare)


# Threads that a fork keeps but that are safe to fork beside: jemalloc's background thread (pyarrow's allocator, which
# pandas and scikit-learn import), whose own fork handlers take its locks and start it again in the child.
_FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def threads_a_fork_keeps() -> list[str]:
    """The names of this process's other threads that run on while it forks, found by forking once. A fork first stops
    the pools that libraries start again on demand, such as OpenBLAS's (cores - 1 threads, started when numpy is
    imported, so whenever torch is); an OpenMP team or a Python thread stays, and a child forked beside it can hang
    in its first parallel op or find a lock held."""
    import threading
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python's warning about forking beside threads
        pid = os.fork()
    if pid == 0:  # pragma: no cover  (the probe child)
        os._exit(0)
    os.waitpid(pid, 0)
    try:
        tasks = [t for t in os.listdir("/proc/self/task") if int(t) != threading.get_native_id()]
    except OSError:
        return ["thread"] * (threading.active_count() - 1)
    names = []
    for task in tasks:
        try:
            name = Path("/proc/self/task", task, "comm").read_text().strip()
        except OSError:
            continue  # it ended meanwhile
        if name not in _FORK_SAFE_THREADS:
            names.append(name)
    return sorted(names)


def _fork_spare(other: _Spare | None = None) -> _Spare:
    read, write = os.pipe()
    modules = frozenset(sys.modules)
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the spare; run_python's callers test what it runs)
        os.close(write)
        if other is not None:  # else its request would never end while this one lives
            os.close(other.request)
        os._exit(_serve_one_request(read))
    os.close(read)
    return _Spare(pid, write, modules, os.getpid())


def _send(spare: _Spare, request: dict[str, object]) -> None:
    data = memoryview(json.dumps(request).encode())
    try:
        while data:
            data = data[os.write(spare.request, data) :]
    finally:
        os.close(spare.request)


def _usable(spare: _Spare | None, fresh: Sequence[str]) -> _Spare | None:
    """`spare` where it has not imported the `fresh` modules; else None, and it is let go. None in a process forked
    after the spare (a build worker), whose parent's spare it is."""
    if spare is not None and spare.parent != os.getpid():
        return None
    if spare is not None and any(name.partition(".")[0] in spare.modules for name in fresh):
        os.close(spare.request)
        os.waitpid(spare.pid, 0)
        return None
    return spare


def _serve_one_request(pipe: int) -> int:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it goes with the build
    except (OSError, AttributeError):
        pass
    data = b""
    while chunk := os.read(pipe, 1 << 16):
        data += chunk
    if not data:  # the build ended without needing it
        return 0
    request = json.loads(data)
    if "niceness" in request:  # start_in_spare's
        os.setpgid(0, 0)
        os.nice(request["niceness"])
    output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd in (1, 2):
        os.dup2(output, fd)
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    module, _, function = request["function"].partition(":")
    code = 1
    try:
        code = getattr(importlib.import_module(module), function)(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  (a traceback, as a new interpreter would print it)
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def run_python(
    function: str, argv: Sequence[str], *, fresh: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Completed:
    """`module:function`(argv) in a new interpreter of this Python, its return value the exit status; run in the
    spare interpreter where there is one that has not imported the `fresh` modules (they must be imported anew); with
    this process's environment and `env`."""
    global _spare
    environment = {**os.environ, **(env or {})}
    spare, _spare = _usable(_spare, fresh), None
    if spare is None:
        return run(python_command(function, argv), env=environment)
    with tempfile.NamedTemporaryFile(prefix="shimgen-spare-", suffix=".log") as output:
        _send(
            spare,
            {"function": function, "argv": list(argv), "output": output.name, "env": environment, "cwd": os.getcwd()},
        )
        _, status = os.waitpid(spare.pid, 0)
        return Completed(
            ("spare interpreter", function, *argv),
            os.waitstatus_to_exitcode(status),
            Path(output.name).read_text(errors="replace"),
            None,
        )


def start_python(function: str, argv: Sequence[str], niceness: int) -> subprocess.Popen[bytes]:
    """`module:function`(argv) started in a new interpreter of this Python at lower priority, in a process group of its
    own (os.killpg stops it and what it runs), its output discarded: work a caller may take over or do again. It stays
    in this session: Linux's autogroup scheduling shares the CPU equally between sessions, whatever their niceness."""
    return subprocess.Popen(
        python_command(function, argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: _lower(niceness),  # noqa: PLW1509  (system calls between fork and exec, no lock taken)
    )


@dataclass
class Background:
    """A Python function running in another interpreter, in a process group of its own (`start_in_spare`)."""

    pid: int
    popen: subprocess.Popen[bytes] | None  # None: a spare, this process's child
    status: int | None = None

    def wait(self) -> int:
        """Its exit status, once it has ended."""
        if self.status is None:
            self.status = self.popen.wait() if self.popen else os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.status

    def stop(self) -> None:
        """Killed, with what it started, unless it has ended."""
        if self.status is None and (self.popen is None or self.popen.poll() is None):
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # a spare not yet in its own group
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.wait()


def start_in_spare(function: str, argv: Sequence[str], niceness: int, fresh: Sequence[str] = ()) -> Background:
    """`module:function`(argv) started at lower priority in the spare interpreter kept for it, where it has not
    imported the `fresh` modules, else in a new interpreter (`start_python`); its output discarded."""
    global _background_spare
    spare, _background_spare = _usable(_background_spare, fresh), None
    if spare is None:
        started = start_python(function, argv, niceness)
        return Background(started.pid, started)
    request = {"function": function, "argv": list(argv), "output": os.devnull, "env": dict(os.environ)}
    _send(spare, {**request, "cwd": os.getcwd(), "niceness": niceness})
    return Background(spare.pid, None)


def _lower(niceness: int) -> None:
    os.setpgid(0, 0)  # Popen's process_group, which Python 3.10 lacks
    os.nice(niceness)


def python_command(function: str, argv: Sequence[str]) -> list[str]:
    """A new interpreter of this Python running `module:function`(argv) of this shimgen, whatever the working
    directory holds (`python -m` would import a `shimgen` directory there first)."""
    module, _, name = function.partition(":")
    root = str(Path(__file__).parents[2])  # this shimgen, on sys.path only while its module is imported
    script = (
        f"import sys; sys.path.insert(0, {root!r}); import {module} as m; sys.path.remove({root!r}); "
        f"sys.exit(m.{name}(sys.argv[1:]))"
    )
    return [sys.executable, "-c", script, *argv]
