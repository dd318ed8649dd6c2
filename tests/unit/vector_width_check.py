"""Run by tests/unit/test_vector_widths.py in a fresh process with PLAIT_CPU_VECTOR set: the cpu kernels written for
that vector width (plait/codegen/simd.py) against PyTorch, on small inputs that still reach every cpu kernel family
(the fused stem and pool, the stride-2 lanes convolution, Winograd, the 1x1 lanes products, the GEMM and GEMV, the
inverted-residual block, depthwise convolutions, the direct stem, and the training kernels: weight gradients, batch
norm statistics, depthwise gradients). Prints one line per check and exits non-zero on the first mismatch."""

from __future__ import annotations

import sys

import numpy as np
import torch

import plait
from plait.codegen import gemm_c
from plait.models.torch_reference import build


def check(what: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{what} at vector width {gemm_c.VW}")
    print(f"ok {what}", flush=True)


def inference(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    t = build(name, num_classes=10).eval()
    p = getattr(plait.models, name)(num_classes=10).eval()
    p.load_state_dict(t.state_dict())
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    f = plait.jit(lambda v: p(v), device="cpu")  # a replayed plan: the plan-only kernels (packed weights) run
    want = t(torch.tensor(x)).detach().numpy()
    check(f"{name} {shape} plan", f(x), want, 1e-3, 1e-4)


def block_without_expand(c1: int, m2: int, shape: tuple[int, ...]) -> None:
    """mobilenet_v2's first block in small without the stem before it (so it copies its input channels into the
    fused block's scratch): ReLU6, a depthwise window and the projection, with batch-norm-style epilogues."""
    import plait.nn.functional as F

    rng = np.random.default_rng(1)
    ws = [rng.standard_normal(s).astype(np.float32) / 3 for s in ((c1, 1, 3, 3), (m2, c1, 1, 1), (c1,), (c1,))]
    wd, w2, sd, hd = (plait.tensor(a, device="cpu") for a in ws)

    def block(t: plait.Tensor) -> plait.Tensor:
        a = F.conv2d((t * 2.0).clip(0.0, 6.0), wd, padding=1, groups=c1) * sd.reshape(c1, 1, 1) + hd.reshape(c1, 1, 1)
        return F.conv2d(a.clip(0.0, 6.0), w2)

    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    tw = [torch.tensor(a) for a in ws]
    conv = torch.nn.functional.conv2d
    a = conv((torch.tensor(x) * 2.0).clamp(0, 6), tw[0], padding=1, groups=c1) * tw[2].reshape(c1, 1, 1)
    want = conv((a + tw[3].reshape(c1, 1, 1)).clamp(0, 6), tw[1]).numpy()
    check(f"block without expand {c1}->{m2} {shape}", plait.jit(block, device="cpu")(x), want, 1e-4, 1e-4)


def training(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    t = build(name, num_classes=10)
    p = getattr(plait.models, name)(num_classes=10)
    p.load_state_dict(t.state_dict())
    for net in (t, p):  # dropout (mobilenet_v2's classifier) draws differently in each framework
        for mod in net.modules():
            if type(mod).__name__ == "Dropout":
                mod.p = 0.0
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])
    lp = plait.nn.functional.cross_entropy(p(plait.tensor(x, device="cpu")), plait.tensor(y, device="cpu"))
    lt = torch.nn.functional.cross_entropy(t(torch.tensor(x)), torch.tensor(y))
    lp.backward()
    lt.backward()
    check(f"{name} {shape} loss", np.array(lp.item()), np.array(lt.item()), 2e-3, 0)
    # small batches through batch norm amplify float32 summation-order differences (the same at every width, and
    # in the code before vector widths were a choice): each gradient is compared as a whole, by its norm (a kernel
    # computing wrong gives errors of order 1)
    for (k, a), (_, b) in zip(p.named_parameters(), t.named_parameters(), strict=True):
        ref = b.grad.numpy()
        # (a batch norm's shift that another batch norm follows has a gradient of zero: ~1e-7 of rounding here)
        err = float(np.linalg.norm(a.grad.numpy() - ref) / max(float(np.linalg.norm(ref)), 1e-3))
        assert err < 5e-2, f"{name} grad {k}: relative error {err:.2e} at vector width {gemm_c.VW}"
    print(f"ok {name} {shape} gradients", flush=True)


def main() -> None:
    assert gemm_c.VW == int(sys.argv[1]), (gemm_c.VW, sys.argv[1])
    inference("resnet50", (1, 3, 112, 112))
    inference("mobilenet_v2", (2, 3, 64, 64))
    inference("alexnet", (1, 3, 63, 63))
    block_without_expand(48, 16, (2, 48, 16, 16))
    training("resnet18", (2, 3, 64, 64))
    training("mobilenet_v2", (4, 3, 64, 64))
    training("cifar_cnn", (4, 3, 32, 32))


if __name__ == "__main__":
    main()
