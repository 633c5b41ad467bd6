"""One source for validation, schema and docs: the dataclasses in shimgen/spec/model.py."""

from __future__ import annotations

import json
import sys

from conftest import REPO, shimgen

from shimgen.spec.schema import json_schema, markdown_reference

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_schema_command_prints_json_schema() -> None:
    result = shimgen("schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema["required"] == ["project", "graph"]
    graph = schema["properties"]["graph"]["items"]
    assert graph["required"] == ["name", "entry", "inputs"]
    assert "float33" not in graph["properties"]["inputs"]["items"]["properties"]["dtype"]["enum"]
    assert all("description" in p for p in graph["properties"].values())


def test_docs_match_the_spec_model() -> None:
    assert (REPO / "docs" / "spec.md").read_text() == markdown_reference() + "\n", (
        "regenerate: shimgen schema --format markdown > docs/spec.md"
    )


def _check_against_schema(value: object, schema: dict) -> None:
    """A small validator for the subset the generated schema uses."""
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                return _check_against_schema(value, option)
            except AssertionError as exc:
                errors.append(exc)
        raise AssertionError(errors)
    if "enum" in schema:
        assert value in schema["enum"], value
        return
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict)
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            assert sub not in (None, False), f"unexpected key {key}"
            if isinstance(sub, dict):
                _check_against_schema(item, sub)
        for key in schema.get("required", []):
            assert key in value, key
    elif kind == "array":
        assert isinstance(value, list)
        for item in value:
            _check_against_schema(item, schema["items"])
    elif kind:
        expected = {"string": str, "integer": int, "number": (int, float), "boolean": bool}[kind]
        assert isinstance(value, expected), (value, kind)


def test_project_specs_satisfy_the_schema() -> None:
    schema = json_schema()
    specs = sorted((REPO / "projects").glob("*.toml"))
    assert len(specs) >= 5, f"the project specs are missing from {REPO / 'projects'}: {specs}"
    for spec in specs:
        _check_against_schema(tomllib.loads(spec.read_text()), schema)
