"""Building many OpenCL kernels at once in worker processes, for drivers that serialise builds within a process.

NVIDIA's OpenCL driver turns source into PTX and then PTX into machine code, and a process builds one program at a
time for much of that: resnet50's 50 batch-64 inference kernels took 14.7 s on an H100 built from 16 threads of one
process, and 3.4 s from 16 processes (docs/benchmarks.md, "NVIDIA GPU: alexnet at batch 64 and first compile").
Each worker is a small Python process (pyopencl only, no plait) with its own context on the same device: it builds
one kernel source per request and sends the program binary back. The driver's binary is PTX, which the parent
loads at no cost only where the driver's own JIT cache (on by default; off with CUDA_CACHE_DISABLE=1) kept the
machine code the worker made, so the workers are used only there (`workers_help`).

Workers start when a plan has enough kernels to build (already while it renders them, when its first kernels are not
in the disk cache: `prestart`) and stay for IDLE_SECONDS after their last build, so the later
plans of one first call (a training step's eager backward and update realize their own plans a second or two after
the forward's) reuse them instead of each paying the start again; then they stop, since each holds a device context.
"""

from __future__ import annotations

import atexit
import os
import queue
import struct
import subprocess
import sys
import threading
from typing import Any

MIN_KERNELS = 8  # fewer uncached kernels build in-process: starting workers costs about a second
KERNELS_PER_WORKER = 3  # at least this many kernels per worker started, so each start pays for itself
IDLE_SECONDS = 5.0  # a pool with no build for this long stops: long enough to span the plans of one first call

# The worker: select the device by platform and device index, then answer requests on stdin/stdout. A request is a
# length-prefixed UTF-8 source; a reply is a status byte (0: binary follows, 1: build log follows) and a
# length-prefixed payload. It imports no plait module, so it starts in a fraction of a second.
_WORKER = r"""
import os, struct, sys, warnings
out = os.fdopen(os.dup(1), "wb")  # replies go to the real stdout; anything a library prints goes to stderr
os.dup2(2, 1)
import pyopencl as cl
warnings.simplefilter("ignore")
plat, index = int(sys.argv[1]), int(sys.argv[2])
dev = cl.get_platforms()[plat].get_devices()[index]
ctx = cl.Context([dev])
inp = sys.stdin.buffer
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    src = inp.read(struct.unpack("<I", head)[0]).decode()
    try:
        prog = cl.Program(ctx, src).build()
        status, payload = 0, bytes(prog.get_info(cl.program_info.BINARIES)[0])
    except Exception as e:
        status, payload = 1, str(e)[-4000:].encode()
    out.write(struct.pack("<BI", status, len(payload)) + payload)
    out.flush()
"""


def workers_help(dev: Any) -> bool:
    """True where building in worker processes pays: NVIDIA's driver with its JIT cache on."""
    return "NVIDIA" in dev.platform.name.upper() and os.environ.get("CUDA_CACHE_DISABLE", "0") in ("", "0")


def device_index(dev: Any) -> tuple[int, int]:
    """(platform index, device index within it) of `dev`, as a worker process enumerates them."""
    import pyopencl as cl

    for p, plat in enumerate(cl.get_platforms()):
        for d, other in enumerate(plat.get_devices()):
            if other == dev:
                return p, d
    raise LookupError(f"OpenCL device {dev.name} is not among the platforms' devices")


