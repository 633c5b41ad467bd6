"""`shimgen build | check | matrix | ci | report | merge | doctor | schema | clean`. User errors print one line and exit
2; a shimgen bug prints
one paragraph, saves its traceback to a file and exits 3."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from shimgen import devices, tolerance, toolchain
from shimgen.build import process
from shimgen.cache import shared_cache
from shimgen.commands import ci_workflow, matrix, report, server
from shimgen.commands.check import compare
from shimgen.errors import BuildError, UserError, cause
from shimgen.files import exclusive
from shimgen.inductor import internals, kernel_choice
from shimgen.package import merge
from shimgen.pipeline import BuildOutput, Layout, build
from shimgen.spec import load_spec
from shimgen.spec.schema import json_schema, markdown_reference
from shimgen.toolchain import entries, probe
from shimgen.toolchain.cuda import detect_cuda, torch_cuda_version


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # whoever read the output stopped reading (`shimgen build ... | head`): no crash of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())  # else Python's flush at exit reports the pipe again
        return 141  # as a shell reports a command that SIGPIPE ended


def _main(argv: list[str] | None) -> int:
    if argv is None and sys.argv[1:2] in (["build"], ["check"]):  # the command line's, not a caller's in this process
        handed = server.hand_over(sys.argv[1:])
        if handed is not None:
            return handed
        # The build runs here. The interpreter that checks its package is forked now, once torch is imported (by
        # fork_is_safe) and before the build has run anything.
        if internals.fork_is_safe():
            process.fork_spare_interpreter()
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "out", None) is not None:
            _check_out(args.out)
        return args.run(args)
    except BuildError as exc:
        _error(f"shimgen: build failed: {exc}")
        return 1
    except UserError as exc:
        _error("\n".join(f"shimgen: {error}" for error in getattr(exc, "errors", [exc])))
        return 2
    except KeyboardInterrupt:
        print("shimgen: interrupted; previous outputs are left as they were", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except SystemExit as exc:  # shimgen's commands never exit: the project's code did, while imported or run
        _error(_project_exit(exc, getattr(args, "spec", None)))
        return 2
    except Exception as exc:
        try:
            full = _disk_full(exc, getattr(args, "out", None))
        except OSError:  # a place it asks about cannot be read: the failure is told as a bug's, below
            full = None
        if full is not None:
            _error(f"shimgen: {full}")
            return 2
        _error(_internal_error(exc, argv))
        return 3


def _error(message: str) -> None:
    """Paths that are not UTF-8 (surrogates in Python) printed as escapes, whatever stream stderr is."""
    print(message.encode("utf-8", "backslashreplace").decode("utf-8"), file=sys.stderr)


def _check_out(out: Path) -> None:
    """--out must be, or be creatable as, a directory we can write to: say so now, not as an OSError in a stage."""
    try:
        str(out.absolute()).encode("utf-8")
    except (
        UnicodeEncodeError
    ):  # bytes that are not UTF-8, kept by Python as surrogates: torch.export.save aborts on them
        raise UserError(f"--out {out}: the path is not UTF-8 text; choose another output directory") from None
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"--out {out}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: {existing} is not writable")


def _project_exit(exc: SystemExit, spec: Path | None) -> str:
    """'...called sys.exit(0) (at models/net.py:12)': the innermost frame under the spec's directory."""
    where = ""
    spec_dir = spec.parent.resolve() if spec is not None else None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)) if spec_dir is not None else ():
        path = Path(frame.filename).resolve()
        if spec_dir is not None and path.is_relative_to(spec_dir):
            where = f" (at {path.relative_to(spec_dir)}:{frame.lineno})"
            break
    prefix = f"shimgen: {spec}: " if spec is not None else "shimgen: "
    return f"{prefix}the project's code called sys.exit({exc.code!r}){where}; a model must not exit the process"


LOW_SPACE = 64 << 20  # free bytes below which a failure is put down to a full disk


