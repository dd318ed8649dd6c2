"""plait.Tensor: a lazy tensor. Ops build graph nodes; `realize()`/`numpy()` compile and run what is pending.

>>> import plait
>>> x = plait.tensor([[1.0, 2.0], [3.0, 4.0]], device="cpu")
>>> ((x * 2 + 1).sum(axis=1)).numpy().tolist()
[8.0, 16.0]
"""

from __future__ import annotations

import builtins
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from plait import dtypes
from plait.dtypes import DType
from plait.errors import DeviceError, DTypeError, PlaitError, ShapeError
from plait.graph import autodiff
from plait.graph.node import Node, toposort
from plait.graph.ops import elementwise as ew
from plait.graph.ops import movement as mv
from plait.graph.ops import reduce as rd
from plait.graph.ops.matmul import matmul as _matmul
from plait.runtime import canonical, default_device, get_device
from plait.schedule.plan import attach, differentiated, hold, read, realize, record_upload

Scalar = int | float | bool
_LEAVES: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
# bumped when something outside a step's arguments changes which kernels the step launches (a module's train/eval
# mode, a leaf's requires_grad); plait.compile_step traces again when it moved
STEP_SHAPING_CHANGES = [0]


def _norm_axes(axis: int | Sequence[int] | None, ndim: int, op: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"{op}: axis {a} is out of range for a tensor with {ndim} dims")
        out.append(a % ndim if ndim else 0)
    return tuple(out)


