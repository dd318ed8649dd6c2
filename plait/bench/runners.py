"""One runner per framework behind one small interface: `prepare(case)` gives a `Prepared` whose `check()` returns
the outputs to compare with PyTorch eager and whose `step()` is what gets timed; `sync()` waits for the device.

Inference outputs are the logits. A training step is forward + cross-entropy + backward + SGD update; its check
outputs are the loss and the change of the model's first parameter, so a wrong gradient cannot pass.
"""

from __future__ import annotations

import copy
import gc
import importlib.util
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plait.bench.models import BenchModel


@dataclass
class Case:
    """One cell's work: a model with its initial weights, a mode ('infer' or 'train'), a batch and its data."""

    model: BenchModel
    mode: str
    batch: int
    x: np.ndarray
    y: np.ndarray
    torch_model: Any  # the reference module holding the initial weights; runners copy it, never change it
    lr: float = 0.01


@dataclass
class Trainer:
    """SGD steps on batches, then predictions from the trained weights (the tasks' training loops)."""

    step: Callable[[np.ndarray, np.ndarray], None]
    predict: Callable[[np.ndarray], np.ndarray]


@dataclass
class Prepared:
    check: Callable[[], list[np.ndarray]]
    step: Callable[[], Any]
    notes: list[str] = field(default_factory=list)
    kernels: Callable[[int], dict[str, Any]] | None = None  # the per-kernel report over N replays (--kernels)


def freeze_dropout(module: Any) -> None:
    """Dropout is random, so no two frameworks agree on it: the training step runs with dropout off everywhere."""
    for m in module.modules():
        if type(m).__name__.startswith("Dropout"):
            m.eval()


# plait.compile_step runs a signature's first call eagerly and traces the next two before it replays
TRACED_CALLS = 2


def first_param(module: Any) -> tuple[str, Any]:
    return next(iter(module.named_parameters()))


class Runner:
    """A framework on a device. `unavailable()` says why it cannot run at all (None when it can)."""

    name = ""
    modes: tuple[str, ...] = ("infer", "train")

    def unavailable(self) -> str | None:
        return None

    def info(self) -> dict[str, Any]:
        return {}

    def prepare(self, case: Case) -> Prepared:
        raise NotImplementedError

    def predictor(self, case: Case) -> Callable[[np.ndarray], np.ndarray]:
        """A function from an input batch (of case.batch rows) to logits, for the tasks' data loops."""
        raise NotImplementedError

    def trainer(self, case: Case) -> Trainer:
        """SGD on batches (x, labels) from case.torch_model's weights, for the tasks' data loops."""
        raise NotImplementedError

    def sync(self) -> None:
        pass

    def release(self) -> None:
        """Return the memory a finished cell held (including what a caching allocator keeps), so that a cell that
        ran out of memory, or a big one, does not take memory from the cells after it."""
        gc.collect()


