"""`plait.jit`: trace a function of Tensors once per input signature into a compiled Plan, then replay it.
`plait.compile_step`: the same for a function with side effects (a training step), traced by recording its kernels.

Replay copies the inputs into the plan's buffers, launches the pre-bound kernels and returns NumPy arrays; no
graph is built, nothing is rendered or compiled.

>>> import numpy as np, plait
>>> f = plait.jit(lambda x, w: (x @ w).relu().sum(axis=1), device="cpu")
>>> f(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)).tolist()
[12.0, 12.0]
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from plait import dtypes
from plait.errors import PlaitError, TraceError
from plait.frontends.native.tensor import _LEAVES, STEP_SHAPING_CHANGES, Tensor
from plait.graph.autodiff import no_grad
from plait.graph.node import GRAD_MODE, Node, toposort
from plait.runtime import canonical, default_device, get_device
from plait.runtime.base import Buffer
from plait.schedule.plan import Capture, Plan, attach, capture, realize, run_launches


class Jit:
    def __init__(self, fn: Callable[..., Any], device: str | None = None):
        self.fn = fn
        self.device = canonical(device) if device else default_device()
        self.plans: dict[Any, tuple[Plan, bool]] = {}
        # per signature: the parameters the trace read, each with the node it had then, and the mode counter; a plan
        # reads those nodes' buffers (and may have folded them into constants), so a parameter that an optimizer or
        # load_state_dict has given a new value since, or a train/eval switch, means tracing again
        self.bound: dict[Any, tuple[list[tuple[Tensor, Node]], int]] = {}

    def plan_for(self, arrays: list[np.ndarray]) -> tuple[Plan, bool]:
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        if key in self.plans and not self._current(key):
            del self.plans[key]
        if key not in self.plans:
            inputs = [Node("input", (), None, a.shape, dtypes.from_numpy_dtype(a.dtype), self.device) for a in arrays]
            shaping = STEP_SHAPING_CHANGES[0]
            # a jit'ed function returns arrays, so no gradient can flow out of it: trace without recording one (ops
            # then take their inference forms, e.g. convolutions whose epilogues fuse)
            with no_grad():
                out = self.fn(*(Tensor(n) for n in inputs))
            single = isinstance(out, Tensor)
            outs = [out] if single else list(out)
            if not all(isinstance(o, Tensor) for o in outs):
                raise PlaitError("plait.jit: the function must return a Tensor or a sequence of Tensors")
            reached = {n.uid for n in toposort([o.node for o in outs])}
            holders = [(t, t.node) for t in list(_LEAVES.values()) if t.node.uid in reached]
            self.plans[key] = (Plan([o.node for o in outs], inputs), single)
            self.bound[key] = (holders, shaping)
        return self.plans[key]

    def _current(self, key: Any) -> bool:
        holders, shaping = self.bound[key]
        return shaping == STEP_SHAPING_CHANGES[0] and all(t.node is node for t, node in holders)

    def __call__(self, *args: Any) -> Any:
        arrays = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in args]
        plan, single = self.plan_for(arrays)
        outs = plan(*arrays)
        return outs[0] if single else outs


def jit(fn: Callable[..., Any] | None = None, device: str | None = None) -> Any:
    """Compile `fn` (Tensors in, Tensor(s) out) into a replayable plan per input shape/dtype signature.

    `fn` is traced without recording gradients (its outputs are arrays). The plan reads the parameters the trace
    read; after an optimizer step, `load_state_dict` or a train/eval switch the next call traces again."""
    if fn is None:
        return lambda f: Jit(f, device)
    return Jit(fn, device)


MAX_TRACES = 8  # input signatures a compiled step keeps traces of (variable sequence lengths would grow without end)


class CompiledStep:
    """A step function (forward, loss.backward(), optimizer.step(): anything that updates tensors in place) that runs
    as a replay of the kernels it launched, with no graph work in Python. See `compile_step`."""

    def __init__(self, fn: Callable[..., Any], device: str | None = None):
        self.fn = fn
        self.device = canonical(device) if device else default_device()
        self.traces: OrderedDict[Any, _Trace] = OrderedDict()  # most recently used last
        self.calls = 0
        self.shaping = (STEP_SHAPING_CHANGES[0], GRAD_MODE[0])

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.shaping != (STEP_SHAPING_CHANGES[0], GRAD_MODE[0]):
            # a module switched train/eval, a parameter was frozen, or grad mode differs: every trace may be wrong
            self.shaping = (STEP_SHAPING_CHANGES[0], GRAD_MODE[0])
            self.traces.clear()
        key = tuple(_arg_key(a) for a in args)
        trace = self.traces.setdefault(key, _Trace())
        self.traces.move_to_end(key)
        if len(self.traces) > MAX_TRACES:  # each replay holds a whole step's buffers: keep the recent signatures
            self.traces.popitem(last=False)
        if trace.replay is not None:
            if trace.replay.still_bound():
                return trace.replay(args)
            trace.replay = None  # parameters were re-pointed outside this trace (load_state_dict, another signature)
        if not trace.eager_done:
            trace.eager_done = True  # a first step may differ (optimizer state is created): run it untraced
            return self.fn(
                *(Tensor.from_numpy(a, device=self.device) if isinstance(a, np.ndarray) else a for a in args)
            )
        recorded = _record(self.fn, args, self.device)
        if trace.first is None or trace.first_call != self.calls - 1:
            trace.first, trace.first_call = recorded, self.calls  # pair only calls that follow each other
            recorded.release()
            return recorded.copied_outputs()
        try:
            trace.replay = _Replay(trace.first, recorded, self.fn)
        except TraceError:
            if trace.refused:
                raise
            trace.refused = True  # state may have been changed from outside between the calls: pair the next two
            trace.first, trace.first_call = recorded, self.calls
            recorded.release()
            return recorded.copied_outputs()
        trace.first = None
        return recorded.copied_outputs()


class _Trace:
    """Per input signature: the first call done, the traced call waiting for its pair, the replay built from two
    traced calls in a row, and whether a pairing has already been refused."""

    def __init__(self) -> None:
        self.eager_done = False
        self.first: _Recorded | None = None
        self.first_call = 0
        self.replay: _Replay | None = None
        self.refused = False


def _arg_key(a: Any) -> Any:
    if isinstance(a, Tensor):
        return ("tensor", a.shape, a.dtype.name, a.device)
    if isinstance(a, np.ndarray):
        return ("array", a.shape, a.dtype.str)
    try:
        hash(a)
    except TypeError:
        raise TraceError(
            f"plait.compile_step: argument of type {type(a).__name__} is neither a Tensor, an array nor a hashable"
            " constant; pass tensors for data and hashable values (numbers, strings) for settings"
        ) from None
    return ("const", a)


class _Recorded:
    """One traced call: the capture, the private input buffers its tensor arguments were copied into, and the
    output tensors (their structure, to rebuild it on replay)."""

    def __init__(self, cap: Capture, inputs: list[Buffer | None], outputs: list[Tensor], single: bool):
        self.cap = cap
        self.inputs = inputs
        self.outputs = outputs
        self.single = single
        self.made: dict[int, tuple[weakref.ref[Any], tuple[str, int, int]]] = {}  # after release(): id -> (buf, where)
        self.stubs: list[list[_Stub]] = []  # after release(): per launch, its buffers

    def copied_outputs(self) -> Any:
        outs = [_copy(t.node.buffer, t) for t in self.outputs]
        return _pack(outs, self.single)

    def release(self) -> None:
        """Keep of each launch's buffers only who they were (weakly) and which step of this call made them: all
        that pairing with the next traced call needs. The call's temporaries are then freed while the next call
        runs, so two whole sets of a step's buffers need not fit on the device at once."""
        made = _producers(self)
        self.made = {i: (weakref.ref(buf), made[i]) for launch in self.cap.launches for buf in launch.buffers
                     if (i := id(buf)) in made}  # fmt: skip
        self.stubs = [
            [_Stub(weakref.ref(buf), made.get(id(buf))) for buf in launch.buffers] for launch in self.cap.launches
        ]
        for launch in self.cap.launches:
            launch.buffers = []

    def made_by(self, buf: Any) -> tuple[str, int, int] | None:
        """Where this (released) call made `buf`, if it made it."""
        ref, where = self.made.get(id(buf), (None, None))
        return where if ref is not None and ref() is buf else None


