"""Layers with torch.nn's names, constructor arguments, defaults and parameter names."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from plait.errors import PlaitError, ShapeError
from plait.frontends.native.tensor import Tensor
from plait.graph.autodiff import no_grad
from plait.nn import functional as F
from plait.nn import init
from plait.nn.module import _PENDING, Module, Parameter, realize_all

# ---------------------------------------------------------------- containers


class Sequential(Module):
    def __init__(self, *mods: Module):
        super().__init__()
        if len(mods) == 1 and isinstance(mods[0], dict):
            for name, m in mods[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(mods):
                self.add_module(str(i), m)

    def __getitem__(self, i: int) -> Module:
        mods = list(self._modules.values())
        return mods[i]  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for m in self._modules.values() if m is not None)

    def append(self, m: Module) -> Sequential:
        self.add_module(str(len(self._modules)), m)
        return self

    def forward(self, x: Any) -> Any:
        for m in self:
            x = m(x)
        return x


class ModuleList(Module):
    def __init__(self, mods: Iterable[Module] | None = None):
        super().__init__()
        for m in mods or []:
            self.append(m)

    def append(self, m: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), m)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for m in self._modules.values() if m is not None)


class Identity(Module):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return x


# ---------------------------------------------------------------- linear, convolution, embedding


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: str | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        b = init.fan_in_bound(in_features)
        self.weight = Parameter(init.uniform((out_features, in_features), b), device=device)
        self.bias = Parameter(init.uniform((out_features,), b), device=device) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ShapeError(f"{self!r}: input shape {x.shape} must end with in_features={self.in_features}")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: F.IntPair,
        stride: F.IntPair = 1,
        padding: F.IntPair | str = 0,
        dilation: F.IntPair = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: str | None = None,
    ):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ShapeError(
                f"Conv2d: groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}"
            )
        if padding_mode != "zeros":
            raise PlaitError(f"Conv2d: padding_mode {padding_mode!r} is not supported (only 'zeros')")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = F._pair(kernel_size, "kernel_size")
        self.stride, self.dilation = F._pair(stride, "stride"), F._pair(dilation, "dilation")
        self.padding = padding if isinstance(padding, str) else F._pair(padding, "padding")
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        b = init.fan_in_bound(int(np.prod(shape[1:])))
        self.weight = Parameter(init.uniform(shape, b), device=device)
        self.bias = Parameter(init.uniform((out_channels,), b), device=device) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in (3, 4) or x.shape[-3] != self.in_channels:
            raise ShapeError(f"{self!r}: expected input (N, {self.in_channels}, H, W), got shape {x.shape}")
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, groups={self.groups}"
        )


class Embedding(Module):
    def __init__(
        self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, device: str | None = None
    ):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        w = init.normal((num_embeddings, embedding_dim))
        if padding_idx is not None:
            w[padding_idx] = 0.0
        self.weight = Parameter(w, device=device)

    def forward(self, idx: Tensor) -> Tensor:
        return F.embedding(idx, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


# ---------------------------------------------------------------- normalisation


class _BatchNorm(Module):
    _ndims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: str | None = None,
    ):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        c = num_features
        self.weight = Parameter(np.ones(c, np.float32), device=device) if affine else None
        self.bias = Parameter(np.zeros(c, np.float32), device=device) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", Tensor.from_numpy(np.zeros(c, np.float32), device=device))
            self.register_buffer("running_var", Tensor.from_numpy(np.ones(c, np.float32), device=device))
            self.register_buffer("num_batches_tracked", Tensor.from_numpy(np.zeros((), np.int64), device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self._ndims or x.shape[1] != self.num_features:
            raise ShapeError(
                f"{self!r}: expected {self._ndims}-d input with {self.num_features} channels, got {x.shape}"
            )
        use_batch = self.training or not self.track_running_stats
        if not use_batch:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        out, mean, var = F.batch_norm_stats(x, None, None, self.weight, self.bias, True, self.eps)
        if self.training and self.track_running_stats:
            assert mean is not None and var is not None
            self._update_stats(mean, var)
        return out

    def _update_stats(self, mean: Tensor, var: Tensor) -> None:
        """Lazy running-statistics update; the optimizer step (or state_dict) realizes it with everything else."""
        buf = self._buffers
        rm, rv, nbt = buf["running_mean"], buf["running_var"], buf["num_batches_tracked"]
        assert rm is not None and rv is not None and nbt is not None
        realize_all([rm.node, rv.node, nbt.node])
        with no_grad():
            # momentum None: a cumulative moving average, which needs the count on the host
            m = self.momentum if self.momentum is not None else 1.0 / float(int(nbt.item()) + 1)
            buf["running_mean"] = rm * (1.0 - m) + mean * m
            buf["running_var"] = rv * (1.0 - m) + var * m
            buf["num_batches_tracked"] = nbt + 1
        _PENDING.add(self)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    _ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _ndims = (4,)


class LayerNorm(Module):
    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: str | None = None,
    ):
        super().__init__()
        shp = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shp, eps
        self.weight = Parameter(np.ones(shp, np.float32), device=device) if elementwise_affine else None
        self.bias = Parameter(np.zeros(shp, np.float32), device=device) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNorm(Module):
    def __init__(
        self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device: str | None = None
    ):
        super().__init__()
        if num_channels % num_groups:
            raise ShapeError(f"GroupNorm: num_groups={num_groups} must divide num_channels={num_channels}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Parameter(np.ones(num_channels, np.float32), device=device) if affine else None
        self.bias = Parameter(np.zeros(num_channels, np.float32), device=device) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


# ---------------------------------------------------------------- pooling, reshaping, resampling


class MaxPool2d(Module):
    def __init__(
        self,
        kernel_size: F.IntPair,
        stride: F.IntPair | None = None,
        padding: F.IntPair = 0,
        dilation: F.IntPair = 1,
        ceil_mode: bool = False,
    ):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


class AvgPool2d(Module):
    def __init__(
        self,
        kernel_size: F.IntPair,
        stride: F.IntPair | None = None,
        padding: F.IntPair = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size: F.IntPair):
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(x, self.output_size)


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)


class Upsample(Module):
    def __init__(
        self,
        size: F.IntPair | None = None,
        scale_factor: float | None = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
    ):
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners)


class Dropout(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise PlaitError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)


# ---------------------------------------------------------------- activations


class _Act(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()


class ReLU(_Act):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class ReLU6(_Act):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu6(x)


class SiLU(_Act):
    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class Hardswish(_Act):
    def forward(self, x: Tensor) -> Tensor:
        return F.hardswish(x)


class Hardsigmoid(_Act):
    def forward(self, x: Tensor) -> Tensor:
        return F.hardsigmoid(x)


class Sigmoid(_Act):
    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Tanh(_Act):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.dim)


class LogSoftmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.log_softmax(x, self.dim)


# ---------------------------------------------------------------- losses


class CrossEntropyLoss(Module):
    def __init__(
        self,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ):
        super().__init__()
        self.weight, self.ignore_index, self.reduction, self.label_smoothing = (
            weight,
            ignore_index,
            reduction,
            label_smoothing,
        )

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        self.weight, self.ignore_index, self.reduction = weight, ignore_index, reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)


class BCEWithLogitsLoss(Module):
    def __init__(self, weight: Tensor | None = None, reduction: str = "mean", pos_weight: Tensor | None = None):
        super().__init__()
        self.weight, self.reduction, self.pos_weight = weight, reduction, pos_weight

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction, self.pos_weight)
