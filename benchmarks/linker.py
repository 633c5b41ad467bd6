"""What the faster linker (`toolchain.fast_linker`: mold, lld or gold where installed) saves a package's link steps.

    python benchmarks/linker.py [projects/resnet.toml ...] [--rounds 3]

Builds each spec (into a temporary directory, the lockfiles left as they were), then runs every shared library's link
command from Meson's build.ninja two ways in alternation, into a scratch file: as built, and with `-fuse-ld=bfd` (the
system default). Median seconds per library and their sum per project.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from common import REPO, built_meson_dir, shell_medians

from shimgen import toolchain


def _link_commands(build: Path, ninja: str) -> dict[str, str]:
    """Each shared library Meson links in `build`, and its command (writing a scratch file instead)."""
    targets = subprocess.run(
        [ninja, "-C", str(build), "-t", "targets", "all"], capture_output=True, text=True, check=True
    )
    libraries = [line.split(":")[0] for line in targets.stdout.splitlines() if line.split(":")[0].endswith(".so")]
    commands = {}
    for library in libraries:
        listed = subprocess.run(
            [ninja, "-C", str(build), "-t", "commands", "-s", library], capture_output=True, text=True
        )
        words = shlex.split(listed.stdout.strip().splitlines()[-1])
        at = words.index("-o")
        words[at + 1] = os.path.join(tempfile.gettempdir(), f"shimgen-link-{os.getpid()}.so")
        commands[library] = shlex.join(words)
    return commands


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", nargs="*", type=Path, default=[REPO / "projects" / "resnet.toml"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tc = toolchain.detect()
    print(f"linker: ld.{tc.linker or 'bfd (the default)'}; compiler {tc.cxx_identity}\n")
    print(f"| project | library | ld.{tc.linker}, s | ld.bfd, s | saved |")
    print("| --- | --- | --- | --- | --- |")
    for spec in args.specs:
        with tempfile.TemporaryDirectory() as tmp:
            build = built_meson_dir(spec, Path(tmp))
            totals = [0.0, 0.0]
            for library, command in _link_commands(build, tc.ninja).items():
                ways = [command, command.replace(f"-fuse-ld={tc.linker}", "") + " -fuse-ld=bfd"]
                medians = shell_medians(ways, build, args.rounds)
                totals = [t + m for t, m in zip(totals, medians, strict=True)]
                print(
                    f"| {spec.name} | {library} | {medians[0]:.2f} | {medians[1]:.2f} | {1 - medians[0] / medians[1]:.0%} |"
                )
            print(
                f"| {spec.name} | all | {totals[0]:.2f} | {totals[1]:.2f} | {1 - totals[0] / max(totals[1], 1e-9):.0%} |"
            )


if __name__ == "__main__":
    main()