@dataclass
class _Stub:
    """A released traced call's buffer: the buffer itself while something else keeps it alive, and where the call
    made it (None: made before the call)."""

    ref: weakref.ref[Any]
    made: tuple[str, int, int] | None


def _pack(outs: list[Tensor], single: bool) -> Any:
    if single:
        return outs[0] if outs else None
    return tuple(outs)


def _copy(buf: Buffer, like: Tensor) -> Tensor:
    """A new tensor holding a copy of `buf` (replays overwrite their buffers; what the caller gets must not change)."""
    dev = get_device(like.device)
    node = Node("buffer", (), None, like.shape, like.dtype, like.device)
    out = dev.allocator.alloc(buf.nbytes)
    dev.allocator.copy(out, buf)
    attach(node, out)
    return Tensor(node)


def _private(a: Any, device: str) -> tuple[Any, Buffer | None]:
    """The argument the traced function sees: tensors and arrays become tensors in buffers of our own (a replay
    copies the next call's data into them), other values pass through."""
    if isinstance(a, np.ndarray):
        t = Tensor.from_numpy(a, device=device)
        return t, t.node.buffer
    if isinstance(a, Tensor):
        a.realize()
        t = _copy(a.node.buffer, a)
        return t, t.node.buffer
    return a, None


def _record(fn: Callable[..., Any], args: tuple[Any, ...], device: str) -> _Recorded:
    private = [_private(a, device) for a in args]
    with capture() as cap:
        out = fn(*(t for t, _ in private))
        single = not isinstance(out, (tuple, list))
        outs = [] if out is None else [out] if single else list(out)
        if not all(isinstance(o, Tensor) for o in outs):
            raise TraceError(
                "plait.compile_step: the step must return None, a Tensor or a tuple/list of Tensors (a Python value"
                f" would not change on replay), got {type(out).__name__}"
            )
        realize([o.node for o in outs])
    return _Recorded(cap, [b for _, b in private], outs, single)


