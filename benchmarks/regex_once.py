"""What std::regex instantiated once (shimgen/runtime/shimgen_regex_once.h) saves each translation unit that includes
AOTInductor's model headers: a graph's model.cpp, and proxy_executor.cpp where the graph calls ops through the
dispatcher.

    python benchmarks/regex_once.py [projects/hf.toml ...] [--rounds 3]

Builds each spec (into a temporary directory, the lockfiles left as they were), then times every such unit's compile
command from Meson's compile_commands.json, without the compiler cache, two ways in alternation: as shimgen writes it,
and with the declarations taken out (a copy of the unit whose `#include "shimgen_regex_once.h"` is dropped, beside a
copy of shimgen_model_base.h without it). Median seconds per unit, and their sum per project.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
from pathlib import Path

from common import REPO, built_meson_dir, shell_medians

INCLUDE = '#include "shimgen_regex_once.h"'
UNITS = ("model.cpp", "proxy_executor.cpp")


def _without_declarations(command: str, source: Path) -> str:
    """The compile command of a copy of `source` (beside it) that does not declare std::regex's templates."""
    base = source.parent / "shimgen_model_base_all.h"
    base.write_text(
        (source.parents[1] / "shimgen_model_base.h").read_text().replace(INCLUDE, "// (declarations dropped)")
    )
    copy = source.with_name(f"{source.stem}_all{source.suffix}")
    text = source.read_text().replace(INCLUDE, "// (declarations dropped)")
    copy.write_text(text.replace('#include "shimgen_model_base.h"', '#include "shimgen_model_base_all.h"'))
    return command.replace(str(source.name), copy.name)


def _plain(words: list[str]) -> str:
    """A compile command without the compiler cache, its dependency file, or its object (written to /dev/null)."""
    kept: list[str] = []
    skip = False
    for k, word in enumerate(words):
        if skip:
            skip = False
        elif word in ("-MQ", "-MF", "-o"):
            skip = True
        elif word != "-MD" and not (k == 0 and word.endswith("ccache")):
            kept.append(word)
    return shlex.join([*kept, "-o", os.devnull])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", nargs="*", type=Path, default=[REPO / "projects" / "resnet.toml"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| project | unit | as built, s | without the declarations, s | saved |")
    print("| --- | --- | --- | --- | --- |")
    for spec in args.specs:
        with tempfile.TemporaryDirectory() as tmp:
            build = built_meson_dir(spec, Path(tmp))
            commands = json.loads((build / "compile_commands.json").read_text())
            totals = [0.0, 0.0]
            for entry in commands:
                source = (build / entry["file"]).resolve()
                if source.name not in UNITS or INCLUDE not in (source.read_text() + _model_base(source)):
                    continue
                command = _plain(shlex.split(entry["command"]))
                ways = [command, _without_declarations(command, source)]
                medians = shell_medians(ways, build, args.rounds)
                totals = [t + m for t, m in zip(totals, medians, strict=True)]
                unit = f"{source.parent.name}/{source.name}"
                print(
                    f"| {spec.name} | {unit} | {medians[0]:.2f} | {medians[1]:.2f} | {1 - medians[0] / medians[1]:.0%} |"
                )
            print(
                f"| {spec.name} | all | {totals[0]:.2f} | {totals[1]:.2f} | {1 - totals[0] / max(totals[1], 1e-9):.0%} |"
            )


def _model_base(source: Path) -> str:
    base = source.parents[1] / "shimgen_model_base.h"
    return base.read_text() if '#include "shimgen_model_base.h"' in source.read_text() and base.is_file() else ""


if __name__ == "__main__":
    main()
