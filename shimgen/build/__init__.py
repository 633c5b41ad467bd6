"""Build: every run of Meson, ninja and other programs, and the worker processes of a build."""
