"""shimgen/build/process.py's Python children: the spare interpreter (a child forked early that runs one Python call
later, as a new interpreter would, where one has not imported what must be imported anew), worker processes and
background work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from shimgen.build import process

HELPER = """
import os, signal, sys

def echo(argv):
    print(" ".join(argv), os.environ.get("SHIMGEN_TEST_LATE"), os.getcwd(), "helper_imported_early" in sys.modules)
    return 3

def crash(argv):
    os.kill(os.getpid(), signal.SIGSEGV)
"""

SCRIPT = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from shimgen.build import process
if sys.argv[2] == "early":
    import helper_imported_early
process.fork_spare_interpreter()
import helper  # after the fork: the spare imports it when asked
os.environ["SHIMGEN_TEST_LATE"] = "set after the fork"
os.chdir(sys.argv[3])
ran = []
for function in sys.argv[4].split(","):
    done = process.run_python(function, ["a b", "c"], fresh=("helper_imported_early",))
    ran.append([done.command[0], done.returncode, done.output.strip()])
print(json.dumps(ran))
"""


def _run(tmp_path: Path, imported: str, *functions: str) -> list[list[object]]:
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "helper_imported_early.py").write_text("")
    (tmp_path / "cwd").mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(REPO), imported, str(tmp_path / "cwd"), ",".join(functions)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_spare_runs_the_first_call_with_the_callers_environment(tmp_path: Path) -> None:
    first, second = _run(tmp_path, "late", "helper:echo", "helper:echo")
    cwd = tmp_path / "cwd"
    assert first == ["spare interpreter", 3, f"a b c set after the fork {cwd} False"]
    assert second[1:] == [3, f"a b c set after the fork {cwd} False"], "then new interpreters"
    assert second[0] != "spare interpreter"


def test_a_crash_in_the_spare_reads_as_its_signal(tmp_path: Path) -> None:
    assert _run(tmp_path, "late", "helper:crash") == [["spare interpreter", -11, ""]]


def test_a_spare_that_imported_a_fresh_module_is_not_used(tmp_path: Path) -> None:
    (first,) = _run(tmp_path, "early", "helper:echo")
    assert first[0] != "spare interpreter" and first[1] == 3 and first[2].endswith("False")


IN_A_FORKED_CHILD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from shimgen.build import process
process.fork_spare_interpreter()
reader, writer = os.pipe()
if os.fork() == 0:  # a build worker forked from this process: its parent's spare is not its child
    done = process.run_python("helper:echo", ["in", "child"])
    os.write(writer, json.dumps([done.command[0], done.returncode]).encode())
    os._exit(0)
os.close(writer)
child = json.loads(os.read(reader, 1 << 16))
done = process.run_python("helper:echo", ["in", "parent"])
print(json.dumps([child, [done.command[0], done.returncode]]))
"""


def test_a_process_forked_after_the_spare_runs_python_in_a_new_interpreter(tmp_path: Path) -> None:
    """A worker forked from the build (a codegen that runs again in a new interpreter) inherits the build's spare, which
    it cannot wait for; its calls take new interpreters and leave the spare to the build."""
    (tmp_path / "helper.py").write_text(HELPER)
    child, parent = json.loads(_printed(tmp_path, IN_A_FORKED_CHILD))
    assert child[0] != "spare interpreter" and child[1] == 3
    assert parent == ["spare interpreter", 3]


PARALLEL_WORK = """
import torch

def parallel(task):
    torch.set_num_threads(2)
    return torch.ones(1 << 22).mul_(task).sum().item()

def main(argv):
    return int(parallel(float(argv[0])) == 3 * (1 << 22))
"""

AFTER_A_PARALLEL_REGION = """
import sys, threading, torch
sys.path.insert(0, sys.argv[1])
from shimgen.build import workers
import parallel_work
torch.set_num_threads(2)
torch.ones(1 << 22).mul_(2).sum()  # this process now has OpenMP's threads
results = []
workers.run_all([("a", 1.0), ("b", 2.0)], parallel_work.parallel, 2, None, lambda n, r, s, e: results.append(r), fork=True)
print(sorted(results))
"""


def test_workers_are_not_forked_from_a_process_with_threads(tmp_path: Path) -> None:
    """A process that has run an OpenMP parallel region has threads that a forked child lacks: the child's first
    parallel region would wait forever (a build server's child that traced a variant in itself, then forked its
    codegen). Such a process spawns its workers instead."""
    assert _after_a_parallel_region(tmp_path, AFTER_A_PARALLEL_REGION, 60) == ["[4194304.0,", "8388608.0]"]


def _after_a_parallel_region(tmp_path: Path, script: str, timeout: int) -> list[str]:
    """The words `script` printed, run in a new interpreter with parallel_work importable."""
    (tmp_path / "parallel_work.py").write_text(PARALLEL_WORK)
    return _printed(tmp_path, script, timeout).split()


def _printed(tmp_path: Path, script: str, timeout: int | None = None) -> str:
    """What `script` printed, run in a new interpreter with the repository as its argument and tmp_path importable."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(REPO)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