def _disk_full(exc: BaseException, out: Path | None) -> str | None:
    """Where a failure is a full disk's, not a bug's, what to tell: an ENOSPC or EDQUOT as the OSError it came from,
    or a place the build writes to with less than LOW_SPACE left (a full disk also shows as a short write that
    a library reports otherwise, e.g. torch's archive writer). Else None."""
    failed_os = cause(exc, OSError)
    said = failed_os is not None and failed_os.errno in (errno.ENOSPC, errno.EDQUOT)
    places = {
        "the output directory": (out or Path(".")).resolve(),
        "the temporary directory": Path(tempfile.gettempdir()),
        "shimgen's per-user cache": toolchain.cache_dir(),
    }
    low = []
    for name, path in places.items():
        while not path.exists() and path != path.parent:
            path = path.parent
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            continue
        if free < LOW_SPACE:
            low.append(f"{name} ({path}: {free >> 20} MB free)")
    if not low and not said:
        return None
    where = "; ".join(low) if low else "a place the build writes to"
    return (
        f"the disk is full: {where}; the previous outputs are left as they were. Free some space (Inductor's and the "
        f"compiler's caches and old build directories can go) and run it again "
        f"({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]})"
    )


def _internal_error(exc: Exception, argv: list[str] | None) -> str:
    """One paragraph for a shimgen bug; the full traceback goes to a file the report can attach."""
    lines = str(exc).strip().splitlines() or [""]
    message = f"{type(exc).__name__}: {lines[0]}" + (" ..." if len(lines) > 1 else "")
    report = f"shimgen {' '.join(sys.argv[1:] if argv is None else argv)}\npython {sys.version}\n\n" + "".join(
        traceback.format_exception(exc)
    )
    try:
        # mkstemp: a new file of our own even in a shared /tmp (no clobbering, no following a planted link)
        fd, crash = tempfile.mkstemp(prefix=f"shimgen-crash-{os.getpid()}-", suffix=".txt", dir=tempfile.gettempdir())
        with os.fdopen(fd, "w", errors="backslashreplace") as f:  # argv may hold undecodable bytes
            f.write(report)
        saved = f"the full traceback is in {crash}"
    except OSError as err:
        saved = f"the traceback could not be saved under {tempfile.gettempdir()} ({err.strerror or err})"
    return f"shimgen: internal error (a bug in shimgen; please report it): {message}; {saved}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shimgen", description="Build compiled PyTorch model shims from a TOML spec.")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def only_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--only",
            metavar="ID",
            help="build just this build identifier (see `shimgen matrix`), in build/<name>/<ID>/",
        )
        p.add_argument(
            "--cache",
            metavar="URL",
            help="a build cache shared across machines: redis://host:port[/db], file:///path or "
            f"a directory (default: ${shared_cache.ENV})",
        )

    def spec_command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("spec", type=Path, help="the spec file, e.g. projects/resnet.toml")
        p.add_argument(
            "--out", type=Path, default=Path("."), help="root of build/ and dist/ (default: current directory)"
        )
        return p

    p = spec_command("build", "trace, generate, compile and package a spec")
    p.add_argument("--json", action="store_true", help="print one JSON summary on stdout")
    only_option(p)
    p.add_argument("--force", action="store_true", help="ignore recorded stage keys and rebuild everything")
    p.add_argument(
        "--no-cache", action="store_true", help="do not compile through ccache/sccache even when one is on PATH"
    )
    p.add_argument(
        "--retune",
        action="store_true",
        help="measure every kernel choice again instead of replaying <spec>.lock, and rewrite it",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="install the package without first running each graph at its smallest, "
        "example and largest sizes against the program it was compiled from",
    )
    p.set_defaults(run=_build)

    p = spec_command("check", "build if needed, then compare the package with eager PyTorch")
    p.add_argument("--json", action="store_true", help="print one JSON summary on stdout")
    only_option(p)
    p.set_defaults(run=_check)

    p = sub.add_parser(
        "matrix",
        help="print the spec's build identifiers, one per CI job",
        description="print the spec's build "
        "identifiers (target x torch x Python, x CUDA for a cuda target), one per CI job",
    )
    p.add_argument("spec", type=Path, help="the spec file, e.g. projects/resnet.toml")
    p.add_argument("--json", action="store_true", help="a JSON list of the jobs with their versions, for a CI matrix")
    p.set_defaults(run=_matrix)

    p = sub.add_parser(
        "ci",
        help="write a GitHub Actions workflow with one job per build identifier",
        description="write a GitHub "
        "Actions workflow for the spec's build matrix: one job per build identifier (see `shimgen matrix`), each "
        "installing its torch, then shimgen, then running build and check with --only its identifier",
    )
    p.add_argument("spec", type=Path, help="the spec file, e.g. projects/resnet.toml")
    p.add_argument(
        "--root",
        type=Path,
        help="the repository's top directory, where the jobs run (default: the top of the git "
        "repository holding the spec, else the current directory)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--output", type=Path, help="the workflow file (default: <root>/.github/workflows/shimgen-<name>.yml)"
    )
    where.add_argument("--print", action="store_true", help="write the workflow to stdout instead of a file")
    p.add_argument(
        "--cuda-runner",
        default="gpu",
        metavar="LABEL[,LABEL...]",
        help="runs-on label of the CUDA jobs' runner, or "
        "several separated by commas, such as self-hosted,linux,gpu (default: gpu)",
    )
    p.add_argument(
        "--shimgen-requirement",
        metavar="REQUIREMENT",
        help="what the jobs pip install as shimgen, such as "
        "'shimgen>=0.1' or 'shimgen @ git+https://...' (default: shimgen==<this shimgen's version>)",
    )
    p.set_defaults(run=_ci)

    p = sub.add_parser(
        "merge", help="join one package's per-target wheels (built with --only) into one multi-target wheel"
    )
    p.add_argument("wheels", type=Path, nargs="+", help="the wheels, one per target")
    p.add_argument("--out", type=Path, default=Path("dist"), help="directory of the merged wheel (default: dist)")
    p.set_defaults(run=_merge)

    p = spec_command("report", "show what the last build made: kernels, kernel choices, compile seconds, sizes")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    p.add_argument(
        "--only",
        metavar="ID",
        help="report the build of this build identifier (see `shimgen matrix`), in build/<name>/<ID>/",
    )
    p.set_defaults(run=_report)

    p = spec_command("clean", "remove build/<name>/ and the project's wheels from dist/")
    p.set_defaults(run=_clean)

    p = sub.add_parser("doctor", help="show what the toolchain found and which compilers the probe proved")
    p.add_argument(
        "--refresh", action="store_true", help="prove every compiler again instead of reading cached verdicts"
    )
    p.set_defaults(run=_doctor)

    p = sub.add_parser("schema", help="print the spec's JSON schema (or a Markdown reference)")
    p.add_argument("--format", choices=["json", "markdown"], default="json")
    p.set_defaults(run=_schema)
    return parser


