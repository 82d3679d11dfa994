"""Model definitions the zoo builds that are not in torchvision.

- ``BertEncoderOnly``: a transformers ``BertModel`` (eager attention, so the
  MatMul->Softmax chains are explicit ops) that returns the last hidden state.
- ``YoloStyle``: a small YOLO-style detector, Conv+BN+SiLU everywhere with CSP
  bottlenecks that add a residual.
- Teaching models: one Conv-BN-ReLU block, one residual block, one transformer
  encoder block with attention written out op by op.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class BertEncoderOnly(nn.Module):
    """BERT returning ``last_hidden_state`` for ``(input_ids, attention_mask)``."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    @classmethod
    def from_config_sizes(cls, layers: int, hidden: int, heads: int, intermediate: int) -> "BertEncoderOnly":
        from transformers import BertConfig, BertModel

        config = BertConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            attn_implementation="eager",
        )
        return cls(BertModel(config, add_pooling_layer=False))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class ConvBnAct(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> activation: the YOLO 'Conv' unit."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, p: int | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2 if p is None else p, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """x + ConvBnAct3x3(ConvBnAct1x1(x)): the residual add YOLO models repeat."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.cv1 = ConvBnAct(c, c, 1)
        self.cv2 = ConvBnAct(c, c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.cv2(self.cv1(x))


class C3(nn.Module):
    """CSP block: two 1x1 branches, bottlenecks on one, concat, 1x1 fuse."""

    def __init__(self, c_in: int, c_out: int, n: int = 1) -> None:
        super().__init__()
        c_ = c_out // 2
        self.cv1 = ConvBnAct(c_in, c_, 1)
        self.cv2 = ConvBnAct(c_in, c_, 1)
        self.m = nn.Sequential(*(Bottleneck(c_) for _ in range(n)))
        self.cv3 = ConvBnAct(2 * c_, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), dim=1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools, concat."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        c_ = c_in // 2
        self.cv1 = ConvBnAct(c_in, c_, 1)
        self.cv2 = ConvBnAct(c_ * 4, c_out, 1)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat((x, y1, y2, self.pool(y2)), dim=1))


class YoloStyle(nn.Module):
    """A compact YOLOv5-like backbone, neck and 3-scale head (80 classes, 3 anchors)."""

    def __init__(self, width: int = 32, classes: int = 80) -> None:
        super().__init__()
        w = width
        self.stem = ConvBnAct(3, w, 6, 2, 2)
        self.stage1 = nn.Sequential(ConvBnAct(w, 2 * w, 3, 2), C3(2 * w, 2 * w, 1))
        self.stage2 = nn.Sequential(ConvBnAct(2 * w, 4 * w, 3, 2), C3(4 * w, 4 * w, 2))
        self.stage3 = nn.Sequential(ConvBnAct(4 * w, 8 * w, 3, 2), C3(8 * w, 8 * w, 3))
        self.stage4 = nn.Sequential(ConvBnAct(8 * w, 16 * w, 3, 2), C3(16 * w, 16 * w, 1), SPPF(16 * w, 16 * w))
        self.lat4 = ConvBnAct(16 * w, 8 * w, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.neck3 = C3(16 * w, 8 * w, 1)
        self.lat3 = ConvBnAct(8 * w, 4 * w, 1)
        self.neck2 = C3(8 * w, 4 * w, 1)
        outputs = 3 * (classes + 5)
        self.head = nn.ModuleList(nn.Conv2d(c, outputs, 1) for c in (4 * w, 8 * w, 16 * w))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.stem(x)
        x = self.stage1(x)
        p3 = self.stage2(x)
        p4 = self.stage3(p3)
        p5 = self.stage4(p4)
        l4 = self.lat4(p5)
        n4 = self.neck3(torch.cat((self.up(l4), p4), dim=1))
        l3 = self.lat3(n4)
        n3 = self.neck2(torch.cat((self.up(l3), p3), dim=1))
        return self.head[0](n3), self.head[1](n4), self.head[2](p5)


class ConvBnReluBlock(nn.Module):
    """Teaching: conv -> temp1 -> bn -> temp2 -> relu, the seed's first example."""

    def __init__(self, c_in: int = 3, c_out: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class ResidualBlock(nn.Module):
    """Teaching: a ResNet basic block, relu(bn2(conv2(relu(bn1(conv1 x)))) + x)."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


class TransformerBlock(nn.Module):
    """Teaching: post-norm encoder block with attention written op by op.

    x -> qkv -> (q @ k^T) * scale -> softmax -> @ v -> proj -> + x -> LayerNorm
      -> Linear -> GELU -> Linear -> + -> LayerNorm
    """

    def __init__(self, dim: int = 64, heads: int = 4, mlp: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp * dim, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).reshape(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)  # 3 x (b, h, s, d/h)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))  # (b, h, s, s)
        attn = torch.matmul(torch.softmax(scores, dim=-1), v)  # (b, h, s, d/h)
        attn = attn.transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.proj(attn))
        return self.norm2(x + self.fc2(self.act(self.fc1(x))))