SPARE_AFTER_A_PARALLEL_REGION = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from shimgen.build import process
torch.set_num_threads(2)
torch.ones(1 << 22).mul_(2).sum()  # this process now has OpenMP's threads
process.fork_spare_interpreter()
done = process.run_python("parallel_work:main", ["3"])
print(done.command[0], done.returncode)
"""


def test_no_spare_is_forked_from_a_process_with_threads(tmp_path: Path) -> None:
    """A caller that has run torch ops before building in its own process (a notebook, a benchmark): a spare forked then
    would wait forever in its first parallel op. The package check runs in a new interpreter instead."""
    command, status = _after_a_parallel_region(tmp_path, SPARE_AFTER_A_PARALLEL_REGION, 120)
    assert command != "spare interpreter" and status == "1"


SPARE_BESIDE_A_BLAS_POOL = """
import os, sys, torch  # torch imports numpy, whose OpenBLAS starts a pool of threads at once
sys.path.insert(0, sys.argv[1])
from shimgen.build import process
threads = len(os.listdir("/proc/self/task"))
process.fork_spare_interpreter()
done = process.run_python("parallel_work:main", ["3"])
print(threads, done.command[0].replace(" ", "-"), done.returncode)
"""


def test_a_spare_is_forked_beside_a_pool_that_stops_at_a_fork(tmp_path: Path) -> None:
    """A process that has imported torch, and with it numpy, whose OpenBLAS pool stops at a fork and starts again when
    used (the pool a build server's imports or a build's trace start): its spare is forked, and runs parallel work."""
    threads, command, status = _after_a_parallel_region(tmp_path, SPARE_BESIDE_A_BLAS_POOL, 120)
    if threads == "1":
        pytest.skip("numpy started no thread pool here (one core, or a numpy without OpenBLAS): nothing to fork beside")
    assert (command, status) == ("spare-interpreter", "1")


def test_background_work_runs_below_the_build_in_its_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build's warm-up (start_python): lower priority, and in the build's session, where Linux's autogroup scheduler
    weighs niceness (sessions share the CPU equally, whatever their niceness); a process group of its own, which the
    build stops as a whole."""
    (tmp_path / "where.py").write_text(
        "import json, os, sys\n"
        "def main(argv):\n"
        "    json.dump([os.getpgid(0), os.getsid(0), os.nice(0)], open(argv[0], 'w'))\n"
        "    return 0\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    started = process.start_python("where:main", [str(tmp_path / "where.json")], 7)
    assert started.wait(timeout=60) == 0
    group, session, niceness = json.loads((tmp_path / "where.json").read_text())
    assert group == started.pid and group != os.getpgid(0)
    assert session == os.getsid(0)
    assert niceness == min(os.nice(0) + 7, 19)


IN_SPARE = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from shimgen.build import process
import imported_before_the_fork
process.fork_spare_interpreter()
out = sys.argv[2]
first = process.start_in_spare("where:main", [out + ".1"], 7)
second = process.start_in_spare("where:main", [out + ".2"], 7)  # the spare is taken: a new interpreter
sleeping = process.start_in_spare("where:sleep", [], 7)
start = time.monotonic()
sleeping.stop()
print(json.dumps([first.wait(), first.pid, second.wait(), second.pid, sleeping.status, time.monotonic() - start]))
"""


def test_background_work_runs_in_its_spare_below_the_build_and_stops(tmp_path: Path) -> None:
    """What the build runs beside its compile (start_in_spare): in the spare forked for it, which has what this process
    had imported, lower priority, a process group of its own; then in a new interpreter; and stopped at once."""
    (tmp_path / "imported_before_the_fork.py").write_text("")
    (tmp_path / "where.py").write_text(
        "import json, os, sys, time\n"
        "def main(argv):\n"
        "    json.dump([os.getpgid(0), os.nice(0), 'imported_before_the_fork' in sys.modules], open(argv[0], 'w'))\n"
        "    return 0\n"
        "def sleep(argv):\n"
        "    time.sleep(60)\n"
        "    return 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", IN_SPARE, str(REPO), str(tmp_path / "where")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    first_status, first_pid, second_status, second_pid, stopped, seconds = json.loads(done.stdout)
    assert (first_status, second_status) == (0, 0)
    first = json.loads((tmp_path / "where.1").read_text())
    second = json.loads((tmp_path / "where.2").read_text())
    assert first == [first_pid, 7, True], "the spare: forked after the import"
    assert second == [second_pid, 7, False], "a new interpreter"
    assert stopped == -9 and seconds < 10


def test_an_interrupted_run_returns_once_its_program_has_ended(tmp_path: Path) -> None:
    """Ctrl-C reaches the program too (ninja, say), which then stops what it runs; `run` must not return before that,
    or the build would let go of its locks while the program still writes into the build directory."""
    ended = tmp_path / "ended"

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        process.run(["sh", "-c", f"echo started; sleep 1; touch {ended}"], on_line=interrupt)
    assert ended.exists()


def test_full_collections_are_deferred_only_while_a_block_runs() -> None:
    import gc

    from shimgen.build import workers

    before = gc.get_threshold()
    with pytest.raises(RuntimeError), workers.full_collections_deferred():
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 1_000_000
        kept = [[] for _ in range(10 * before[0])]
        assert gc.get_count()[0] <= before[0] < len(kept)  # the youngest generation is still collected
        raise RuntimeError
    assert gc.get_threshold() == before
