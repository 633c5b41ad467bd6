"""state.json: for each unit of work of a project's build, the result of its last successful run.

A stage asks `get` for the result recorded under its current key; on a miss it runs and `commit`s
its result, which is written to disk at once, so an interrupted build keeps what it finished."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, TypeVar

from shimgen.files import write_if_changed
from shimgen.results import from_json, to_json


class Result(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def files(self) -> tuple[Path, ...]: ...


R = TypeVar("R", bound=Result)


class State:
    def __init__(self, path: Path, fresh: bool = False) -> None:
        self.path = path
        self._records: dict[str, Any] = {} if fresh else _load(path)

    def get(self, cls: type[R], unit: str, key: str | None = None) -> R | None:
        """`unit`'s recorded result when it was made under `key` (any key: None) and its files are all still there."""
        data = self._records.get(unit)
        if data is None:
            return None
        try:
            result = from_json(cls, data)
        except (KeyError, TypeError, ValueError):  # recorded by another version of shimgen
            return None
        if (key is not None and result.key != key) or not all(path.exists() for path in result.files):
            return None
        return result

    def commit(self, unit: str, result: Result) -> None:
        self._records[unit] = to_json(result)
        write_if_changed(self.path, json.dumps(self._records, indent=1, sort_keys=True))

    def forget(self, unit: str) -> None:
        self._records.pop(unit, None)

    def forget_all_but(self, prefix: str, units: set[str]) -> None:
        """Drop the records of `prefix` units not in `units` (graphs or targets that left the spec)."""
        for unit in [u for u in self._records if u.startswith(prefix) and u not in units]:
            del self._records[unit]


def _load(path: Path) -> dict[str, Any]:
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}
