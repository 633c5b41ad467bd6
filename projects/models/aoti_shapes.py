"""The shapes of AOTInductor's own test suite: data-dependent control flow (torch.cond), embedding bags, scatter by
index (index_put), and a buffer updated in place (models.stateful)."""

import torch


class Cond(torch.nn.Module):
    """One branch or the other, by the input's sum: both are compiled, the choice made at run time."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, width)
        self.down = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: self.up(t).relu(), lambda t: self.down(t).sigmoid(), (x,))


class Bags(torch.nn.Module):
    """Sums of embeddings over bags of ids given by offsets (a recommender's sparse features)."""

    def __init__(self, rows: int = 100, width: int = 16) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(rows, width, mode="sum")

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.bag(ids, offsets)


def scatter_rows(table: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`table` with the rows at `index` replaced by `rows` (accumulated where an index repeats), then gathered back."""
    updated = table.index_put((index,), rows, accumulate=True)
    return updated.gather(0, index.unsqueeze(1).expand(-1, table.shape[1]))
