import torch


class Counter(torch.nn.Module):
    """A running counter and a running sum: buffers updated in place on every call."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("total", torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        self.total.add_(x.sum(0))
        return self.linear(x) * self.count + self.total