class _Replay:
    """The second traced call's launches, bound once, plus what makes them repeatable. Comparing two traced calls
    tells the step's state apart from its temporaries: a buffer that the second call reads where the first read a
    buffer made before it, and that the first call wrote, is state carried from one step to the next (a parameter,
    a momentum or a running mean). A replay copies each carried value back into the buffer the launches read, runs
    the launches, and leaves every Python object that holds state pointing at the updated buffers."""

    def __init__(self, a: _Recorded, b: _Recorded, fn: Callable[..., Any]):
        name = getattr(fn, "__name__", "step")
        _same_kernels(a, b, name)
        made_b = _producers(b)
        carries: dict[int, tuple[Buffer, Buffer]] = {}  # id(buffer read) -> (it, the buffer B writes the state to)
        for j, (stubs, lb) in enumerate(zip(a.stubs, b.cap.launches, strict=True)):
            for slot, (ba, bb) in enumerate(zip(stubs, lb.buffers, strict=True)):
                if ba.ref() is bb:
                    continue  # the same buffer both times: a constant (frozen weights, the learning-rate scalar)
                pa, pb = ba.made, made_b.get(id(bb))
                if pa is not None and pa == pb:
                    continue  # a temporary or an input, made at the same point of both calls
                src = a.made_by(bb)
                if pa is None and pb is None and src is not None and src[0] == "launch":
                    written = b.cap.launches[src[1]].buffers[src[2]]
                    if carries.setdefault(id(bb), (bb, written))[1] is not written:
                        raise TraceError(
                            f"plait.compile_step({name}): state buffer read in two roles ({lb.kernel.name})"
                        )
                    continue
                raise TraceError(
                    f"plait.compile_step({name}): kernel {lb.kernel.name} (launch {j}, argument {slot}) reads a"
                    " tensor that neither the step made nor was carried from the previous call (a tensor replaced"
                    " outside the step, or a value chosen by Python control flow); replays cannot follow it. Keep"
                    " such tensors out of the step or call the function without plait.compile_step."
                )
        self.carries = list(carries.values())
        self.device = get_device(b.outputs[0].device) if b.outputs else b.cap.launches[0].buffers[0].device
        self.launches = self.device.chain(b.cap.launches)  # on cpu: runs of kernels as one parallel region each
        self.hooks = list(b.cap.hooks.values())
        self.inputs = b.inputs
        self.outputs = b.outputs
        self.single = b.single
        state = {id(w) for _, w in self.carries}
        # parameters that hold carried state: if one is re-pointed from outside (load_state_dict) the trace is stale
        self.holders = [(t, t.node.buffer) for t in list(_LEAVES.values()) if id(t.node.buffer) in state]
        self.keep = b.cap  # the buffers the bound launches use stay alive with the replay

    def still_bound(self) -> bool:
        return all(t.node.buffer is buf for t, buf in self.holders)

    def __call__(self, args: tuple[Any, ...]) -> Any:
        alloc = self.device.allocator
        for hook in self.hooks:
            hook()
        for a, buf in zip(args, self.inputs, strict=True):
            if buf is None:
                continue
            if isinstance(a, Tensor):
                a.realize()
                alloc.copy(buf, a.node.buffer)
            else:
                alloc.copy_in(buf, np.ascontiguousarray(a))
        for read_buf, state in self.carries:
            alloc.copy(read_buf, state)
        run_launches(self.device, self.launches)
        return _pack([_copy(t.node.buffer, t) for t in self.outputs], self.single)


