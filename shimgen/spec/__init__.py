"""The spec: TOML tables as dataclasses (model.py), loading and validation (load.py), JSON schema (schema.py)."""

from shimgen.spec.load import load_spec
from shimgen.spec.model import Dim, Flags, Graph, Input, Project, ProjectSpec, Target

__all__ = ["load_spec", "Dim", "Flags", "Graph", "Input", "Project", "ProjectSpec", "Target"]
