"""Inductor: the exported program → C++ and kernels, through Inductor's ahead-of-time codegen."""