class TorchRunner(Runner):
    """PyTorch eager (`compile=False`) or torch.compile with its default backend (`compile=True`)."""

    def __init__(self, device: str = "cpu", compile: bool = False, plait_device: str | None = None):
        self.device = device
        self.compile = compile or plait_device is not None
        self.plait_device = plait_device
        self.name = f"plait-torch:{plait_device}" if plait_device else "torch.compile" if compile else "torch"

    def info(self) -> dict[str, Any]:
        import torch

        backend = "plait" if self.plait_device else "inductor" if self.compile else "eager"
        return {
            "device": self.device,
            "backend": backend,
            "plait_device": self.plait_device,
            "dynamo_allow_rnn": self.plait_device is not None if self.compile else None,
            "version": torch.__version__,
        }

    def _compiled(self, model: Any) -> Any:
        """Eager, or torch.compile from a clean dynamo: without reset() copies of one model class share compiled
        code and its recompile limit, and plait's frontend turns allow_rnn on, which would make inductor unroll
        GRUs that it otherwise leaves to eager PyTorch."""
        import torch
        import torch._dynamo

        if not self.compile:
            return model
        torch._dynamo.reset()
        torch._dynamo.config.allow_rnn = self.plait_device is not None
        if self.plait_device:
            return torch.compile(model, backend="plait", options={"device": self.plait_device})
        return torch.compile(model)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def release(self) -> None:
        super().release()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def prepare(self, case: Case) -> Prepared:
        import torch

        model = copy.deepcopy(case.torch_model).to(self.device)
        x = torch.from_numpy(case.x).to(self.device)
        fn = self._compiled(model)
        if case.mode == "infer":
            model.eval()

            def infer() -> Any:
                with torch.no_grad():
                    return fn(x)

            return Prepared(lambda: [infer().float().cpu().numpy()], infer)
        y = torch.from_numpy(case.y).to(self.device)
        model.train()
        freeze_dropout(model)
        opt = torch.optim.SGD(model.parameters(), lr=case.lr)
        loss_fn = torch.nn.CrossEntropyLoss()
        _, probe = first_param(model)

        def train() -> Any:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(fn(x), y)
            loss.backward()
            opt.step()
            return loss

        def check() -> list[np.ndarray]:
            before = probe.detach().cpu().numpy().copy()
            loss = train()
            return [np.array(loss.item(), np.float32), probe.detach().cpu().numpy() - before]

        return Prepared(check, train)

    def predictor(self, case: Case) -> Callable[[np.ndarray], np.ndarray]:
        import torch

        model = copy.deepcopy(case.torch_model).to(self.device).eval()
        fn = self._compiled(model)

        def predict(x: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return np.asarray(fn(torch.from_numpy(x).to(self.device)).float().cpu().numpy())

        return predict

    def trainer(self, case: Case) -> Trainer:
        import torch

        model = copy.deepcopy(case.torch_model).to(self.device).train()
        freeze_dropout(model)
        fn = self._compiled(model)
        opt = torch.optim.SGD(model.parameters(), lr=case.lr)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(x: np.ndarray, y: np.ndarray) -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(fn(torch.from_numpy(x).to(self.device)), torch.from_numpy(y).to(self.device)).backward()
            opt.step()

        def predict(x: np.ndarray) -> np.ndarray:
            model.eval()
            with torch.no_grad():
                return np.asarray(fn(torch.from_numpy(x).to(self.device)).float().cpu().numpy())

        return Trainer(step, predict)


class PlaitRunner(Runner):
    """plait's own twin of the model (plait.nn), weights loaded from the PyTorch model's state_dict. Inference is a
    plait.jit plan replayed on device-resident input; training is a plait.compile_step replayed the same way."""

    def __init__(self, device: str, kernels: bool = False):
        self.device = device
        self.name = f"plait:{device}"
        self.kernels = kernels

    def info(self) -> dict[str, Any]:
        import plait
        from plait.runtime import get_device

        dev = get_device(self.device)
        return {
            "device": self.device,
            "device_name": dev.info.name,
            "driver": dev.info.driver,
            "version": plait.__version__,
        }

    def sync(self) -> None:
        from plait.runtime import get_device

        get_device(self.device).synchronize()

    def release(self) -> None:
        from plait.runtime import get_device

        super().release()
        get_device(self.device).allocator.release_cached()

    def _model(self, case: Case) -> Any:
        model = case.model.plait_factory(self.device)
        model.load_state_dict({k: v.detach().cpu().numpy() for k, v in case.torch_model.state_dict().items()})
        return model

    def prepare(self, case: Case) -> Prepared:
        import plait
        from plait.schedule.profile import profile_plan

        model = self._model(case)
        if case.mode == "infer":
            model.eval()
            f = plait.jit(lambda t: model(t), device=self.device)
            plan, _ = f.plan_for([case.x])

            def report(reps: int) -> dict[str, Any]:
                return profile_plan(plan, reps).as_dict()

            return Prepared(
                lambda: [np.asarray(f(case.x), np.float32)], plan.run, kernels=report if self.kernels else None
            )
        model.train()
        freeze_dropout(model)
        step = self._train_step(model, case)
        x = plait.Tensor.from_numpy(case.x, device=self.device)
        y = plait.Tensor.from_numpy(case.y, device=self.device)
        _, probe = first_param(model)

        def check() -> list[np.ndarray]:
            before = probe.numpy().copy()
            loss = float(step(x, y).item())
            delta = probe.numpy() - before
            for _ in range(TRACED_CALLS):  # part of the setup, so that every timed step is a replay
                step(x, y)
            return [np.array(loss, np.float32), delta]

        return Prepared(check, lambda: step(x, y))

    def _train_step(self, model: Any, case: Case) -> Callable[[Any, Any], Any]:
        """forward + cross-entropy + backward + SGD as a plait.compile_step (plait's public API for training loops):
        the first call runs eagerly, the next two are traced, later calls replay the recorded kernels."""
        import plait

        opt = plait.optim.SGD(model.parameters(), lr=case.lr)
        loss_fn = plait.nn.CrossEntropyLoss()

        @plait.compile_step(device=self.device)
        def train_step(x: Any, y: Any) -> Any:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return train_step  # type: ignore[no-any-return]

    def predictor(self, case: Case) -> Callable[[np.ndarray], np.ndarray]:
        import plait

        model = self._model(case).eval()
        f = plait.jit(lambda t: model(t), device=self.device)
        return lambda x: np.asarray(f(x))

    def trainer(self, case: Case) -> Trainer:
        import plait

        model = self._model(case).train()
        freeze_dropout(model)
        train_step = self._train_step(model, case)

        def step(x: np.ndarray, y: np.ndarray) -> None:
            train_step(x, y)

        compiled: list[Any] = []

        def predict(x: np.ndarray) -> np.ndarray:
            if not compiled:  # traced after training, so the plan holds the trained weights
                model.eval()
                compiled.append(plait.jit(lambda t: model(t), device=self.device))
            return np.asarray(compiled[0](x))

        return Trainer(step, predict)


def export_onnx(case: Case) -> bytes:
    """The reference model as ONNX (TorchScript exporter: it needs no onnxscript), for this case's batch."""
    import torch

    model = copy.deepcopy(case.torch_model).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the exporter's advice (dynamo exporter, GRU batch sizes) is not ours to act on
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.from_numpy(case.x),),
            buf,  # type: ignore[arg-type]  # the TorchScript exporter writes to file-like objects too
            input_names=["x"],
            output_names=["logits"],
            opset_version=17,
            dynamo=False,
        )
    return buf.getvalue()