def broadcast_shape(*shapes: tuple[int, ...], op: str = "broadcast") -> tuple[int, ...]:
    """The NumPy broadcast of `shapes` (axes aligned from the right; each pair equal or one of them 1)."""
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(nd):
        dims = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0} - {1}
        if len(dims) > 1:
            raise ShapeError(
                f"{op}: shapes {' and '.join(map(str, shapes))} cannot be broadcast together (axis {i - nd} has sizes"
                f" {sorted(dims)}; aligned from the right, sizes must match or be 1): reshape or slice an operand"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


class Tensor:
    """A lazily evaluated n-dimensional array on one device."""

    __slots__ = ("__weakref__", "grad", "node")

    def __init__(self, node: Node):
        self.node = node
        self.grad: Tensor | None = None
        hold(self)  # a realize keeps the values this tensor can still read (plan memory reuse)

    # ---------------------------------------------------------------- creation

    @staticmethod
    def from_numpy(arr: Any, dtype: Any = None, device: str | None = None, requires_grad: bool = False) -> Tensor:
        t = Tensor._upload(np.asarray(arr), dtype, device, None)
        if requires_grad:
            t.requires_grad_(True)
        return t

    @staticmethod
    def from_host(make: Callable[[], np.ndarray], device: str | None = None) -> Tensor:
        """A tensor of values made on the host by `make()` (a random mask) that a step replayed by
        plait.compile_step makes afresh on every replay, instead of keeping the traced value."""
        return Tensor._upload(np.asarray(make()), None, device, make)

    @staticmethod
    def _upload(a: np.ndarray, dtype: Any, device: str | None, remake: Callable[[], np.ndarray] | None) -> Tensor:
        dt = dtypes.to_dtype(dtype) if dtype is not None else dtypes.from_numpy_dtype(a.dtype)
        a = np.ascontiguousarray(a, dtype=dt.np).reshape(a.shape)  # ascontiguousarray turns 0-d into 1-d
        dev = get_device(canonical(device) if device else default_device())
        node = Node("buffer", (), None, tuple(a.shape), dt, dev.name)
        buf = dev.allocator.alloc(a.nbytes)
        if a.size:
            dev.allocator.copy_in(buf, a)
            record_upload(buf, a, remake)
        attach(node, buf)
        return Tensor(node)

    @staticmethod
    def full(shape: Sequence[builtins.int], value: Scalar, dtype: Any = None, device: str | None = None) -> Tensor:
        dt = (
            dtypes.to_dtype(dtype)
            if dtype is not None
            else (
                dtypes.float32
                if isinstance(value, float)
                else dtypes.bool_
                if isinstance(value, bool)
                else dtypes.int64
                if isinstance(value, int)
                else dtypes.float32
            )
        )
        dev = canonical(device) if device else default_device()
        return Tensor(ew.const(value, tuple(int(s) for s in shape), dt, dev))

    @staticmethod
    def zeros(*shape: Any, dtype: Any = "float32", device: str | None = None) -> Tensor:
        return Tensor.full(_shape_args(shape), 0, dtype, device)

    @staticmethod
    def ones(*shape: Any, dtype: Any = "float32", device: str | None = None) -> Tensor:
        return Tensor.full(_shape_args(shape), 1, dtype, device)

    @staticmethod
    def arange(
        start: builtins.int,
        stop: builtins.int | None = None,
        step: builtins.int = 1,
        dtype: Any = "int64",
        device: str | None = None,
    ) -> Tensor:
        if stop is None:
            start, stop = 0, start
        return Tensor.from_numpy(np.arange(start, stop, step), dtype=dtype, device=device)

    # ---------------------------------------------------------------- properties

    @property
    def shape(self) -> tuple[builtins.int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def device(self) -> str:
        return self.node.device

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def requires_grad(self) -> bool:
        return self.node.rg

    def requires_grad_(self, flag: bool = True) -> Tensor:
        if flag and not self.dtype.is_float:
            raise PlaitError(f"only floating-point tensors can require gradients, this one is {self.dtype.name}")
        if self.node.srcs and flag:
            raise PlaitError("requires_grad can only be set on leaf tensors; use .detach().requires_grad_()")
        if self.node.rg != flag:
            STEP_SHAPING_CHANGES[0] += 1
        self.node.rg = flag
        if flag:
            _LEAVES[self.node.uid] = self
        return self

    def numel(self) -> int:
        return self.node.size

    def size(self, dim: builtins.int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name}, device={self.device!r})"

    __hash__ = object.__hash__

    # ---------------------------------------------------------------- evaluation

    def realize(self) -> Tensor:
        realize([self.node])
        return self

    def numpy(self) -> np.ndarray:
        self.realize()
        return read(get_device(self.device), self.node.buffer, self.node)

    def item(self) -> Scalar:
        if self.node.size != 1:
            raise ShapeError(f"item() needs exactly one element, this tensor has shape {self.shape}")
        return self.numpy().reshape(()).item()  # type: ignore[no-any-return]

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, device: str) -> Tensor:
        dev = canonical(device)
        if dev == self.device:
            return self
        return Tensor.from_numpy(self.numpy(), device=dev, requires_grad=False)

    def detach(self) -> Tensor:
        self.realize()
        node = Node("buffer", (), None, self.shape, self.dtype, self.device)
        node.buffer = self.node.buffer
        return Tensor(node)

    def astype(self, dtype: Any) -> Tensor:
        return Tensor(ew.cast(self.node, dtypes.to_dtype(dtype)))

    cast = astype

    def float(self) -> Tensor:
        return self.astype(dtypes.float32)

    def half(self) -> Tensor:
        return self.astype(dtypes.float16)

    def long(self) -> Tensor:
        return self.astype(dtypes.int64)

    def int(self) -> Tensor:
        return self.astype(dtypes.int32)

    # ---------------------------------------------------------------- autograd

    def backward(self, gradient: Tensor | None = None) -> None:
        """Accumulate d(self)/d(leaf) into `.grad` of every leaf that requires grad; one compiled graph."""
        if not self.requires_grad:
            raise PlaitError("backward: this tensor does not require grad (no leaf with requires_grad=True feeds it)")
        if gradient is None:
            if self.node.size != 1:
                raise ShapeError(
                    f"backward on a non-scalar (shape {self.shape}) needs a gradient argument of that shape"
                )
            seed = ew.const(1.0, self.shape, self.dtype, self.device)
        else:
            if gradient.shape != self.shape:
                raise ShapeError(f"backward: gradient shape {gradient.shape} differs from tensor shape {self.shape}")
            seed = gradient.node
        leaves = [t for t in list(_LEAVES.values()) if t.node.rg]
        grads = autodiff.gradients(self.node, seed, [t.node for t in leaves])
        differentiated(toposort([self.node], through_realized=True))  # its saved values may now be reused
        updated = []
        with autodiff.no_grad():
            for t in leaves:
                g = grads.get(t.node.uid)
                if g is None:
                    continue
                t.grad = Tensor(g) if t.grad is None else Tensor(ew.add(t.grad.node, g))
                updated.append(t.grad.node)
        # The tensor itself (a loss) is realized with its gradients: the backward pass computes it anyway, and a
        # step that returns it would otherwise compute it again after the update (and read the updated weights).
        realize([self.node, *updated])

    # ---------------------------------------------------------------- elementwise

    def _other(self, x: Any) -> Tensor:
        if isinstance(x, Tensor):
            if x.device != self.device:
                raise DeviceError(f"tensors on different devices: {self.device} and {x.device}; move one with .to()")
            return x
        if isinstance(x, (bool, np.bool_)):
            dt = dtypes.bool_
        elif isinstance(x, (int, np.integer)):
            dt = self.dtype if self.dtype != dtypes.bool_ else dtypes.int64
        elif isinstance(x, (float, np.floating)):
            dt = self.dtype if self.dtype.is_float else dtypes.float32
        elif isinstance(x, (np.ndarray, list, tuple)):
            return Tensor.from_numpy(np.asarray(x), device=self.device)
        else:
            raise DTypeError(
                f"cannot combine a Tensor of shape {self.shape} with a {type(x).__name__}; use a Tensor, array or number"
            )
        return Tensor(ew.const(x, (), dt, self.device))

    def _binary(self, op: str, other: Any, reverse: bool = False) -> Tensor:
        """Broadcast and promote, then apply `op`. Tensors and arrays promote as in NumPy (dtypes.promote); a Python
        scalar is weak, as in PyTorch: it takes the tensor's dtype unless it is a float meeting an integer tensor.
        Dividing integers gives float32 (PyTorch's true division); integer pow stays integer."""
        o = self._other(other)
        a, b = (o, self) if reverse else (self, o)
        strong = isinstance(other, (Tensor, np.ndarray, list, tuple))
        dt = dtypes.promote(a.dtype, b.dtype) if strong else self._scalar_dtype(o)
        if op == "div" and not dt.is_float:
            dt = dtypes.float32
        if op in ("logical_and", "logical_or"):
            dt = dtypes.bool_
        if op == "sub" and dt == dtypes.bool_:
            raise DTypeError(f"sub: subtracting bool tensors (shapes {a.shape}, {b.shape}) is undefined; use ^ or cast")
        shape = broadcast_shape(a.shape, b.shape, op=op)
        return Tensor(ew.binary(op, a._prep(shape, dt), b._prep(shape, dt)))

    def _bitwise(self, op: str, other: Any) -> Tensor:
        """& | ^ are logical on bool tensors and bitwise on integer tensors (NumPy); floats are a DTypeError."""
        o = self._other(other)
        dt = (
            dtypes.promote(self.dtype, o.dtype)
            if isinstance(other, (Tensor, np.ndarray, list, tuple))
            else self._scalar_dtype(o)
        )
        if dt.is_float:
            raise DTypeError(
                f"{op}: needs bool or integer tensors, got {self.dtype.name} {self.shape} and {o.dtype.name} {o.shape}"
            )
        if dt == dtypes.bool_:
            op = {"bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "cmpne"}[op]
        shape = broadcast_shape(self.shape, o.shape, op=op)
        return Tensor(ew.binary(op, self._prep(shape, dt), o._prep(shape, dt)))

    def _scalar_dtype(self, o: Tensor) -> DType:
        if self.dtype == dtypes.bool_ or (o.dtype.is_float and not self.dtype.is_float):
            return o.dtype
        return self.dtype

    def _prep(self, shape: tuple[builtins.int, ...], dt: DType) -> Node:
        n = ew.cast(self.node, dt)
        if n.shape != shape:
            n = mv.reshape(n, (1,) * (len(shape) - len(n.shape)) + n.shape)
            n = mv.expand(n, shape)
        return n

    def _unary(self, op: str) -> Tensor:
        x = self
        if op in ew._FLOAT_UNARY and not self.dtype.is_float:
            x = self.float()
        return Tensor(ew.unary(op, x.node))

    def __add__(self, o: Any) -> Tensor:
        return self._binary("add", o)

    def __radd__(self, o: Any) -> Tensor:
        return self._binary("add", o, True)

    def __sub__(self, o: Any) -> Tensor:
        return self._binary("sub", o)

    def __rsub__(self, o: Any) -> Tensor:
        return self._binary("sub", o, True)

    def __mul__(self, o: Any) -> Tensor:
        return self._binary("mul", o)

    def __rmul__(self, o: Any) -> Tensor:
        return self._binary("mul", o, True)

    def __truediv__(self, o: Any) -> Tensor:
        return self._binary("div", o)

    def __rtruediv__(self, o: Any) -> Tensor:
        return self._binary("div", o, True)

    def __pow__(self, o: Any) -> Tensor:
        return self._binary("pow", o)

    def __rpow__(self, o: Any) -> Tensor:
        return self._binary("pow", o, True)

    def __mod__(self, o: Any) -> Tensor:
        return self._binary("mod", o)

    def __neg__(self) -> Tensor:
        return Tensor(ew.neg(self.node))

    def __lt__(self, o: Any) -> Tensor:
        return self._binary("cmplt", o)

    def __le__(self, o: Any) -> Tensor:
        return self._binary("cmple", o)

    def __gt__(self, o: Any) -> Tensor:
        return self._binary("cmpgt", o)

    def __ge__(self, o: Any) -> Tensor:
        return self._binary("cmpge", o)

    def __eq__(self, o: Any) -> Tensor:  # type: ignore[override]
        return self._binary("cmpeq", o)

    def __ne__(self, o: Any) -> Tensor:  # type: ignore[override]
        return self._binary("cmpne", o)

    def __and__(self, o: Any) -> Tensor:
        return self._bitwise("bitwise_and", o)

    __rand__ = __and__

    def __or__(self, o: Any) -> Tensor:
        return self._bitwise("bitwise_or", o)

    __ror__ = __or__

    def __xor__(self, o: Any) -> Tensor:
        return self._bitwise("bitwise_xor", o)

    __rxor__ = __xor__

    def __invert__(self) -> Tensor:
        """Logical not on bool tensors, bitwise not on integers (NumPy's ~)."""
        return Tensor(ew.unary("bitwise_not", self.node))

    def __matmul__(self, o: Tensor) -> Tensor:
        return self.matmul(o)

    def __bool__(self) -> bool:
        return bool(self.item())

    def maximum(self, o: Any) -> Tensor:
        return self._binary("maximum", o)

    def minimum(self, o: Any) -> Tensor:
        return self._binary("minimum", o)

    def logical_not(self) -> Tensor:
        return Tensor(ew.unary("logical_not", self.node))

    def exp(self) -> Tensor:
        return self._unary("exp")

    def log(self) -> Tensor:
        return self._unary("log")

    def sqrt(self) -> Tensor:
        return self._unary("sqrt")

    def abs(self) -> Tensor:
        return self._unary("abs")

    def relu(self) -> Tensor:
        return self._unary("relu")

    def sigmoid(self) -> Tensor:
        return self._unary("sigmoid")

    def tanh(self) -> Tensor:
        return self._unary("tanh")

    def sin(self) -> Tensor:
        return self._unary("sin")

    def cos(self) -> Tensor:
        return self._unary("cos")

    def erf(self) -> Tensor:
        return self._unary("erf")

    def floor(self) -> Tensor:
        return self._unary("floor")

    def ceil(self) -> Tensor:
        return self._unary("ceil")

    def sign(self) -> Tensor:
        return self._unary("sign")

    def reciprocal(self) -> Tensor:
        return self._unary("recip")

    def square(self) -> Tensor:
        return self * self

    def clip(self, lo: Any = None, hi: Any = None) -> Tensor:
        out = self
        if lo is not None:
            out = out.maximum(lo)
        if hi is not None:
            out = out.minimum(hi)
        return out

    clamp = clip

    def where(self, a: Any, b: Any) -> Tensor:
        """Elementwise `a if self else b` (self is the condition)."""
        return where(self, a, b)

    # ---------------------------------------------------------------- reductions

    def _reduce(self, op: str, axis: Any, keepdims: bool) -> Tensor:
        axes = _norm_axes(axis, self.ndim, op)
        x = self
        if op in ("sum", "prod") and (x.dtype == dtypes.bool_ or x.dtype == dtypes.int32):
            x = x.astype(dtypes.int64)  # NumPy and PyTorch sum and multiply small integers in int64
        if op in ("max", "min") and x.dtype == dtypes.bool_:
            x = x.astype(dtypes.int32)
        node = rd.reduce(op, x.node, axes) if self.ndim else x.node
        if not keepdims:
            node = mv.reshape(node, tuple(s for i, s in enumerate(self.shape) if i not in axes))
        out = Tensor(node)
        return out.astype(dtypes.bool_) if op in ("max", "min") and self.dtype == dtypes.bool_ else out

    def sum(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return self._reduce("sum", axis, keepdims)

    def prod(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return self._reduce("prod", axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return self._reduce("max", axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return self._reduce("min", axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        axes = _norm_axes(axis, self.ndim, "mean")
        n = math.prod(self.shape[a] for a in axes)
        x = self if self.dtype.is_float else self.float()
        return x.sum(axis, keepdims) / builtins.max(n, 1) if n else x.sum(axis, keepdims) * math.nan

    def var(self, axis: Any = None, keepdims: bool = False, correction: builtins.int = 0) -> Tensor:
        axes = _norm_axes(axis, self.ndim, "var")
        n = math.prod(self.shape[a] for a in axes)
        d = self - self.mean(axis, keepdims=True)
        return (d * d).sum(axis, keepdims) / builtins.max(n - correction, 1)

    def std(self, axis: Any = None, keepdims: bool = False, correction: builtins.int = 0) -> Tensor:
        return self.var(axis, keepdims, correction).sqrt()

    def _arg(self, op: str, axis: builtins.int | None, keepdims: bool) -> Tensor:
        x = self if axis is not None else self.reshape(-1)
        ax = _norm_axes(axis if axis is not None else 0, x.ndim, op)[0]
        if x.dtype == dtypes.bool_:
            x = x.astype(dtypes.int32)
        node = rd.arg_reduce(op, x.node, ax)
        if not keepdims:
            node = mv.reshape(node, tuple(s for i, s in enumerate(x.shape) if i != ax))
        elif axis is None:
            node = mv.reshape(node, (1,) * self.ndim)
        return Tensor(node)

    def argmax(self, axis: builtins.int | None = None, keepdims: bool = False) -> Tensor:
        return self._arg("argmax", axis, keepdims)

    def argmin(self, axis: builtins.int | None = None, keepdims: bool = False) -> Tensor:
        return self._arg("argmin", axis, keepdims)

    # ---------------------------------------------------------------- movement

    def reshape(self, *shape: Any) -> Tensor:
        shp = list(_shape_args(shape))
        if shp.count(-1) > 1:
            raise ShapeError(f"reshape: only one -1 allowed in {tuple(shp)}")
        if -1 in shp:
            known = math.prod(s for s in shp if s != -1)
            if known == 0 or self.node.size % known:
                raise ShapeError(f"reshape: cannot view shape {self.shape} as {tuple(shp)}")
            shp[shp.index(-1)] = self.node.size // known
        return Tensor(mv.reshape(self.node, tuple(shp)))

    view = reshape

    def flatten(self, start_dim: builtins.int = 0, end_dim: builtins.int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = start_dim % self.ndim, end_dim % self.ndim
        return self.reshape(*self.shape[:s], math.prod(self.shape[s : e + 1]), *self.shape[e + 1 :])

    def permute(self, *perm: Any) -> Tensor:
        p = _shape_args(perm)
        if len(p) != self.ndim:
            raise ShapeError(f"permute: {p} does not name each of the {self.ndim} axes of shape {self.shape}")
        return Tensor(mv.permute(self.node, tuple(a % self.ndim for a in p)))

    def transpose(self, a: builtins.int = -2, b: builtins.int = -1) -> Tensor:
        if self.ndim < 2:
            return self
        perm = list(range(self.ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(*perm)

    @property
    def T(self) -> Tensor:
        return self.permute(*reversed(range(self.ndim)))

    def expand(self, *shape: Any) -> Tensor:
        shp = _shape_args(shape)
        if len(shp) < self.ndim:
            raise ShapeError(f"expand: cannot broadcast shape {self.shape} to {shp}")
        src = (1,) * (len(shp) - self.ndim) + self.shape
        target = tuple(s if t == -1 else t for s, t in zip(src, shp, strict=True))
        return Tensor(mv.expand(mv.reshape(self.node, src), target))

    broadcast_to = expand

    def unsqueeze(self, dim: builtins.int) -> Tensor:
        d = dim % (self.ndim + 1)
        return self.reshape(*self.shape[:d], 1, *self.shape[d:])

    def squeeze(self, dim: builtins.int | None = None) -> Tensor:
        if dim is None:
            return self.reshape(*(s for s in self.shape if s != 1))
        d = dim % self.ndim
        return self.reshape(*(s for i, s in enumerate(self.shape) if i != d or s != 1))

    def pad(self, pads: Sequence[tuple[builtins.int, builtins.int]], value: builtins.float = 0.0) -> Tensor:
        """Pad each axis by (before, after); negative amounts crop."""
        if len(pads) != self.ndim:
            raise ShapeError(f"pad: need {self.ndim} (before, after) pairs for shape {self.shape}, got {len(pads)}")
        crop = tuple(
            (builtins.max(-a, 0), s - builtins.max(-b, 0), 1) for (a, b), s in zip(pads, self.shape, strict=True)
        )
        node = mv.shrink(self.node, crop)
        return Tensor(mv.pad(node, tuple((builtins.max(a, 0), builtins.max(b, 0)) for a, b in pads), value))

    def flip(self, axis: Any = None) -> Tensor:
        return Tensor(mv.flip(self.node, _norm_axes(axis, self.ndim, "flip")))

    def __getitem__(self, key: Any) -> Tensor:
        return _getitem(self, key)

    def matmul(self, o: Tensor) -> Tensor:
        return matmul(self, o)

    def split(self, sizes: builtins.int | Sequence[builtins.int], axis: builtins.int = 0) -> list[Tensor]:
        ax = axis % self.ndim
        n = self.shape[ax]
        parts = [sizes] * (-(-n // sizes)) if isinstance(sizes, int) else list(sizes)
        if isinstance(sizes, int):
            parts[-1] = n - sizes * (len(parts) - 1)
        if sum(parts) != n:
            raise ShapeError(f"split: sizes {parts} do not add up to {n} (axis {axis} of shape {self.shape})")
        out, start = [], 0
        for p in parts:
            box = [(0, s, 1) for s in self.shape]
            box[ax] = (start, start + p, 1)
            out.append(Tensor(mv.shrink(self.node, tuple(box))))
            start += p
        return out


def _shape_args(shape: Any) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def _getitem(t: Tensor, key: Any) -> Tensor:
    if not isinstance(key, tuple):
        key = (key,)
    if any(isinstance(k, (Tensor, np.ndarray, list)) for k in key):
        raise PlaitError(
            "indexing with tensors or lists is not supported by [] yet; use plait.gather / nn.functional.embedding"
        )
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > t.ndim:
        raise ShapeError(f"too many indices ({n_real}) for a tensor of shape {t.shape}")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (t.ndim - n_real) + key[i + 1 :]
    else:
        key = key + (slice(None),) * (t.ndim - n_real)
    box, flips, out_shape, dim = [], [], [], 0
    for k in key:
        if k is None:
            out_shape.append(("new", 1))
            continue
        size = t.shape[dim]
        if isinstance(k, (int, np.integer)):
            i = int(k)
            if not -size <= i < size:
                raise ShapeError(f"index {i} is out of range for axis {dim} of size {size} (shape {t.shape})")
            i %= size
            box.append((i, i + 1, 1))
            out_shape.append(("drop", 1))
        elif isinstance(k, slice):
            start, stop, step = k.indices(size)
            if step > 0:
                box.append((start, builtins.max(start, stop), step))
            else:
                # a negative step: take the forward range it covers, then flip that axis
                count = len(range(start, stop, step))
                lo = start + step * (count - 1) if count else 0
                box.append((lo, lo + (count - 1) * -step + 1 if count else 0, -step))
                flips.append(dim)
            out_shape.append(("keep", 1))
        else:
            raise PlaitError(f"unsupported index {k!r} of type {type(k).__name__}")
        dim += 1
    node = mv.shrink(t.node, tuple(box))
    if flips:
        node = mv.flip(node, tuple(flips))
    final, it = [], iter(node.shape)
    for kind, _ in out_shape:
        if kind == "new":
            final.append(1)
        elif kind == "drop":
            next(it)
        else:
            final.append(next(it))
    return Tensor(mv.reshape(node, tuple(final)))


def tensor(data: Any, dtype: Any = None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """Make a Tensor from an array-like (copied to the device).

    >>> plait.tensor([1, 2, 3], device="cpu").dtype
    plait.int64
    """
    if isinstance(data, Tensor):
        data = data.numpy()
    return Tensor.from_numpy(data, dtype=dtype, device=device, requires_grad=requires_grad)


def where(cond: Any, a: Any, b: Any) -> Tensor:
    c = cond if isinstance(cond, Tensor) else tensor(cond)
    ta = c._other(a)
    tb = c._other(b)
    if not isinstance(a, Tensor) and isinstance(b, Tensor):
        ta = b._other(a)
    if not isinstance(b, Tensor) and isinstance(a, Tensor):
        tb = a._other(b)
    dt = dtypes.promote(ta.dtype, tb.dtype)
    shape = broadcast_shape(c.shape, ta.shape, tb.shape, op="where")
    return Tensor(ew.where(c._prep(shape, dtypes.bool_), ta._prep(shape, dt), tb._prep(shape, dt)))


def maximum(a: Tensor, b: Any) -> Tensor:
    return a.maximum(b)


def minimum(a: Tensor, b: Any) -> Tensor:
    return a.minimum(b)


def cat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    if not tensors:
        raise ShapeError("cat needs at least one tensor")
    ax = axis % tensors[0].ndim
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = dtypes.promote(dt, t.dtype)
    nodes = [ew.cast(t.node, dt) for t in tensors]
    full = mv.cat(nodes, ax)  # checks every part's shape, empty ones included
    keep = [n for n in nodes if n.shape[ax]]
    # parts empty along the axis contribute nothing; the codegen must not see them (it clamps indices into them)
    return Tensor(full if not keep or len(keep) == len(nodes) else mv.cat(keep, ax))


concatenate = cat


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    if not tensors:
        raise ShapeError("stack needs at least one tensor")
    ax = axis % (tensors[0].ndim + 1)
    return cat([t.unsqueeze(ax) for t in tensors], ax)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """NumPy matmul semantics: 1-d operands are promoted, batch dims broadcast."""
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: scalar operands are not allowed (shapes {a.shape} and {b.shape}); use *")
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ShapeError(
            f"matmul: shapes {a.shape} and {b.shape} do not chain (inner dims {a2.shape[-1]} != {b2.shape[-2]})"
        )
    dt = dtypes.promote(a.dtype, b.dtype)
    batch = broadcast_shape(a2.shape[:-2], b2.shape[:-2], op="matmul")
    a3 = Tensor(a2._prep(batch + a2.shape[-2:], dt))
    b3 = Tensor(b2._prep(batch + b2.shape[-2:], dt))
    m, k, n = a3.shape[-2], a3.shape[-1], b3.shape[-1]
    if k == 0:
        out = Tensor(ew.const(0, (*batch, m, n), dt, a.device))
    elif dt == dtypes.float32:
        out = Tensor(_matmul(a3.node, b3.node))
    else:
        # integer and half products: a broadcast multiply summed over k (exact for ints, float accumulation for half)
        acc = a3.float() if dt == dtypes.float16 else a3
        bcc = b3.float() if dt == dtypes.float16 else b3
        out = (acc.unsqueeze(-1) * bcc.unsqueeze(-3)).sum(axis=-2).astype(dt)
    if a.ndim == 1:
        out = out.squeeze(-2)
    if b.ndim == 1:
        out = out.squeeze(-1)
    return out
