"""`plait bench`: argument parsing and the entry point."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    b = sub.add_parser("bench", help="benchmark plait against other frameworks (outputs checked before timing)")
    b.add_argument("--device", default=None, help="plait device (default: PLAIT_DEVICE, else the fastest)")
    b.add_argument("--quick", action="store_true", help="the quick default matrix")
    b.add_argument("--out", default="bench-results", help="folder for the JSON/markdown results")
    b.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from plait.bench.mlp import run_mlp
    from plait.runtime import canonical, default_device

    device = canonical(args.device) if args.device else default_device()
    print(f"plait bench: device {device}")
    results = [run_mlp(device, batch=b) for b in (1, 64)]
    for r in results:
        print(f"  {r['model']} batch {r['batch']}: plait {r['plait_ms']:.3f} ms ({r['plait_gflops']:.1f} GFLOP/s), "
              f"numpy {r['numpy_ms']:.3f} ms, speedup {r['speedup_vs_numpy']:.2f}x, max rel err {r['max_rel_err']:.1e}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"device": device, "results": results}, indent=2))
    print(f"plait bench: wrote {path}")
    return 0
