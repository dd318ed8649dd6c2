"""The run's outputs: results.json (every setting and every sample), results.md (tables), one PNG per mode and a
self-contained report.html with the plots embedded as base64."""

from __future__ import annotations

import base64
import html
import importlib.util
import json
from pathlib import Path
from typing import Any

MODE_TITLES = {"infer-1": "inference, batch 1", "infer-batch": "inference, larger batch", "train": "training step"}


def frameworks(result: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(c["framework"] for c in result["cells"]))


def cell_text(c: dict[str, Any] | None) -> str:
    if c is None:
        return ""
    if c["status"] == "ok":
        half_spread = (c["p75_ms"] - c["p25_ms"]) / 2
        return f"{c['median_ms']:.2f} ±{half_spread:.2f}"
    return {"mismatch": "FAILED (mismatch)", "error": "error", "skipped": "skipped"}[c["status"]]


def mode_rows(result: dict[str, Any], mode: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one mode's table: a row per model, a column per framework, then plait's speed ratio."""
    fws = frameworks(result)
    cells = [c for c in result["cells"] if c["mode"] == mode]
    header = ["model", "batch", *fws]
    plait_fw = [f for f in fws if f.startswith("plait:")]
    header += [f"torch / {f}" for f in plait_fw]
    rows = []
    for model in dict.fromkeys(c["model"] for c in cells):
        by_fw = {c["framework"]: c for c in cells if c["model"] == model}
        batch = next(iter(by_fw.values()))["batch"]
        row = [model, str(batch), *(cell_text(by_fw.get(f)) for f in fws)]
        ref = by_fw.get("torch")
        for f in plait_fw:
            c = by_fw.get(f)
            ok = c and ref and c["status"] == "ok" and ref["status"] == "ok"
            row.append(f"{ref['median_ms'] / c['median_ms']:.2f}x" if ok and c and ref else "")
        rows.append(row)
    return header, rows


def task_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["task", "data", "framework", "time", "samples/s", "accuracy", "status"]
    rows = []
    for t in result.get("tasks", []):
        time = f"{t['seconds']:.2f} s {t['unit']}" if t["status"] == "ok" else ""
        rate = f"{t['samples_per_s']:.1f}" if t["status"] == "ok" else ""
        acc = f"{t['accuracy']:.4f}" if t.get("accuracy") is not None else ""
        rows.append([t["task"], t["data"], t["framework"], time, rate, acc, t["status"]])
    return header, rows


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _notes(result: dict[str, Any]) -> list[str]:
    out = []
    for c in result["cells"]:
        if c["status"] != "ok" and c.get("note"):
            out.append(f"{c['model']} {c['mode']} b{c['batch']} {c['framework']}: {c['status']}: {c['note']}")
    for t in result.get("tasks", []):
        if t["status"] != "ok" and t.get("note"):
            out.append(f"task {t['task']} {t['framework']}: {t['status']}: {t['note']}")
    return out


def _pair_line(result: dict[str, Any]) -> list[str]:
    """How far apart the host placed the first two CPUs at the start and end (plait.bench.env.cpu_pair_ns), and
    whether they were separate cores (plait.bench.env.cpu_pair_fma), when measured: on a virtual machine two-thread
    timings move with both."""
    host = result["environment"]["host"]
    start, end = result.get("cpu_pair_ns_start"), host.get("cpu_pair_ns_end")
    if start is None and end is None:
        return []
    ns = " / ".join("n/a" if v is None else f"{v:.0f}" for v in (start, end))
    fma = [result.get("cpu_pair_fma_start"), host.get("cpu_pair_fma_end")]
    rate = ""
    if fma != [None, None]:
        rates = " / ".join("n/a" if v is None else f"{v:.2f}" for v in fma)
        rate = (
            f"; two threads' multiply-add rate {rates} of one thread's"
            " (near 1: two cores; near 0.5: the host ran both on one core)"
        )
    return [f"CPU pair round trip {ns} ns at start / end (a cache line between the first two CPUs){rate}"]


def summary_lines(result: dict[str, Any]) -> list[str]:
    env, s = result["environment"], result["settings"]
    devices = ", ".join(f"{k} ({v['name']})" for k, v in env["plait_devices"].items()) or "none"
    return [
        f"date {env['date']}; host {env['host']['cpu']} ({env['host']['cores']} cores)"
        + (f", GPU {env['host']['nvidia']}" if env["host"].get("nvidia") else "")
        + (f"; load average {result['load_average_start']} at start" if result.get("load_average_start") else ""),
        *_pair_line(result),
        f"plait devices: {devices}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"{s['dtype']}, {s['layout']}, {env['threads']} threads (OMP_WAIT_POLICY={env['thread_env']['OMP_WAIT_POLICY']}),"
        f" {s['warmup']} warm-up + up to {s['iters']} timed iterations (median ± half the interquartile range, ms)",
        f"command: {s['command']}",
    ]


KERNEL_ROWS = 10  # kernels per cell in results.md and report.html; kernels.md lists them all


def kernel_sections(result: dict[str, Any], limit: int | None = KERNEL_ROWS) -> list[str]:
    """Markdown per cell that has a per-kernel report (`--kernels`): a heading and the slowest `limit` kernels."""
    from plait.schedule.profile import format_report

    parts = []
    for c in result["cells"]:
        report = c.get("kernels")
        if not report:
            continue
        parts += [f"### {c['model']} {c['mode']} b{c['batch']} {c['framework']}", ""]
        if "error" in report:
            parts += [f"no kernel report: {report['error']}", ""]
        else:
            parts += [format_report(report, limit), ""]
    return parts


def markdown(result: dict[str, Any]) -> str:
    parts = ["# plait bench", "", *(f"- {line}" for line in summary_lines(result)), ""]
    for mode in dict.fromkeys(c["mode"] for c in result["cells"]):
        parts += [f"## {MODE_TITLES.get(mode, mode)} (ms)", "", _md_table(*mode_rows(result, mode)), ""]
    if result.get("tasks"):
        parts += ["## tasks", "", _md_table(*task_rows(result)), ""]
    kernels = kernel_sections(result)
    if kernels:
        parts += [f"## kernels (slowest {KERNEL_ROWS} per cell; all of them in kernels.md)", "", *kernels]
    notes = _notes(result)
    if notes:
        parts += ["## notes", "", *(f"- {n}" for n in notes), ""]
    return "\n".join(parts)


def plot(result: dict[str, Any], mode: str, path: Path) -> Path | None:
    """Grouped bars (median, with the interquartile range as error bar) per model, one colour per framework."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in result["cells"] if c["mode"] == mode and c["status"] == "ok"]
    if not cells:
        return None
    models = list(dict.fromkeys(c["model"] for c in cells))
    fws = list(dict.fromkeys(c["framework"] for c in cells))
    width = 0.8 / len(fws)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(models) + 2), 4))
    for i, fw in enumerate(fws):
        xs, ys, lo, hi = [], [], [], []
        for j, m in enumerate(models):
            c = next((c for c in cells if c["model"] == m and c["framework"] == fw), None)
            if c:
                xs.append(j + (i - (len(fws) - 1) / 2) * width)
                ys.append(c["median_ms"])
                lo.append(c["median_ms"] - c["p25_ms"])
                hi.append(c["p75_ms"] - c["median_ms"])
        ax.bar(xs, ys, width, yerr=[lo, hi], label=fw, capsize=2)
    ax.set_xticks(range(len(models)), models)
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale, lower is better)")
    ax.set_title(f"plait bench: {MODE_TITLES.get(mode, mode)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"bad" if c.startswith(("FAILED", "error")) else ""}">{html.escape(c)}</td>' for c in r)
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def html_report(result: dict[str, Any], pngs: list[Path]) -> str:
    parts = ["<h1>plait bench</h1><ul>", *(f"<li>{html.escape(x)}</li>" for x in summary_lines(result)), "</ul>"]
    for mode in dict.fromkeys(c["mode"] for c in result["cells"]):
        parts += [f"<h2>{html.escape(MODE_TITLES.get(mode, mode))} (ms)</h2>", _html_table(*mode_rows(result, mode))]
    if result.get("tasks"):
        parts += ["<h2>tasks</h2>", _html_table(*task_rows(result))]
    for p in pngs:
        data = base64.b64encode(p.read_bytes()).decode()
        parts.append(f'<p><img alt="{html.escape(p.stem)}" src="data:image/png;base64,{data}"></p>')
    notes = _notes(result)
    if notes:
        parts += ["<h2>notes</h2><ul>", *(f"<li>{html.escape(n)}</li>" for n in notes), "</ul>"]
    kernels = kernel_sections(result)
    if kernels:
        parts.append("<h2>kernels</h2><pre>" + html.escape("\n".join(kernels)) + "</pre>")
    parts.append("<h2>settings</h2><pre>" + html.escape(json.dumps(result["settings"], indent=2)) + "</pre>")
    parts.append("<h2>environment</h2><pre>" + html.escape(json.dumps(result["environment"], indent=2)) + "</pre>")
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td.bad{color:#b00}"
    )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>plait bench</title><style>{style}</style>'
        f"</head><body>{''.join(parts)}</body></html>"
    )


def write_all(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write results.json, results.md, a PNG per mode and report.html into `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "html": out / "report.html"}
    paths["json"].write_text(json.dumps(result, indent=1, default=str))
    paths["markdown"].write_text(markdown(result))
    kernels = kernel_sections(result, limit=None)
    if kernels:
        paths["kernels"] = out / "kernels.md"
        paths["kernels"].write_text("\n".join(["# plait bench: per-kernel reports", "", *kernels]))
    pngs = []
    if importlib.util.find_spec("matplotlib") is None:
        print("plait bench: matplotlib is not installed, so the report has no plots (pip install 'plait[bench]')")
    else:
        for mode in dict.fromkeys(c["mode"] for c in result["cells"]):
            p = plot(result, mode, out / f"plot-{mode}.png")
            if p:
                pngs.append(p)
                paths[f"plot-{mode}"] = p
    paths["html"].write_text(html_report(result, pngs))
    return paths
