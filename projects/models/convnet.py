"""A small CNN (conv-bn-relu blocks, pooling, linear): several fused CPU kernels per graph."""

from torch import Tensor, nn


class ConvNet(nn.Module):
    def __init__(self, channels: tuple[int, ...] = (16, 32, 64), classes: int = 10) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        inplanes = 3
        for planes in channels:
            blocks += [
                nn.Conv2d(inplanes, planes, 3, padding=1, bias=False),
                nn.BatchNorm2d(planes),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            inplanes = planes
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(inplanes, classes)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.running_mean, -0.1, 0.1)
                nn.init.uniform_(m.running_var, 0.5, 1.5)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))
