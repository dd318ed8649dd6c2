"""Compiled plans: kernels with buffers bound in advance. `Plan.__call__` replays them with no graph work."""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plait import settings
from plait.codegen import gemm, irblock_c, stem_pool_c, winograd_c, winograd_cl
from plait.codegen.cstyle import RenderedKernel
from plait.errors import CompileError, PlaitError, TraceError
from plait.graph.node import Node, toposort
from plait.graph.ops import OPS
from plait.runtime import get_device
from plait.runtime.base import Buffer, Device
from plait.schedule.scheduler import Item, schedule

_HELD: weakref.WeakSet[Any] = weakref.WeakSet()  # live objects with a `.node` the caller can read (plait.Tensor)


def hold(obj: Any) -> None:
    """Note a live object whose `.node` the caller may read later: a realize keeps the buffers it reaches."""
    _HELD.add(obj)


def render(device: Device, item: Item, knobs: dict[str, int] | None = None) -> RenderedKernel:
    """The kernel of one scheduled item; a GEMM uses `knobs` when given (tuning), else the tuned or heuristic ones."""
    r = device.renderer
    if item.kind == "gemm":
        assert item.gemm is not None
        from plait.tune import knobs_for

        knobs = knobs if knobs is not None else knobs_for(device, "gemm", item.gemm)
        if r.dialect == "c":
            return gemm.render_c(
                item.gemm, knobs, r, item.epilogue(), residual=item.extra.get("carried"), apack=item.extra.get("apack")
            )
        return gemm.render_opencl(item.gemm, knobs, r, item.epilogue())
    if item.kind == "pointwise":  # a 1x1 convolution across the vector lanes, its weights packed at plan build
        assert item.gemm is not None
        return gemm.render_c(item.gemm, None, r, item.epilogue(), lanes=item.extra["lanes"])
    if item.kind == "stempool":  # an image stem and the max pool after it as one cpu kernel
        return stem_pool_c.render(item.extra["stempool"], r)
    if item.kind == "irblock":  # an inverted-residual block fused into one cpu kernel
        return irblock_c.render(item.extra["irblock"], r, item.extra["epilogues"])
    if item.kind == "winograd":
        return (winograd_cl if r.dialect == "opencl" else winograd_c).render(item.extra["winograd"], r, item.epilogue())
    if item.kind in ("custom", "contract"):
        kernel = OPS[item.out.op].kernel
        assert kernel is not None
        return kernel(r, item.out, item.inputs)
    if item.kind == "reduce":
        return r.render_reduce(item.out, item.out, item.inputs)
    if "writes" in item.extra:
        return r.render_elementwise_group(item.out, item.extra["writes"], item.inputs)
    return r.render_elementwise(item.out, item.out, item.inputs)


# After rendering this many kernels a plan tells its device what it will build (Device.expect_builds), so a device
# whose builds start slowly (NVIDIA OpenCL's build workers) gets ready while the rest render
EXPECT_AFTER = 8


def _dump(kernel: RenderedKernel) -> None:
    level = settings.get("PLAIT_DEBUG")
    if level:
        print(f"plait: kernel {kernel.name} global={kernel.global_size} local={kernel.local_size}", file=sys.stderr)
    if level >= 2:
        print(kernel.source, file=sys.stderr)
    dump_dir = settings.get("PLAIT_DUMP_DIR")
    if dump_dir:
        path = Path(dump_dir)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{kernel.name}.src").write_text(kernel.source)


def _compile(device: Device, kernels: list[RenderedKernel], items: list[Item]) -> list[Any]:
    """Build the kernels; a build failure is re-raised naming the op and shapes of the kernel that failed."""
    try:
        return list(device.compile_batch([(k.source, k.name) for k in kernels]))
    except CompileError as e:
        failed = [(k, item) for k, item in zip(kernels, items, strict=True) if k.name in str(e)] or list(
            zip(kernels, items, strict=True)
        )
        k, item = failed[0]
        ins = ", ".join(f"{n.op} {n.shape} {n.dtype.name}" for n in item.inputs) or "no inputs"
        raise CompileError(
            f"{device.name}: cannot build kernel {k.name} computing {item.out.op} -> shape {item.out.shape}"
            f" {item.out.dtype.name} from ({ins}). Try device='cpu', set PLAIT_DUMP_DIR to keep the generated source,"
            f" and report it.\n{e}"
        ) from e


