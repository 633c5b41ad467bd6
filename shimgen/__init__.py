"""shimgen: a declarative build system for compiled PyTorch model shims."""

from pathlib import Path

__version__ = (Path(__file__).parent / "VERSION").read_text().strip()  # the one place: Meson and the wheel read it too
