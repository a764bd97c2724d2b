"""PyTorch twins of coltrain's models (include/coltrain/models/), with the same attribute names, so
that their state_dicts match coltrain's parameter names one to one."""

import torch
from torch import nn
import torch.nn.functional as F


class Mlp(nn.Module):
    """784-128-256-10 with ReLU (coltrain::models::Mlp)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class MnistConvNet(nn.Module):
    """PyTorch's examples/mnist network (coltrain::models::MnistConvNet)."""

    def __init__(self, dropout=True):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25 if dropout else 0.0)
        self.dropout2 = nn.Dropout(0.5 if dropout else 0.0)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)


class CifarNet(nn.Module):
    """Three 3x3 convolutions (32, 64, 128) with ReLU and 2x2 pooling, fc 120-84-10
    (coltrain::models::CifarNet)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = nn.Linear(2048, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); projection shortcut on a shape change."""

    def __init__(self, in_channels, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for CIFAR (coltrain::models::ResNet<Depth>) and ResNet-18 (ResNet18)."""

    def __init__(self, stages, stem_channels):
        super().__init__()
        self.conv1 = nn.Conv2d(3, stem_channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_channels)
        channels = stem_channels
        for index, (width, blocks, stride) in enumerate(stages, start=1):
            layers = []
            for block in range(blocks):
                layers.append(BasicBlock(channels, width, stride if block == 0 else 1))
                channels = width
            setattr(self, f"layer{index}", nn.Sequential(*layers))
        self.stage_count = len(stages)
        self.linear = nn.Linear(channels, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for index in range(1, self.stage_count + 1):
            x = getattr(self, f"layer{index}")(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.linear(x)


def resnet(depth):
    if (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNets have depth 6n + 2, not {depth}")
    n = (depth - 2) // 6
    return CifarResNet([(16, n, 1), (32, n, 2), (64, n, 2)], 16)


def resnet18():
    return CifarResNet([(64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2)], 64)


# name -> (constructor, input shape of one sample)
MODELS = {
    "mlp": (Mlp, (1, 28, 28)),
    "mnist_convnet": (MnistConvNet, (1, 28, 28)),
    "cifar_net": (CifarNet, (3, 32, 32)),
    "resnet20": (lambda: resnet(20), (3, 32, 32)),
    "resnet32": (lambda: resnet(32), (3, 32, 32)),
    "resnet56": (lambda: resnet(56), (3, 32, 32)),
    "resnet18": (resnet18, (3, 32, 32)),
}