def _progress(stage: str, message: str) -> None:
    """One line per event; on a terminal, compile progress rewrites a single line."""
    tty = sys.stderr.isatty()
    if tty and stage == "compile" and message.startswith("compile "):
        print(f"\r[compile] {message}\033[K", end="", file=sys.stderr, flush=True)
    else:
        clear = "\r\033[K" if tty else ""
        print(f"{clear}[{stage}] {message}", file=sys.stderr, flush=True)


def _run_build(
    args: argparse.Namespace, force: bool = False, use_cache: bool = True, retune: bool = False, verify: bool = True
) -> BuildOutput:
    return build(
        args.spec,
        args.out,
        force=force,
        use_cache=use_cache,
        progress=_progress,
        only=args.only,
        retune=retune,
        cache_url=args.cache,
        verify=verify,
    )


def _build(args: argparse.Namespace) -> int:
    result = _run_build(
        args, force=args.force, use_cache=not args.no_cache, retune=args.retune, verify=not args.no_verify
    )
    _print_summary(result)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    return 0


def _print_summary(result: BuildOutput) -> None:
    err = sys.stderr
    print(f"\nbuilt {result.name} ({', '.join(result.identifiers)}): {', '.join(result.graphs)}", file=err)
    print(f"  wheel:       {result.wheel}", file=err)
    if result.platform_reason:
        print(f"               no manylinux tag: {result.platform_reason}", file=err)
    if result.weights_file:
        print(f"  weights:     {result.weights_file} (not in the wheel: flags.weights = 'external')", file=err)
    print(f"  package_dir: {result.package_dir}", file=err)
    if result.cpp_prefix:
        print(f"  C++ package: {result.cpp_prefix} (find_package({result.name}), pkg-config {result.name})", file=err)
        print(f"               {result.cpp_archive}", file=err)
    else:
        print(f"  C++ package: none ({result.cpp_skipped})", file=err)
    print(
        f"  compiler cache: {result.compiler_cache or 'none (no ccache/sccache on PATH, --no-cache, or nothing compiled)'}",
        file=err,
    )
    if result.shared_cache:
        shared = result.shared_cache
        found = ", ".join(shared["found"]) or "nothing"
        print(
            f"  shared cache: {shared['url']}: found {found}; stored {', '.join(shared['stored']) or 'nothing'}"
            + (f"; off after an error: {shared['error']}" if shared["error"] else ""),
            file=err,
        )
    if result.skipped:
        print(f"  up to date, skipped: {', '.join(result.skipped)}", file=err)
    print(f"  {'stage':<10} {'seconds':>8}", file=err)
    for stage, seconds in result.stages.items():
        print(f"  {stage:<10} {seconds:>8.2f}", file=err)
    print(
        f"  {'elapsed':<10} {result.elapsed:>8.2f}  (stages of several units overlap)"
        if result.elapsed < sum(result.stages.values()) - 0.5
        else f"  {'total':<10} {result.elapsed:>8.2f}",
        file=err,
    )
    for m in result.models:
        if m.get("automatic"):
            print(
                f"  {m['unit']} {', '.join(f'{d}={n}' for d, n in m['variant'].items())}: a variant of its own: {m['automatic']}",
                file=err,
            )
    if any(m["variant"] for m in result.models):
        print("  models (this build's seconds; bytes in the package, a variant's weights those it adds):", file=err)
        for m in result.models:
            name = ", ".join(f"{d}={n}" for d, n in m["variant"].items()) if m["variant"] else "dynamic"
            added = f", weights +{m['weights_bytes'] / 1e6:.1f} MB" if m["weights_bytes"] is not None else ""
            print(
                f"    {m['unit']} {name}: trace {m['trace']:.1f}s, codegen {m['codegen']:.1f}s, compile {m['compile']:.1f}s; "
                f"library {m['library_bytes'] / 1e6:.1f} MB{added}",
                file=err,
            )
    if result.verified.get("cases"):
        print(
            f"  verified against the traced programs in {result.verified['seconds']:.1f}s: {len(result.verified['cases'])} calls",
            file=err,
        )
    if result.verified.get("settled"):
        print(
            f"  not run again: {len(result.verified['settled'])} calls of code that passed them in an earlier build",
            file=err,
        )
    for skipped in result.verified.get("skipped", []):
        print(f"  not verified: {skipped}", file=err)
    if result.slowest_units:
        print("  slowest translation units: " + ", ".join(f"{u} {s:.1f}s" for u, s in result.slowest_units), file=err)
    for unit, files in result.large_kernels.items():
        listed = ", ".join(f"{f} (a kernel of {n / 1e6:.1f} MB of source)" for f, n in files)
        print(f"  compiled at -O2, not -O3, which takes minutes on so large a kernel, {unit}: {listed}", file=err)
    _print_fallbacks(result)
    for unit, gemms in result.untimed_gemms.items():
        for kernel in ("library", "template"):
            listed = kernel_choice.listed((sizes, n) for (sizes, k), n in gemms if k == kernel)
            if listed:
                print(f"  {kernel} GEMMs, untimed ({kernel_choice.RULE}), {unit}: {listed}", file=err)
    for unit, choices in result.kernel_choices.items():
        print(f"  kernels chosen by timing, {unit} (us per call; CPU candidates timed with one thread):", file=err)
        for c in choices:
            others = ", ".join(f"{name} {us:g}" for name, us in c.us.items() if name != c.picked)
            times = f" x{c.count}" if c.count > 1 else ""
            print(
                f"    {c.op}({', '.join(c.sizes)}){times}: {c.picked} {c.us[c.picked]:g}"
                + (f"; {others}" if others else ""),
                file=err,
            )


