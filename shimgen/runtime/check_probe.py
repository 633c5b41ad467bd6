# Run in a fresh interpreter so that a crash while loading the probe cannot take shimgen down. Started while the probe
# compiles: it imports torch meanwhile, then loads the probe when told to on stdin (an empty line: the build failed).
import sys

import torch  # noqa: F401  (loads the libraries the probe links, as a package's import does)

if sys.stdin.readline().strip() != "load":
    sys.exit(0)
sys.path.insert(0, sys.argv[1])
import shimgen_probe  # noqa: E402

assert shimgen_probe.empty(5) == 5, "C shim allocation mismatch"
assert shimgen_probe.device("cuda:1")[1] == 1 and shimgen_probe.device("cpu")[1] == -1, "AOTI device parsing mismatch"
print("ok")