def _alloc(device: Device, nbytes: int) -> Buffer:
    """A buffer of `nbytes` whose memory returns to the allocator's pool when the Buffer object dies."""
    buf = device.allocator.alloc(nbytes)
    _manage(buf)
    return buf


def reuse_enabled() -> bool:
    """Whether plans share storage between intermediates whose lifetimes do not overlap (PLAIT_REUSE_BUFFERS)."""
    return bool(settings.get("PLAIT_REUSE_BUFFERS"))


@dataclass
class Tenant(Buffer):
    """An intermediate's view of a shared slot buffer (`base`, at least as large): kernels get the slot's handle,
    `nbytes` is the intermediate's own size, and the view keeps the slot alive."""

    base: Buffer | None = None


@dataclass
class MemoryPlan:
    """Which launched steps share storage: `slot[i]` is the shared slot step i writes (None: a buffer of its own),
    `sizes` each slot's bytes. Made once when a plan is built, so replays run on fixed, preset buffers."""

    slot: list[int | None]
    sizes: list[int]

    def slots(self, device: Device) -> list[Buffer]:
        """One buffer per slot, returned to the allocator's pool when the last view of it dies."""
        return [_alloc(device, n) for n in self.sizes]


def _storage_roots(alias: list[int | None], over: dict[int, int]) -> list[int]:
    """For each step of plan_memory, the step whose storage it ends up in: itself, the root of the step it is a view
    of (`alias`; -1 for a view of an outside buffer), or for a step of `over` the root of the step it writes over."""
    root = list(range(len(alias)))
    for i, a in enumerate(alias):
        if a is not None:
            root[i] = root[a] if a >= 0 else -1
        elif i in over:
            root[i] = root[over[i]]
    return root


def plan_memory(
    sizes: list[int],
    alias: list[int | None],
    reads: list[list[int]],
    pinned: set[int],
    over: dict[int, int] | None = None,
) -> MemoryPlan:
    """Assign storage to a sequence of steps run in order, reusing a slot once the last reader of its value ran.

    Step i writes `sizes[i]` bytes, or, where `alias[i]` is set, is a view of step alias[i]'s storage (a reshape;
    -1: a view of a buffer from outside). `reads[i]` lists the earlier steps whose values step i reads. Steps in
    `pinned` (outputs, values a caller can still see, work done once) keep buffers of their own, as do views of
    them. A step never writes a slot that one of its own inputs occupies, except step i of `over` {i: j}, which
    writes over the slot of step j (a GEMM whose C starts as its residual j): the caller has checked that j is
    an unpinned value of the same size, computed by a kernel, read last and once by step i. Greedy best fit: the
    smallest free slot that is large enough, else the largest free one grown to fit, else a new slot."""
    n = len(sizes)
    over = over or {}
    root = _storage_roots(alias, over)
    last = list(range(n))
    for i in range(n):
        for j in reads[i]:
            r = root[j]
            if r >= 0:
                last[r] = max(last[r], i)
    keep = {root[i] for i in pinned if root[i] >= 0}
    ends: dict[int, list[int]] = {}
    for r in range(n):
        if root[r] == r:
            ends.setdefault(last[r], []).append(r)
    slot: list[int | None] = [None] * n
    slot_sizes: list[int] = []
    free: list[int] = []
    for i in range(n):
        if i in over:
            slot[i] = slot[root[i]]
        elif alias[i] is None and i not in keep and sizes[i] > 0:
            fits = [s for s in free if slot_sizes[s] >= sizes[i]]
            if fits:
                s = min(fits, key=lambda s: slot_sizes[s])
            elif free:
                s = max(free, key=lambda s: slot_sizes[s])
                slot_sizes[s] = sizes[i]
            else:
                s = len(slot_sizes)
                slot_sizes.append(sizes[i])
            if s in free:
                free.remove(s)
            slot[i] = s
        for r in ends.get(i, ()):
            done = slot[r]
            if done is not None:
                free.append(done)
    return MemoryPlan(slot, slot_sizes)


def _place(device: Device, nbytes: int, slot: int | None, slots: list[Buffer]) -> Buffer:
    """The buffer a step writes: a view of its shared slot, or a buffer of its own."""
    if slot is None:
        return _alloc(device, nbytes)
    base = slots[slot]
    return Tenant(device, nbytes, base.handle, managed=True, base=base)