def _same_kernels(first: _Recorded, second: _Recorded, name: str) -> None:
    """Two traced calls (the first one released) must launch the same kernels in the same order and upload the
    same host data."""
    a, b = first.cap, second.cap
    if len(a.launches) != len(b.launches) or any(
        la.kernel.name != lb.kernel.name or la.kernel.source != lb.kernel.source or len(sa) != len(lb.buffers)
        for la, sa, lb in zip(a.launches, first.stubs, b.launches, strict=False)
    ):
        raise TraceError(
            f"plait.compile_step({name}): two calls with the same input shapes ran different kernels ({len(a.launches)}"
            f" and {len(b.launches)} launches): the step takes a different path from call to call (Python control"
            " flow on a counter or on data), so no single replay is right. Make the path fixed, or call the function"
            " without plait.compile_step."
        )
    if len(a.uploads) != len(b.uploads):
        raise TraceError(f"plait.compile_step({name}): two calls copied different numbers of host arrays to the device")
    for (_, ua, remade_a), (_, ub, remade_b) in zip(a.uploads, b.uploads, strict=True):
        if remade_a != remade_b or ua.shape != ub.shape or ua.dtype != ub.dtype:
            raise TraceError(f"plait.compile_step({name}): two calls copied different host arrays to the device")
        if not remade_a and not np.array_equal(ua, ub, equal_nan=True):
            raise TraceError(
                f"plait.compile_step({name}): a {ua.shape} {ua.dtype} host array made inside the step (plait.tensor,"
                " Tensor.from_numpy) changed between calls, and a replay would keep its first value; pass it to the"
                " step as an argument instead"
            )


def _producers(r: _Recorded) -> dict[int, tuple[str, int, int]]:
    """Where each buffer a traced call made came from: ('launch', index, which of the kernel's outputs: 0 but for
    kernels writing several), ('upload', index, 0) or ('input', index, 0)."""
    made: dict[int, tuple[str, int, int]] = {}
    for i, buf in enumerate(r.inputs):
        if buf is not None:
            made[id(buf)] = ("input", i, 0)
    for i, (buf, _, _) in enumerate(r.cap.uploads):
        made.setdefault(id(buf), ("upload", i, 0))
    for i, launch in enumerate(r.cap.launches):
        for slot in range(launch.kernel.writes):
            made[id(launch.buffers[slot])] = ("launch", i, slot)
    return made


def compile_step(fn: Callable[..., Any] | None = None, device: str | None = None) -> Any:
    """Compile a training step (or any function that updates tensors in place) into a replay of its kernels.

    The first call with a given signature (argument shapes and dtypes, other arguments by value) runs eagerly, the
    next two run eagerly while every kernel launch is recorded, and later calls only copy the new inputs in and run
    the recorded launches: no graph building, autodiff, signature hashing or allocation. Parameters, optimizer state
    and running statistics stay on the device and are updated in place; outputs come back as new Tensors.
    Arguments may be Tensors, NumPy arrays (copied to `device`, default plait's default device) or hashable constants;
    use it as `@plait.compile_step` or `@plait.compile_step(device="opencl:0")`. A step whose kernels depend on Python control flow
    or that reads values to the host raises plait.TraceError (see docs/training.md).

    >>> import numpy as np, plait
    >>> lin = plait.nn.Linear(3, 2, device="cpu")
    >>> opt = plait.optim.SGD(lin.parameters(), lr=0.1)
    >>> @plait.compile_step
    ... def step(x):
    ...     opt.zero_grad()
    ...     loss = lin(x).square().mean()
    ...     loss.backward()
    ...     opt.step()
    ...     return loss
    >>> losses = [float(step(np.ones((4, 3), np.float32)).item()) for _ in range(5)]
    >>> losses[-1] < losses[0]
    True
    """
    if fn is None:
        return lambda f: CompiledStep(f, device)
    return CompiledStep(fn, device)
