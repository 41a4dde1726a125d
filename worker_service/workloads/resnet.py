"""Residual networks (He et al., 2016), written for this catalog: torchvision cannot be imported
beside the CPU torch build installed here, and the CIFAR variant Gavel trained is not in it anyway.

``resnet18_cifar``: the CIFAR-10 ResNet-18 Gavel's image-classification job trains (a 3x3 stem,
no max-pool: 32 x 32 inputs keep their resolution into the first stage). ``resnet50_imagenet``:
the ImageNet ResNet-50 (7x7 stride-2 stem and a max-pool, bottleneck blocks). ``base_width`` is 64
in both papers; a "small" build narrows it, keeping the depth that names the model.
"""

from __future__ import annotations

from torch import Tensor, nn


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    # No conv bias: the batch norm that follows has its own shift.
    return [nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(out_ch)]


def _shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Module:
    """Identity when shapes agree, else a strided 1x1 projection (the paper's option B)."""
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return nn.Sequential(*_conv_bn(in_ch, out_ch, 1, stride))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut: ResNet-18/34."""

    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(in_ch, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, width, 3))
        self.shortcut = _shortcut(in_ch, width, stride)

    def forward(self, x: Tensor) -> Tensor:
        return (self.body(x) + self.shortcut(x)).relu()


class Bottleneck(nn.Module):
    """1x1 down to ``width``, 3x3 (strided), 1x1 up to 4 x ``width``: ResNet-50/101/152."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.body = nn.Sequential(
            *_conv_bn(in_ch, width, 1), nn.ReLU(inplace=True),
            *_conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),
            *_conv_bn(width, out_ch, 1),
        )
        self.shortcut = _shortcut(in_ch, out_ch, stride)

    def forward(self, x: Tensor) -> Tensor:
        return (self.body(x) + self.shortcut(x)).relu()


class ResNet(nn.Module):
    """A stem, four stages (widths ``base_width`` x 1, 2, 4, 8; all but the first halve the
    resolution), global average pooling and a linear classifier."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        blocks_per_stage: tuple[int, int, int, int],
        *,
        base_width: int,
        classes: int,
        imagenet_stem: bool,
    ) -> None:
        super().__init__()
        if imagenet_stem:
            stem = [*_conv_bn(3, base_width, 7, stride=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
        else:
            stem = [*_conv_bn(3, base_width, 3), nn.ReLU(inplace=True)]
        layers: list[nn.Module] = list(stem)
        in_ch = base_width
        for stage, blocks in enumerate(blocks_per_stage):
            width = base_width * 2**stage
            for i in range(blocks):
                layers.append(block(in_ch, width, stride=2 if stage > 0 and i == 0 else 1))
                in_ch = width * block.expansion
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_ch, classes)]
        self.layers = nn.Sequential(*layers)

    def forward(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) images -> (B, classes) logits."""
        return self.layers(images)


def resnet18_cifar(*, base_width: int = 64, classes: int = 10) -> ResNet:
    return ResNet(BasicBlock, (2, 2, 2, 2), base_width=base_width, classes=classes, imagenet_stem=False)


def resnet50_imagenet(*, base_width: int = 64, classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, (3, 4, 6, 3), base_width=base_width, classes=classes, imagenet_stem=True)