class OnnxRuntimeRunner(Runner):
    """ONNX Runtime on the exported model, `intra_op_num_threads` set to the run's thread count. Inference only."""

    name = "onnxruntime"
    modes = ("infer",)

    def __init__(self, threads: int, cuda: bool = False):
        self.threads = threads
        self.cuda = cuda

    def unavailable(self) -> str | None:
        return None if importlib.util.find_spec("onnxruntime") else "onnxruntime is not installed"

    def providers(self) -> list[str]:
        import onnxruntime as ort

        if self.cuda and "CUDAExecutionProvider" in ort.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def info(self) -> dict[str, Any]:
        import onnxruntime as ort

        return {
            "version": ort.__version__,
            "providers": self.providers(),
            "intra_op_num_threads": self.threads,
            "inter_op_num_threads": 1,
            "graph_optimization_level": "ORT_ENABLE_ALL",
        }

    def _session(self, case: Case) -> Any:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(export_onnx(case), opts, providers=self.providers())

    def prepare(self, case: Case) -> Prepared:
        sess, feed = self._session(case), {"x": case.x}
        return Prepared(lambda: [sess.run(None, feed)[0]], lambda: sess.run(None, feed))

    def predictor(self, case: Case) -> Callable[[np.ndarray], np.ndarray]:
        sess = self._session(case)
        return lambda x: np.asarray(sess.run(None, {"x": x})[0])


class PlaitOnnxRunner(Runner):
    """plait.onnx.InferenceSession on the same exported model. Inference only."""

    modes = ("infer",)

    def __init__(self, device: str, kernels: bool = False):
        self.device = device
        self.name = f"plait-onnx:{device}"
        self.kernels = kernels

    def unavailable(self) -> str | None:
        try:
            from plait.onnx import InferenceSession  # noqa: F401
        except ImportError as e:
            return f"plait.onnx.InferenceSession is not available ({e})"
        return None

    def info(self) -> dict[str, Any]:
        return {"device": self.device}

    def sync(self) -> None:
        from plait.runtime import get_device

        get_device(self.device).synchronize()

    def prepare(self, case: Case) -> Prepared:
        from plait.onnx import InferenceSession

        sess = InferenceSession(export_onnx(case), device=self.device)
        feed = {"x": case.x}

        def report(reps: int) -> dict[str, Any]:
            from plait.frontends.native.explaining import kernel_report

            return kernel_report(sess, feed, reps=reps).as_dict()

        return Prepared(
            lambda: [np.asarray(sess.run(None, feed)[0])],
            lambda: sess.run(None, feed),
            kernels=report if self.kernels else None,
        )

    def predictor(self, case: Case) -> Callable[[np.ndarray], np.ndarray]:
        from plait.onnx import InferenceSession

        sess = InferenceSession(export_onnx(case), device=self.device)
        return lambda x: np.asarray(sess.run(None, {"x": x})[0])


class MissingRunner(Runner):
    """A framework plait bench knows of but cannot run here; every cell is skipped with the reason."""

    def __init__(self, name: str, module: str):
        self.name = name
        self.module = module

    def unavailable(self) -> str | None:
        if importlib.util.find_spec(self.module) is None:
            return f"{self.name} is not installed"
        return f"{self.name} is installed, but plait bench has no {self.name} runner yet (docs/bench.md)"


FRAMEWORKS = ("plait", "torch", "torch.compile", "plait-torch", "onnxruntime", "plait-onnx", "tinygrad", "tensorflow")


def make_runners(
    frameworks: list[str], devices: list[str], threads: int, torch_device: str, kernels: bool = False
) -> list[Runner]:
    """Runners for the chosen framework names; 'plait', 'plait-torch' (torch.compile with backend="plait") and
    'plait-onnx' get one runner per plait device. With `kernels` the plait and plait-onnx inference cells also
    produce the per-kernel report."""
    out: list[Runner] = []
    for fw in frameworks:
        if fw == "plait":
            out += [PlaitRunner(d, kernels) for d in devices]
        elif fw == "plait-onnx":
            out += [PlaitOnnxRunner(d, kernels) for d in devices]
        elif fw == "plait-torch":
            out += [TorchRunner(torch_device, plait_device=d) for d in devices]
        elif fw in ("torch", "torch.compile"):
            out.append(TorchRunner(torch_device, compile=fw == "torch.compile"))
        elif fw == "onnxruntime":
            out.append(OnnxRuntimeRunner(threads, cuda=torch_device.startswith("cuda")))
        else:
            out.append(MissingRunner(fw, fw))
    return out
