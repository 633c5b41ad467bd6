"""The tensor files run_graph.cpp (and benchmarks/cpp) read and write: a count, then per tensor its dtype
(c10::ScalarType's number), rank, sizes and contiguous bytes, all integers int64 little-endian (tensor_file.h)."""

from __future__ import annotations

import struct
from pathlib import Path

import torch

SCALAR_TYPES = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.bool: 11,
    torch.bfloat16: 15,
}
DTYPES = {code: dtype for dtype, code in SCALAR_TYPES.items()}


def write_tensors(path: Path | str, tensors: list[torch.Tensor]) -> None:
    parts = [struct.pack("<q", len(tensors))]
    for t in tensors:
        t = t.detach().cpu().contiguous()
        parts.append(struct.pack(f"<{2 + t.dim()}q", SCALAR_TYPES[t.dtype], t.dim(), *t.shape))
        parts.append(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    Path(path).write_bytes(b"".join(parts))


def read_tensors(path: Path | str) -> list[torch.Tensor]:
    data, offset = Path(path).read_bytes(), 8
    tensors = []
    for _ in range(struct.unpack_from("<q", data)[0]):
        code, rank = struct.unpack_from("<2q", data, offset)
        shape = struct.unpack_from(f"<{rank}q", data, offset + 16)
        offset += 16 + 8 * rank
        t = torch.empty(shape, dtype=DTYPES[code])
        nbytes = t.numel() * t.element_size()
        if nbytes:
            t.view(-1).view(torch.uint8)[:] = torch.frombuffer(
                bytearray(data[offset : offset + nbytes]), dtype=torch.uint8
            )
        offset += nbytes
        tensors.append(t)
    return tensors
