"""Errors a user can fix: the CLI prints them as one line and exits 2, never a traceback."""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class UserError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""


class SpecError(UserError):
    """A problem in a spec, located by file and key path: `resnet.toml: graph[0].name: ...`."""

    def __init__(self, file: str, where: str, message: str) -> None:
        self.file = file
        self.where = where
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return ": ".join(part for part in (self.file, self.where, self.message) if part)

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str, str]]:  # raised in a worker process, re-raised here
        return SpecError, (self.file, self.where, self.message)


class SpecErrors(UserError):
    """The errors of several graphs in one build, in spec order: each is reported, whichever failed first."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("\n".join(map(str, errors)))

    def __str__(self) -> str:
        return "\n".join(map(str, self.errors))


class BuildError(UserError):
    """A failed build step (compiler, Meson, packaging), with the part of its log that matters."""


class MismatchError(BuildError):
    """A built package that does not compute what its traced program does: where the check knows them, the case that
    differed (`failure`) and the traced program of the code that computed it (`program`)."""

    def __init__(self, message: str, failure: str = "", program: str = "") -> None:
        super().__init__(message)
        self.failure, self.program = failure, program


def cause(exc: BaseException, kind: type[E]) -> E | None:
    """`exc` or the first exception of type `kind` it was raised from or while handling (libraries wrap what fails
    inside them)."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, kind):
        seen = seen.__cause__ or seen.__context__
    return seen
