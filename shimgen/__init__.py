"""shimgen: a declarative build system for compiled PyTorch model shims."""

__version__ = "0.1.0"