def _read(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the build worker exited")
    return bytes(data)


def _serve(proc: subprocess.Popen[bytes], jobs: queue.Queue[tuple[int, str]], results: dict[int, bytes]) -> bool:
    """Feed one worker jobs until none are left; False when the worker died (its job's result stays unset)."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        while True:
            try:
                i, src = jobs.get_nowait()
            except queue.Empty:
                return True
            data = src.encode()
            proc.stdin.write(struct.pack("<I", len(data)) + data)
            proc.stdin.flush()
            status, size = struct.unpack("<BI", _read(proc.stdout, 5))
            payload = _read(proc.stdout, size)
            if status == 0 and payload:
                results[i] = payload
    except (OSError, EOFError):
        return False


class _Pool:
    """The worker processes of one device, kept between builds until IDLE_SECONDS pass without one. `busy` holds a
    build's whole exchange (a worker serves one request at a time); `_lock` guards the process list and timer."""

    def __init__(self, plat: int, index: int):
        self.cmd = [sys.executable, "-c", _WORKER, str(plat), str(index)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.busy = threading.Lock()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def take(self, count: int) -> list[subprocess.Popen[bytes]]:
        """The pool's live workers, started up to `count` where it has fewer, with the idle timer stopped until
        `release`."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.procs = [p for p in self.procs if p.poll() is None]
            while len(self.procs) < count:
                self.procs.append(
                    subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                )
            return list(self.procs)

    def release(self, failed: set[int]) -> None:
        """After a build: workers whose exchange failed (index into the list `take` gave) stop now, the rest after
        IDLE_SECONDS without another build."""
        with self._lock:
            for i in sorted(failed, reverse=True):
                _stop(self.procs.pop(i))
            self._timer = threading.Timer(IDLE_SECONDS, self.close)
            self._timer.daemon = True
            self._timer.start()

    def close(self) -> None:
        """Stop every worker (idle timer, process exit); a build in progress keeps its workers until it ends."""
        if not self.busy.acquire(blocking=False):
            return  # a build took the pool just as the timer fired; its release sets a new timer
        try:
            with self._lock:
                procs, self.procs = self.procs, []
            for p in procs:
                _stop(p)
        finally:
            self.busy.release()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a worker: closing its stdin ends its request loop; one that does not exit in time is killed."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


_pools: dict[tuple[int, int, int], _Pool] = {}  # (process id, platform, device index): a forked child starts its own
_pools_lock = threading.Lock()


def _pool(plat: int, index: int) -> _Pool:
    with _pools_lock:
        key = (os.getpid(), plat, index)
        if key not in _pools:
            _pools[key] = _Pool(plat, index)
        return _pools[key]


@atexit.register
def _close_all() -> None:
    for key, pool in list(_pools.items()):
        if key[0] == os.getpid():
            pool.close()


def worker_count(kernels: int) -> int:
    """Workers for a build of `kernels` sources: one per core, each with at least KERNELS_PER_WORKER of them."""
    return min(os.cpu_count() or 1, -(-kernels // KERNELS_PER_WORKER))


def prestart(dev: Any, kernels: int) -> None:
    """Start the workers a coming build of about `kernels` sources will take, without waiting for them: they load
    pyopencl and open their device context while the caller renders the sources. Unused, they stop after
    IDLE_SECONDS like any idle pool. A build in progress already holds its workers: then nothing."""
    pool = _pool(*device_index(dev))
    if not pool.busy.acquire(blocking=False):
        return
    try:
        pool.take(worker_count(kernels))
        pool.release(set())
    finally:
        pool.busy.release()


def build_binaries(dev: Any, sources: list[str], workers: int | None = None) -> dict[int, bytes]:
    """Program binaries of `sources` for `dev`, built by worker processes: {index in sources: binary}. A source
    the compiler rejects, or one a worker could not build, has no entry; the caller builds it in-process, where
    the compiler's error names the kernel."""
    if not sources:
        return {}
    pool = _pool(*device_index(dev))
    count = workers or worker_count(len(sources))
    jobs: queue.Queue[tuple[int, str]] = queue.Queue()
    for i in sorted(range(len(sources)), key=lambda i: -len(sources[i])):  # longest first: better balance
        jobs.put((i, sources[i]))
    results: dict[int, bytes] = {}
    with pool.busy:
        procs = pool.take(count)
        ok = [False] * len(procs)

        def serve(i: int) -> None:
            ok[i] = _serve(procs[i], jobs, results)

        threads = [threading.Thread(target=serve, args=(i,), daemon=True) for i in range(len(procs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pool.release({i for i, good in enumerate(ok) if not good})
    return results