class Plan:
    """Kernels for `outputs`, compiled and bound. Leaves are existing buffers or `input` placeholder nodes whose
    buffers the plan owns; call it with arrays for the inputs and get arrays for the outputs."""

    def __init__(
        self,
        outputs: list[Node],
        inputs: list[Node] | None = None,
        keep: Callable[[set[int]], set[int]] | None = None,
        reuse: bool | None = None,
    ):
        """`keep(uids)` says which of the nodes the plan computes (by uid) a caller can still see besides the
        outputs: those keep buffers of their own. The rest share storage where their lifetimes do not overlap,
        unless `reuse` is False (default: PLAIT_REUSE_BUFFERS)."""
        if not outputs:
            raise PlaitError("a plan needs at least one output")
        self.device = get_device(outputs[0].device)
        self.inputs = list(inputs or [])
        self.outputs = outputs
        self.buffers: dict[int, Buffer] = {}
        self._io: tuple[list[np.ndarray | None], list[tuple[Buffer, np.ndarray | None]]] | None = None
        for node in self.inputs:
            self.buffers[node.uid] = _alloc(self.device, node.size * node.dtype.itemsize)
        self.items = schedule(
            outputs,
            self.device.renderer.__dict__.get("split_parts", 256 if self.device.renderer.dialect == "opencl" else 16),
            implicit_conv=getattr(self.device.renderer, "implicit_conv", False),
            conv_span=getattr(self.device.renderer, "conv_span", False),
            split_k=getattr(self.device.renderer, "split_k", False),
            winograd=self.device.renderer.dialect == "c",
            winograd_cl=self.device.renderer.dialect == "opencl",
            constants_once=inputs is not None,
        )
        self.kernels: list[RenderedKernel] = []
        self.launches: list[Any] = []
        pending: list[tuple[RenderedKernel, list[Buffer]]] = []
        self.memory = self._plan_memory(keep, reuse_enabled() if reuse is None else reuse)
        slots = self.memory.slots(self.device)
        for item, slot in zip(self.items, self.memory.slot, strict=True):
            if item.kind == "alias":
                self.buffers[item.out.uid] = self._buffer_of(item.inputs[0])
                continue
            nbytes = item.out.size * item.out.dtype.itemsize
            out_buf = self.buffers[item.out.uid] = _place(self.device, nbytes, slot, slots)
            if item.out.size == 0 or item.kind == "written":  # a later merged kernel fills a written buffer
                continue
            k = render(self.device, item)
            _dump(k)
            pending.append((k, [out_buf] + [self._buffer_of(n) for n in item.inputs]))
            if len(pending) == EXPECT_AFTER:
                self.device.expect_builds([k.source for k, _ in pending], len(self.items))
        built = [i for i in self.items if i.kind not in ("alias", "written") and i.out.size]  # `pending`'s items
        # a plan with inputs keeps its leaf buffers bound: work on constants alone (Winograd weight transforms of
        # model parameters) runs once, here, instead of on every replay
        once = [bool(i.extra.get("constant")) for i in built]
        self.launched = [i for i, o in zip(built, once, strict=True) if not o]  # the item behind each launch
        programs = _compile(self.device, [k for k, _ in pending], built)
        self.programs: dict[int, tuple[Any, RenderedKernel]] = {}  # item out uid -> (program, kernel) for replays
        self.bound: list[Launch] = []  # what each launch runs on, for step capture
        for (k, bufs), prog, o in zip(pending, programs, once, strict=True):
            if o:
                prog.bind(bufs, k.global_size, k.local_size)()
                continue
            self.kernels.append(k)
            self.launches.append(prog.bind(bufs, k.global_size, k.local_size))
            self.bound.append(Launch(prog, k, bufs))
        for item, prog, (k, _) in zip(built, programs, pending, strict=True):
            self.programs[item.out.uid] = (prog, k)
        # what run() calls: the launches as the device chains them (on cpu, one parallel region for all the kernels)
        self.replay = self.device.chain(self.bound)

    def _plan_memory(self, keep: Callable[[set[int]], set[int]] | None, reuse: bool) -> MemoryPlan:
        """Storage for the items' outputs (see plan_memory); without `reuse` every item gets a buffer of its own."""
        at = {item.out.uid: i for i, item in enumerate(self.items)}
        sizes = [item.out.size * item.out.dtype.itemsize for item in self.items]
        self.unshared_buffer_bytes = sum(n.size * n.dtype.itemsize for n in self.inputs) + sum(
            size for size, item in zip(sizes, self.items, strict=True) if item.kind != "alias"
        )
        if not reuse:
            return MemoryPlan([None] * len(self.items), [])
        alias = [at.get(item.inputs[0].uid, -1) if item.kind == "alias" else None for item in self.items]
        reads = [[at[n.uid] for n in item.inputs if n.uid in at] for item in self.items]
        seen = {n.uid for n in self.outputs} | (keep(set(at)) if keep is not None else set())
        pinned = {i for i, item in enumerate(self.items) if item.out.uid in seen or item.extra.get("constant")}
        over = self._carried(at, alias, reads, pinned) if keep is None and self.device.renderer.dialect == "c" else {}
        return plan_memory(sizes, alias, reads, pinned, over)

    def _carried(
        self, at: dict[int, int], alias: list[int | None], reads: list[list[int]], pinned: set[int]
    ) -> dict[int, int]:
        """The cpu GEMMs that take their residual's storage for C ({step: residual's step}, see plan_memory's
        `over`), each item marked extra["carried"] for its render. Only in a plan whose memory is fixed (inputs
        given, no caller-held values: a realize's recipe replays its kernels under other pinned sets) and only
        where the residual is an unpinned kernel output that no step after the GEMM reads, nor the GEMM itself
        besides its epilogue (as an operand it would be overwritten while still read)."""
        from plait.tune import knobs_for

        root = _storage_roots(alias, {})
        over: dict[int, int] = {}
        for i, item in enumerate(self.items):
            if item.kind != "gemm" or i in pinned or item.gemm is None:
                continue
            carry = gemm.carried_residual(item.gemm, knobs_for(self.device, "gemm", item.gemm), item.epilogue())
            j = at.get(carry.residual.uid) if carry is not None else None
            if j is None or j >= i or alias[j] is not None or j in pinned or self.items[j].kind == "written":
                continue
            r = root[j]
            if sum(root[x] == r for x in reads[i]) != 1:
                continue
            if any(root[x] == r for k in range(i + 1, len(reads)) for x in reads[k]):
                continue
            over[i] = j
            root = _storage_roots(alias, over)
        # a chain whose storage a pinned view keeps (an output reshaped from it) would lose its shared slot
        while True:
            root = _storage_roots(alias, over)
            kept = {root[p] for p in pinned}
            bad = {i for i in over if root[i] in kept}
            if not bad:
                break
            over = {i: j for i, j in over.items() if i not in bad}
        for i in over:
            epi = self.items[i].epilogue()
            assert epi is not None
            self.items[i].extra["carried"] = next(x for x in epi.extra if x.uid == self.items[over[i]].out.uid)
        return over

    @property
    def peak_bytes(self) -> int:
        """Device memory the plan's own buffers take (inputs, outputs, kept values and the shared slots): what its
        replays need beyond the caller's buffers, with the scratch a replay holds on to (on cpu, each team run's
        shared buffer for packed operands, sized by the first replay). `unshared_bytes` is the same without reuse."""
        own = [self.buffers[n.uid] for n in self.inputs]
        own += [self.buffers[it.out.uid] for it in self.items if it.kind != "alias"]
        return sum(b.nbytes for b in own if not isinstance(b, Tenant)) + sum(self.memory.sizes) + self.scratch_bytes

    @property
    def unshared_bytes(self) -> int:
        """What peak_bytes would be if every value the plan computes had a buffer of its own."""
        return self.unshared_buffer_bytes + self.scratch_bytes

    @property
    def scratch_bytes(self) -> int:
        """Scratch the replay keeps between calls: on cpu, each team run's shared buffer (packed operands)."""
        return sum(getattr(r, "shared_bytes", 0) for r in self.replay)

    def _buffer_of(self, node: Node) -> Buffer:
        if node.buffer is not None:
            return node.buffer
        return self.buffers[node.uid]

    def run(self) -> None:
        run_launches(self.device, self.replay)

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise PlaitError(f"plan expects {len(self.inputs)} inputs, got {len(arrays)}")
        ins, outs = self._host_io()
        for node, view, arr in zip(self.inputs, ins, arrays, strict=True):
            if arr.shape != node.shape:
                raise PlaitError(f"plan input has shape {tuple(arr.shape)}, expected {node.shape}")
            if view is not None and arr.dtype == view.dtype:
                np.copyto(view, arr)
            else:
                self.device.allocator.copy_in(self.buffers[node.uid], np.ascontiguousarray(arr, dtype=node.dtype.np))
        self.run()
        out = []
        for n, (buf, view) in zip(self.outputs, outs, strict=True):
            now = self._buffer_of(n)
            # inside a traced step read() says why values must not be read back
            out.append(view.copy() if view is not None and buf is now and not _CAPTURES else read(self.device, now, n))
        return out

    def _host_io(self) -> tuple[list[np.ndarray | None], list[tuple[Buffer, np.ndarray | None]]]:
        """Host arrays over the inputs' and outputs' buffers (Allocator.host_view; None where there is none), made
        at the first call: a call then copies through them with no per-call conversions. A call made right after a
        replay runs its Python with cold caches, so each step it saves counts (mobilenet_v2 at batch 1 through the
        ONNX session: about 0.4 ms of an 8.5 ms call went to the Python around the replay; docs/benchmarks.md)."""
        if self._io is None:
            al = self.device.allocator
            ins = [al.host_view(self.buffers[n.uid], n.shape, n.dtype.np) for n in self.inputs]
            outs = []
            for n in self.outputs:
                buf = self._buffer_of(n)
                outs.append((buf, al.host_view(buf, n.shape, n.dtype.np) if n.size else None))
            self._io = (ins, outs)
        return self._io


