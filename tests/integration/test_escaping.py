"""Strings from the spec and the machine reach Python, Meson, TOML and C++ only as escaped literals:
a description holding triple quotes, backslashes and non-ASCII text, a spec file, an output directory
and a per-user cache whose paths hold quotes and spaces still give a package that imports. (The per-user cache's
pieces are the session's, here; test_reproducible.py builds them under such a path.)"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAST_FLAGS, build_json, cache_sharing_the_toolchain, edited, import_package, with_flags

from shimgen.project import escape
from shimgen.spec import load_spec
from shimgen.trace.entry import load_model, make_inputs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.slow

DESCRIPTION = "Says \"\"\"hi\"\"\" and '''bye''' with a back\\slash, {braces}, 100% and ünïcødé ✓ 🙂"


def test_awkward_strings_build_a_package_that_imports(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHIMGEN_CACHE_DIR", str(cache_sharing_the_toolchain(tmp_path / "cache dir's ü")))
    spec = workdir / "projects" / "odd 'spec' ü.toml"
    text = with_flags((workdir / "projects" / "mlp.toml").read_text(), **FAST_FLAGS)
    text = edited(text, 'name = "mlp"', 'name = "odd_strings"\nversion = "2.0rc1"')
    spec.write_text(
        re.sub(r"(?m)^description = .*$", lambda _: f"description = {escape.toml(DESCRIPTION)}", text), encoding="utf-8"
    )
    summary = build_json(spec, tmp_path / "out dir's ü")
    package = import_package(summary)
    assert package.__doc__.startswith(DESCRIPTION + "\n")
    assert package.__version__.startswith("2.0rc1+torch")
    graph = load_spec(spec).graph[0]
    (x,) = make_inputs(graph, {"batch": 3}, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(
            package.forward(x), load_model(graph, "graph[0]", spec.parent)(x), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("text", ["", "plain", DESCRIPTION, "tab\there\nnew line\r\x00\x7f", "\\x41\\u0041 ??= */"])
def test_literals_read_back_as_the_text(text: str) -> None:
    assert ast.literal_eval(escape.py(text)) == text
    assert tomllib.loads(f"v = {escape.toml(text)}")["v"] == text
    assert _c_string(escape.cpp(text)) == text.encode()
    assert _meson_string(escape.meson(text)) == text


def test_unescaped_strings_are_template_bugs() -> None:
    from shimgen.project.render import _env

    with pytest.raises(TypeError, match="without an escaping filter"):
        _env().from_string("name = {{ name }}").render(name="x")
    assert _env().from_string("name = {{ name | toml }}").render(name='a"b') == 'name = "a\\"b"'


def _c_string(literal: str) -> bytes:
    """Decodes the subset of C escapes escape.cpp emits."""
    body, out, i = literal[1:-1], bytearray(), 0
    while i < len(body):
        if body[i] == "\\" and body[i + 1] in "01234567":
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        elif body[i] == "\\":
            out.extend(body[i + 1].encode())
            i += 2
        else:
            out.extend(body[i].encode())
            i += 1
    return bytes(out)


def _meson_string(literal: str) -> str:
    """Parses the literal with Meson's own lexer and parser."""
    from mesonbuild import mparser

    node = mparser.Parser(f"x = {literal}\n", "meson.build").parse().lines[0].value
    return node.value