def _print_fallbacks(result: BuildOutput) -> None:
    """What the build fell back on, which costs speed: `build` and `check` both say it."""
    for unit, why in result.onednn_off.items():
        print(f"  {unit}: generated without oneDNN: {why}", file=sys.stderr)
    for unit, why in result.gemm_templates_off.items():
        print(f"  {unit}: GEMMs not timed against Inductor's templates: {why}", file=sys.stderr)
    for unit, why in result.freezing_off.items():
        print(f"  {unit}: generated without freezing: {why}", file=sys.stderr)
    for unit, why in result.scalar_kernels.items():
        print(
            f"  {unit}: CPU kernels not vectorized: the compiler refused the vectorized ones ({why})", file=sys.stderr
        )


def _check(args: argparse.Namespace) -> int:
    started = time.monotonic()
    result = _run_build(args)
    _print_fallbacks(result)
    spec = load_spec(args.spec)
    if args.only:
        spec = dataclasses.replace(spec, target=[matrix.select(spec, args.only).target])
    made: dict[str, list[dict[str, int]]] = {}
    for model in result.models:
        if model["variant"]:
            sizes = made.setdefault(model["unit"].rpartition("_")[0], [])
            sizes += [model["variant"]] if model["variant"] not in sizes else []
    rows = compare(spec, args.spec.parent.resolve(), result.package_dir, made, result.weights_file)
    failed = [r for r in rows if not r.ok]
    print(f"\n{'graph':<12} {'case':<14} {'output':<24} {'max abs err':>12} {'largest':>12}", file=sys.stderr)
    for r in rows:
        print(
            f"{r.graph:<12} {r.case:<14} {r.output:<24} {r.max_abs:>12.3g} {r.largest:>12.3g}{'' if r.ok else '  MISMATCH'}",
            file=sys.stderr,
        )
    tolerances = ", ".join(f"{g.name}: atol={g.atol:g} rtol={g.rtol:g}" for g in spec.graph)
    floors = sorted({r.dtype for r in rows if r.dtype in tolerance.LEAST})
    if floors:
        tolerances += "; " + ", ".join(
            f"{dtype} outputs: atol at least {tolerance.LEAST[dtype]:g} x the largest value, rtol at least "
            f"{tolerance.LEAST[dtype]:g}"
            for dtype in floors
        )
    verdict = (
        f"{len(failed)} of {len(rows)} outputs beyond tolerance ({tolerances})"
        if failed
        else f"all {len(rows)} outputs match eager ({tolerances})"
    )
    print(f"\ncheck: {verdict} in {time.monotonic() - started:.1f}s", file=sys.stderr)
    if any(not devices.device(t.device).available() for t in spec.target):
        print("check: the cuda target was not checked: this machine has no GPU", file=sys.stderr)
        if not rows:
            return 1
    if args.json:
        print(json.dumps({**result.summary(), "ok": not failed, "comparisons": [r.__dict__ for r in rows]}, indent=2))
    return 1 if failed else 0


