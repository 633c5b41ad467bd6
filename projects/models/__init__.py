"""The example projects' models. Importing any of them first lets torchvision import where its ops library does not load
(see torchvision_ops): transformers and timm import torchvision when it is installed."""

from models import torchvision_ops  # noqa: F401