def run_launches(device: Device, launches: list[Any]) -> None:
    """Run bound launches in order; a launch the device refuses (out of memory, say) becomes its PlaitError."""
    try:
        for launch in launches:
            launch()
    except device.launch_errors as e:
        raise device.launch_failure(e) from e


def read(device: Device, buf: Buffer, node: Node) -> np.ndarray:
    if _CAPTURES:
        raise TraceError(
            f"plait.compile_step: the step reads a {node.shape} {node.dtype.name} value back to the host (.item(),"
            " .numpy(), bool(), a loss printed or compared in Python), so its result depends on data the replay"
            " would not see. Return the tensor from the step and read it outside, or call the function without"
            " plait.compile_step."
        )
    out: np.ndarray = np.empty(node.shape, dtype=node.dtype.np)
    if node.size:
        device.allocator.copy_out(buf, out)
    return out


def _manage(buf: Buffer) -> None:
    """Return `buf`'s memory to its allocator's pool when the Buffer object dies (registered once per buffer)."""
    if not buf.managed:
        buf.managed = True
        weakref.finalize(buf, buf.device.allocator.free, buf.nbytes, buf.handle)


def attach(node: Node, buf: Buffer) -> None:
    """Make `node` hold `buf`; the memory returns to its allocator's pool when the Buffer object dies."""
    node.set_buffer(buf)
    _manage(buf)


