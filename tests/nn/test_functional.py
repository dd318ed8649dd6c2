"""Every plait.nn.functional operator, forward and backward, against torch.nn.functional on every device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import plait
import plait.nn.functional as F
from tests.helpers import check_op

# (id, plait fn, torch fn (None: same call on torch.nn.functional names), input shapes/arrays, check_op kwargs)
Case = tuple[str, Callable[..., Any], Callable[..., Any], list[Any], dict[str, Any]]


def same(name: str, **kw: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    return (lambda *a: getattr(F, name)(*a, **kw)), (lambda *a: getattr(TF, name)(*a, **kw))


TARGETS = np.array([1, 0, 3, -100, 2])
TARGETS_2D = np.array([[1, 0, 2], [2, 2, -100]])
TOKENS = np.array([[1, 0, 3], [3, 3, 2]])

CASES: list[Case] = [
    ("conv2d_stride_pad", *same("conv2d", stride=2, padding=1), [(2, 3, 7, 7), (4, 3, 3, 3), (4,)], {}),
    ("conv2d_1x1", *same("conv2d"), [(2, 4, 5, 5), (6, 4, 1, 1)], {}),
    ("conv2d_dilation_groups", *same("conv2d", padding=2, dilation=2, groups=2), [(1, 4, 6, 6), (6, 2, 3, 3)], {}),
    ("conv2d_depthwise", *same("conv2d", stride=2, padding=1, groups=4), [(2, 4, 6, 6), (4, 1, 3, 3), (4,)], {}),
    ("conv2d_rect", *same("conv2d", stride=(2, 1), padding=(0, 1)), [(1, 2, 5, 6), (3, 2, 2, 3)], {}),
    ("linear", *same("linear"), [(3, 5), (4, 5), (4,)], {}),
    ("linear_3d", *same("linear"), [(2, 3, 5), (4, 5)], {}),
    ("max_pool2d", *same("max_pool2d", kernel_size=3, stride=2, padding=1), [(2, 3, 7, 7)], {}),
    ("max_pool2d_ceil", *same("max_pool2d", kernel_size=2, ceil_mode=True), [(1, 2, 5, 5)], {}),
    (
        "max_pool2d_dilated_ceil",
        *same("max_pool2d", kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True),
        [(1, 2, 8, 7)],
        {},
    ),
    ("avg_pool2d", *same("avg_pool2d", kernel_size=2), [(2, 3, 6, 6)], {}),
    # windows that tile the input: with a gradient these run as a reduction over the window axes
    ("max_pool2d_tiled", *same("max_pool2d", kernel_size=2), [(2, 3, 8, 6)], {}),
    ("max_pool2d_tiled_3x2", *same("max_pool2d", kernel_size=(3, 2)), [(1, 2, 6, 4)], {}),
    ("avg_pool2d_divisor", *same("avg_pool2d", kernel_size=2, divisor_override=3), [(1, 2, 4, 4)], {}),
    ("avg_pool2d_pad", *same("avg_pool2d", kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), [(1, 2, 6, 6)], {}),
    ("adaptive_avg_pool2d_1", *same("adaptive_avg_pool2d", output_size=1), [(2, 3, 4, 5)], {}),
    ("adaptive_avg_pool2d_uneven", *same("adaptive_avg_pool2d", output_size=(3, 2)), [(1, 2, 7, 5)], {}),
    ("relu", *same("relu"), [(20,)], {}),
    ("relu6", *same("relu6"), [(40,)], {"low": -3, "high": 9}),
    ("leaky_relu", *same("leaky_relu", negative_slope=0.2), [(20,)], {}),
    ("gelu", *same("gelu"), [(20,)], {}),
    ("gelu_tanh", *same("gelu", approximate="tanh"), [(20,)], {}),
    ("silu", *same("silu"), [(20,)], {}),
    ("hardswish", *same("hardswish"), [(40,)], {"low": -5, "high": 5}),
    ("hardsigmoid", *same("hardsigmoid"), [(40,)], {"low": -5, "high": 5}),
    ("sigmoid", F.sigmoid, torch.sigmoid, [(20,)], {}),
    ("tanh", F.tanh, torch.tanh, [(20,)], {}),
    ("softmax", *same("softmax", dim=1), [(3, 5, 2)], {}),
    ("log_softmax", *same("log_softmax", dim=-1), [(4, 6)], {}),
    ("batch_norm_train", lambda x, w, b: F.batch_norm(x, None, None, w, b, True), lambda x, w, b: TF.batch_norm(x, None, None, w, b, True), [(3, 4, 2, 2), (4,), (4,)], {}),
    ("batch_norm_eval", lambda x, m, v, w, b: F.batch_norm(x, m.detach(), v.detach(), w, b), lambda x, m, v, w, b: TF.batch_norm(x, m.detach(), v.detach(), w, b), [(3, 4, 2, 2), (4,), np.linspace(0.5, 2, 4).astype(np.float32), (4,), (4,)], {}),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b), lambda x, w, b: TF.layer_norm(x, (5,), w, b), [(3, 5), (5,), (5,)], {}),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), lambda x, w, b: TF.group_norm(x, 2, w, b), [(2, 4, 3, 3), (4,), (4,)], {}),
    ("embedding", lambda w, i: F.embedding(i, w), lambda w, i: TF.embedding(i, w), [(5, 4), TOKENS], {}),
    ("embedding_padding", lambda w, i: F.embedding(i, w, padding_idx=3), lambda w, i: TF.embedding(i, w, padding_idx=3), [(5, 4), TOKENS], {}),
    ("cat", lambda a, b: plait.cat([a, b], 1), lambda a, b: torch.cat([a, b], 1), [(2, 3), (2, 4)], {}),
    ("stack", lambda a, b: plait.stack([a, b], 1), lambda a, b: torch.stack([a, b], 1), [(2, 3), (2, 3)], {}),
    ("split", lambda a: a.split([1, 3], 1), lambda a: a.split([1, 3], 1), [(2, 4)], {}),
    ("flatten", lambda a: F.flatten(a, 1), lambda a: torch.flatten(a, 1), [(2, 3, 4)], {}),
    ("pad", *same("pad", pad=(1, 2, 0, 1), value=0.5), [(2, 3, 4)], {}),
    ("upsample_nearest", *same("interpolate", scale_factor=2, mode="nearest"), [(1, 2, 3, 4)], {}),
    ("upsample_nearest_size", *same("interpolate", size=(5, 3), mode="nearest"), [(1, 2, 3, 4)], {}),
    ("upsample_bilinear", *same("interpolate", scale_factor=2, mode="bilinear"), [(1, 2, 3, 4)], {}),
    ("upsample_bilinear_ac", *same("interpolate", size=(5, 7), mode="bilinear", align_corners=True), [(1, 2, 3, 4)], {}),
    ("sdpa", *same("scaled_dot_product_attention"), [(2, 3, 4), (2, 5, 4), (2, 5, 6)], {}),
    ("sdpa_causal", *same("scaled_dot_product_attention", is_causal=True), [(1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 4, 3)], {}),
    ("sdpa_bool_mask", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, plait.tensor(np.tril(np.ones((3, 4), bool)), device=q.device)), lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, torch.tensor(np.tril(np.ones((3, 4), bool)))), [(2, 3, 4), (2, 4, 4), (2, 4, 2)], {}),
    ("sdpa_float_mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m), lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, m.detach()), [(2, 3, 4), (2, 4, 4), (2, 4, 2), (3, 4)], {}),
    ("cross_entropy", *same("cross_entropy"), [(5, 4), TARGETS], {}),
    ("cross_entropy_smooth_sum", *same("cross_entropy", label_smoothing=0.1, reduction="sum"), [(5, 4), TARGETS], {}),
    ("cross_entropy_ignore_2d", *same("cross_entropy", ignore_index=1), [(2, 3, 3), TARGETS_2D.clip(0)], {}),
    ("cross_entropy_weight", lambda x, t, w: F.cross_entropy(x, t, w.detach()), lambda x, t, w: TF.cross_entropy(x, t, w.detach()), [(5, 4), TARGETS, np.array([1.0, 2.0, 0.5, 1.5], np.float32)], {}),
    ("cross_entropy_probs", *same("cross_entropy", label_smoothing=0.2), [(3, 4), np.full((3, 4), 0.25, np.float32)], {}),
    ("nll_loss", *same("nll_loss"), [(5, 4), TARGETS], {}),
    ("nll_loss_none", *same("nll_loss", reduction="none"), [(5, 4), TARGETS], {}),
    ("mse_loss", *same("mse_loss"), [(3, 4), (3, 4)], {}),
    ("bce_with_logits", lambda x, t: F.binary_cross_entropy_with_logits(x, t.detach()), lambda x, t: TF.binary_cross_entropy_with_logits(x, t.detach()), [(3, 4), np.random.default_rng(1).random((3, 4)).astype(np.float32)], {}),
    ("bce_with_logits_pos_weight", lambda x, t, p: F.binary_cross_entropy_with_logits(x, t.detach(), pos_weight=p.detach()), lambda x, t, p: TF.binary_cross_entropy_with_logits(x, t.detach(), pos_weight=p.detach()), [(3, 4), np.random.default_rng(2).random((3, 4)).astype(np.float32), np.array([1.0, 2.0, 0.5, 3.0], np.float32)], {}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_functional(case: Case, device: str) -> None:
    _, fn, torch_fn, inputs, kw = case
    check_op(fn, inputs, device, torch_fn=torch_fn, **kw)


def test_dropout_reproducible(device: str) -> None:
    x = np.random.default_rng(0).standard_normal((40, 50)).astype(np.float32)
    outs = []
    for _ in range(2):
        xt = plait.tensor(x, device=device, requires_grad=True)
        y = F.dropout(xt, 0.3, training=True, seed=7)
        y.sum().backward()
        outs.append((y.numpy(), xt.grad.numpy()))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    keep = outs[0][0] != 0
    assert 0.6 < keep.mean() < 0.8  # p = 0.3
    np.testing.assert_allclose(outs[0][0][keep], x[keep] / 0.7, rtol=1e-6)
    np.testing.assert_allclose(outs[0][1], keep / 0.7, rtol=1e-6)  # gradient: the same mask, scaled
    assert F.dropout(plait.tensor(x, device=device), 0.3, training=False).numpy().tolist() == x.tolist()


def test_bad_inputs(device: str) -> None:
    x = plait.tensor(np.zeros((2, 3, 5, 5), np.float32), device=device)
    with pytest.raises(plait.ShapeError, match="channels"):
        F.conv2d(x, plait.tensor(np.zeros((4, 2, 3, 3), np.float32), device=device))
    with pytest.raises(plait.DTypeError):
        F.conv2d(x, plait.tensor(np.zeros((4, 3, 3, 3), np.int32), device=device))
    with pytest.raises(plait.ShapeError, match="in_features"):
        F.linear(
            plait.tensor(np.zeros((2, 3), np.float32), device=device),
            plait.tensor(np.zeros((4, 5), np.float32), device=device),
        )
    with pytest.raises(plait.ShapeError, match="target shape"):
        F.cross_entropy(
            plait.tensor(np.zeros((2, 3), np.float32), device=device),
            plait.tensor(np.zeros(3, np.int64), device=device),
        )
    with pytest.raises(plait.DTypeError):
        F.nll_loss(
            plait.tensor(np.zeros((2, 3), np.float32), device=device),
            plait.tensor(np.zeros(2, np.float32), device=device),
        )
    with pytest.raises(plait.ShapeError, match="out of range"):
        F.embedding(plait.tensor([0, 9], device=device), plait.tensor(np.zeros((5, 2), np.float32), device=device))
    y = plait.tensor(np.ones((2, 2), np.float32), device=device, requires_grad=True) * 2
    with pytest.raises(plait.PlaitError, match="non-scalar"):
        y.backward()
