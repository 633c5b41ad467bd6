"""Package: the built project → a verified wheel and the importable package; wheels merged."""