@dataclass
class Launch:
    """One kernel launch: the program, its rendered kernel (launch sizes) and the buffers bound to it, output first."""

    program: Any
    kernel: RenderedKernel
    buffers: list[Buffer]


@dataclass
class Capture:
    """What a traced step did to device memory, in order: kernel launches, host uploads, and the hooks that must
    run before each replay (host-side values such as a learning rate that a scheduler may change)."""

    launches: list[Launch] = field(default_factory=list)
    uploads: list[tuple[Buffer, np.ndarray, bool]] = field(default_factory=list)  # (buffer, data, remade per replay)
    hooks: dict[Any, Callable[[], None]] = field(default_factory=dict)


_CAPTURES: list[Capture] = []


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Record every kernel launch and host upload made inside the block (plait.compile_step's tracing)."""
    if _CAPTURES:
        raise TraceError("plait.compile_step: a compiled step cannot call another compiled step while it is traced")
    cap = Capture()
    _CAPTURES.append(cap)
    try:
        yield cap
    finally:
        _CAPTURES.pop()


def capturing() -> bool:
    """Whether a step is being traced by plait.compile_step."""
    return bool(_CAPTURES)


def record_upload(buf: Buffer, arr: np.ndarray, remake: Callable[[], np.ndarray] | None = None) -> None:
    """Note a host array copied into `buf` while a step is traced. Replays check that it stays the same, unless
    `remake` makes a new one for each replay (a dropout mask), which is then copied in before the launches."""
    if not _CAPTURES:
        return
    cap = _CAPTURES[-1]
    cap.uploads.append((buf, arr.copy(), remake is not None))
    if remake is not None:
        fresh = remake
        cap.hooks[("upload", len(cap.uploads))] = lambda: buf.device.allocator.copy_in(
            buf, np.ascontiguousarray(fresh(), dtype=arr.dtype)
        )


def on_replay(key: Any, hook: Callable[[], None]) -> None:
    """Have `hook` run before each replay of the step being traced (once per key); a no-op outside tracing."""
    if _CAPTURES:
        _CAPTURES[-1].hooks[key] = hook


@dataclass
class _Step:
    out_pos: int | None  # position of the item's node in the graph signature; None for scheduler-made nodes
    nbytes: int
    program: Any  # None for aliases and empty outputs
    kernel: RenderedKernel | None
    refs: list[tuple[str, int]]  # ("leaf", slot) or ("item", index of an earlier step)
    alias: bool  # a reshape viewing its one input's buffer


class _Recipe:
    """What a realize compiled for one graph structure: its steps, and the memory plan per set of steps whose
    values a caller could still see (usually one set per structure, e.g. a training loop's)."""

    def __init__(self, plan: Plan, pos: dict[int, tuple[str, int]]):
        item_index: dict[int, int] = {}
        self.steps: list[_Step] = []
        for j, item in enumerate(plan.items):
            refs = []
            for x in item.inputs:
                where = pos.get(x.uid)
                refs.append(where if where is not None and where[0] == "leaf" else ("item", item_index[x.uid]))
            prog, kernel = plan.programs.get(item.out.uid, (None, None))
            at = pos.get(item.out.uid)
            nbytes = item.out.size * item.out.dtype.itemsize
            self.steps.append(_Step(at[1] if at else None, nbytes, prog, kernel, refs, item.kind == "alias"))
            item_index[item.out.uid] = j
        self.memory: dict[frozenset[int], MemoryPlan] = {}

    def memory_for(self, pinned: frozenset[int]) -> MemoryPlan:
        """The memory plan when the steps in `pinned` keep buffers of their own (computed once per set)."""
        mem = self.memory.get(pinned)
        if mem is None:
            steps = self.steps
            alias = [(s.refs[0][1] if s.refs[0][0] == "item" else -1) if s.alias else None for s in steps]
            reads = [[i for kind, i in s.refs if kind == "item"] for s in steps]
            mem = self.memory[pinned] = plan_memory([s.nbytes for s in steps], alias, reads, set(pinned))
        return mem

    def replay(self, device: Device, order: list[Node], leaves: list[Node], outputs: list[Node]) -> None:
        """Run the steps on `order`'s nodes with fresh buffers; attach the ones a caller can see to their nodes."""
        steps = self.steps
        placed = {order[s.out_pos].uid: i for i, s in enumerate(steps) if s.out_pos is not None}
        if reuse_enabled():
            seen = {n.uid for n in outputs} | held(set(placed))
            mem = self.memory_for(frozenset(placed[u] for u in seen if u in placed))
        else:
            mem = MemoryPlan([None] * len(steps), [])
        slots = mem.slots(device)
        bufs: list[Buffer] = []
        for step, slot in zip(steps, mem.slot, strict=True):
            ins = [leaves[i].buffer if kind == "leaf" else bufs[i] for kind, i in step.refs]
            if step.alias:
                buf = ins[0]
            else:
                buf = _place(device, step.nbytes, slot, slots)
                if step.program is not None and step.kernel is not None:
                    run_launches(
                        device, [step.program.bind([buf, *ins], step.kernel.global_size, step.kernel.local_size)]
                    )
                    if _CAPTURES:
                        _CAPTURES[-1].launches.append(Launch(step.program, step.kernel, [buf, *ins]))
            bufs.append(buf)
        for step, buf in zip(steps, bufs, strict=True):
            if step.out_pos is not None and not isinstance(buf, Tenant):
                attach(order[step.out_pos], buf)


_RECIPES: OrderedDict[Any, _Recipe] = OrderedDict()
_MAX_RECIPES = 256


def _held_in(graph: set[int], computed: set[int]) -> set[int]:
    """`held` among the graph's own nodes, as a replay of the recipe sees them (the scheduler's nodes are its own)."""
    return held(computed & graph)


def differentiated(nodes: list[Node]) -> None:
    """Note the autograd nodes a backward pass has walked: as in PyTorch, their saved values are not needed again
    (a second backward through them recomputes what it reads rather than keeping a whole forward pass alive)."""
    _CONSUMED.update(n for n in nodes if n.rg)


_CONSUMED: weakref.WeakSet[Node] = weakref.WeakSet()


def held(computed: set[int]) -> set[int]:
    """The nodes among `computed` (uids) that a caller can still read: held by a live Tensor, or read by an
    unrealized node that a live Tensor reaches (a loss realized after the gradients that shared its forward pass),
    or saved for a backward pass still to come (the ancestors of a live Tensor's autograd node that no backward
    has walked: a loss read before its backward). The others are temporaries whose storage a plan may reuse; such
    a node stays unrealized, so reading it later computes it again rather than reading stale memory."""
    kept: set[int] = set()
    seen: set[tuple[int, bool]] = set()
    roots = [node for t in list(_HELD) if (node := getattr(t, "node", None)) is not None]
    stack = [(node, node.rg and node not in _CONSUMED) for node in roots]
    while stack:
        node, saving = stack.pop()
        if (node.uid, saving) in seen:
            continue
        seen.add((node.uid, saving))
        if node.uid in computed:
            kept.add(node.uid)
            if not saving:
                continue
        elif node.buffer is not None:
            continue
        stack.extend((src, saving) for src in node.srcs)
    return kept


def _signature(pending: list[Node]) -> tuple[Any, list[Node], list[Node], dict[int, tuple[str, int]]]:
    """A structural key for the graph under `pending` (ops, arguments, shapes, dtypes, wiring, leaf shapes), the
    nodes in signature order, the leaves, and each node's position."""
    order = toposort(pending)
    pos: dict[int, tuple[str, int]] = {}
    parts: list[Any] = []
    leaves: list[Node] = []
    for i, n in enumerate(order):
        if n.realized:
            pos[n.uid] = ("leaf", len(leaves))
            leaves.append(n)
            parts.append((n.shape, n.dtype.name))
            continue
        pos[n.uid] = ("node", i)
        arg = n.arg
        if n.op == "const":
            arg = repr(arg)  # -0.0 and 0.0 (or 1 and True) compare equal but render differently
        else:
            try:
                hash(arg)
            except TypeError:
                arg = repr(arg)
        parts.append((n.op, arg, n.shape, n.dtype.name, tuple(pos[x.uid] for x in n.srcs)))
    key = (pending[0].device, tuple(parts), tuple(pos[n.uid] for n in pending))
    return key, order, leaves, pos


def realize(nodes: list[Node]) -> None:
    """Compute `nodes` (lazy graph -> kernels -> run) and turn each into a leaf holding its buffer.

    A graph with the same structure as one realized before (a training step, a loop body) replays the kernels
    compiled for it with the new buffers: no scheduling, rendering or compiling.
    """
    pending = [n for n in nodes if not n.realized]
    if not pending:
        return
    by_device: dict[str, list[Node]] = {}
    for n in pending:
        by_device.setdefault(n.device, []).append(n)
    for group in by_device.values():
        key, order, leaves, pos = _signature(group)
        recipe = _RECIPES.get(key)
        if recipe is not None:
            _RECIPES.move_to_end(key)
            recipe.replay(get_device(group[0].device), order, leaves, group)
            continue
        plan = Plan(group, keep=functools.partial(_held_in, set(pos)))
        plan.run()
        if _CAPTURES:
            _CAPTURES[-1].launches.extend(plan.bound)
        _RECIPES[key] = _Recipe(plan, pos)
        if len(_RECIPES) > _MAX_RECIPES:
            _RECIPES.popitem(last=False)
        for item in plan.items:
            buf = plan.buffers[item.out.uid]
            if not isinstance(buf, Tenant):  # a shared slot's later tenants overwrite it: the node stays lazy
                attach(item.out, buf)
