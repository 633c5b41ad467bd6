# Run in a fresh interpreter so that a crash while loading the probe cannot take shimgen down.
import sys

import torch  # noqa: F401  (loads the libraries the probe links, as a package's import does)

sys.path.insert(0, sys.argv[1])
import shimgen_probe  # noqa: E402

assert shimgen_probe.empty(5) == 5, "C shim allocation mismatch"
assert shimgen_probe.device("cuda:1")[1] == 1 and shimgen_probe.device("cpu")[1] == -1, "AOTI device parsing mismatch"
print("ok")
