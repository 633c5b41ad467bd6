"""Commands: the CLI and what it runs besides a build (check, report, matrix, ci)."""
