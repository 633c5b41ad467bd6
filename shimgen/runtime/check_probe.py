# Run in a fresh interpreter so that a crash while loading the probe cannot take shimgen down.
import sys

import torch

sys.path.insert(0, sys.argv[1])
import shimgen_probe  # noqa: E402

x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
y = shimgen_probe.roundtrip(x)
assert y.data_ptr() == x.data_ptr() and y.shape == x.shape and y.dtype == x.dtype, "tensor round trip mismatch"
assert shimgen_probe.empty(5).shape == (5,), "C shim allocation mismatch"
assert shimgen_probe.device("cuda:1")[1] == 1 and shimgen_probe.device("cpu")[1] == -1, "AOTI device parsing mismatch"
print("ok")