def _matrix(args: argparse.Namespace) -> int:
    ids = matrix.identifiers(load_spec(args.spec))
    print(json.dumps([b.as_json() for b in ids], indent=2) if args.json else "\n".join(b.identifier for b in ids))
    return 0


def _ci(args: argparse.Namespace) -> int:
    root = args.root or ci_workflow.default_root(args.spec)
    text = ci_workflow.workflow(
        args.spec,
        root,
        ci_workflow.runner_labels(args.cuda_runner),
        args.shimgen_requirement or ci_workflow.default_requirement(),
    )
    if args.print:
        print(text, end="")
        return 0
    output = args.output or ci_workflow.default_output(root, args.spec)
    ci_workflow.write(output, text)
    print(output)
    return 0


def _merge(args: argparse.Namespace) -> int:
    print(merge.merge(args.wheels, args.out))
    return 0


def _report(args: argparse.Namespace) -> int:
    data = report.collect(args.spec, args.out, args.only)
    print(json.dumps(data, indent=2) if args.json else report.text(data))
    return 0


def _clean(args: argparse.Namespace) -> int:
    name = load_spec(args.spec).project.name
    layout = Layout.of(args.spec, args.out, name)
    removed = []
    with exclusive(layout.lock_file, lambda held: _progress("clean", str(held))):
        if layout.root.exists():
            shutil.rmtree(layout.root)
            removed.append(str(layout.root))
        for wheel in layout.dist.glob(f"{name}-*.whl"):
            wheel.unlink()
            removed.append(str(wheel))
    print("removed " + (", ".join(removed) if removed else "nothing"), file=sys.stderr)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    tc = toolchain.detect()
    print(f"python:         {tc.python} ({tc.python_version})")
    print(f"torch:          {tc.torch_version}, headers {tc.torch_includes[0]}, libraries {tc.torch_lib}")
    print(f"meson:          {tc.meson}")
    print(f"ninja:          {tc.ninja}")
    print(f"compiler cache: {toolchain.compiler_cache() or 'none on PATH'}")
    url = shared_cache.configured(None)
    print(f"shared cache:   {_shared_line(url) if url else f'none (--cache URL or ${shared_cache.ENV})'}")
    listed, size_limit = entries.listed(), entries.limit()
    used = f"{sum(e.size for e in listed) / 2**30:.1f} GiB in {len(listed)} prebuilt sets and runtime libraries"
    bound = f"{size_limit / 2**30:.1f} GiB" if size_limit else "none"
    print(f"per-user cache: {toolchain.cache_dir().parent} ({used}; limit {bound}, ${entries.LIMIT_ENV})")
    print("compilers (probe: build a torch extension with the project's Meson setup, load it in a subprocess):")
    chosen = None
    for cxx in toolchain.candidate_compilers():
        for verdict in probe.prove_compiler(cxx, refresh=args.refresh)[1]:
            chosen = chosen or (verdict.named if verdict.ok else None)
            print(f"  {'ok  ' if verdict.ok else 'FAIL'} {verdict.named}: {verdict.reason}")
    print(f"selected:       {chosen or 'none: set CXX to a compiler that builds loadable torch extensions'}")
    print(f"cuda targets:   {_cuda_line()}")
    return 0 if chosen else 2


def _shared_line(url: str) -> str:
    backend = shared_cache.backend(url)
    try:
        backend.get("doctor")
    except OSError as exc:
        return f"{backend.url}: unreachable ({exc})"
    remote = (
        f"; ccache remote storage {shared_cache.ccache_remote(backend)}"
        if "ccache" in (toolchain.compiler_cache() or "")
        else ""
    )
    return f"{backend.url}: reachable{remote}"


def _cuda_line() -> str:
    try:
        cuda = detect_cuda()
    except UserError as exc:
        return f"unavailable: {exc}"
    try:
        torch_cuda = f"torch built with CUDA {torch_cuda_version()}"
    except UserError as exc:
        torch_cuda = f"unavailable: {exc}"
    return f"nvcc {cuda.version} at {cuda.nvcc} (archs: {', '.join(cuda.codes)}); {torch_cuda}"


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2) if args.format == "json" else markdown_reference())
    return 0
