"""Does a plan run under ONNX Runtime's arena with its limit at the budget? The CPU twin of gpu_check.

    python bench/arena_limit.py --model 'zoo:gpt?batch=64' --budgets 80,70,60 \
        [--strategy same-as-requested|next-power-of-two] [--time-limit 5] [--bisect] [--json OUT.json]

The CPU provider's arena is the same ``BFCArena`` as the CUDA provider's device memory. Each model is
run in a fresh process with an arena registered in the environment, ``max_mem`` = the limit
(passes.verify.runs_under_arena), so a request past the limit fails as it does under ``gpu_mem_limit``.

Per budget it plans twice (``memplan plan --device cpu --deterministic``), without and with
``--ort-arena``, and reports for the unplanned training step and both plans: the liveness peak,
the arena need planner/arena.py predicts, whether the model runs at limit = budget, and
(``--bisect``) the least limit it runs under, measured to 4 KiB.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STRATEGIES = {"next-power-of-two": 0, "same-as-requested": 1}


def runs(model: str, feeds: dict, limit: int, strategy: int) -> bool:
    """Does ``model`` run once under a CPU arena of ``limit`` bytes (passes.verify.runs_under_arena)?"""
    from passes.verify import runs_under_arena

    return runs_under_arena(model, feeds, limit, strategy)[0]


def least_limit(model: str, feeds: dict, strategy: int, guess: int, resolution: int = 4096) -> int:
    """The least arena limit ``model`` runs under, bisected around ``guess``."""
    lo, hi = int(guess * 0.85), int(guess * 1.2)
    while not runs(model, feeds, hi, strategy):
        lo, hi = hi, hi * 2
    if runs(model, feeds, lo, strategy):
        lo = 0
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        if runs(model, feeds, mid, strategy):
            hi = mid
        else:
            lo = mid
    return hi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="MODEL as memplan plan takes it; repeatable")
    ap.add_argument("--budgets", default="80,70,60", help="percentages of the unplanned peak")
    ap.add_argument("--strategy", choices=sorted(STRATEGIES), default="same-as-requested")
    ap.add_argument("--time-limit", default="5", help="deterministic seconds per solve")
    ap.add_argument("--bisect", action="store_true", help="also measure each model's least arena limit")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()

    import onnx

    import models
    from passes.autodiff import training_graph
    from passes.onnx_export import export_model, save_model
    from passes.onnx_import import import_as_run, import_model, load_graph
    from planner.arena import arena_need
    from planner.liveness import MemoryModel, analyze

    strategy = STRATEGIES[args.strategy]
    rows = []
    print("| model | budget | graph | added time % | peak / budget | predicted arena need / budget | "
          "runs at limit = budget |" + (" measured need / budget | measured / predicted |" if args.bisect else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|" if args.bisect else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.model:
            unplanned = str(Path(tmp) / "unplanned.onnx")
            save_model(export_model(training_graph(load_graph(spec))), unplanned)
            feeds = models.example_feeds(onnx.load(unplanned), seed=0)
            own = analyze(import_model(onnx.load(unplanned))).peak_bytes
            for pct in (int(b) for b in args.budgets.split(",")):
                budget = -(-own * pct // 100)
                graphs = [("unplanned", unplanned, None)]
                for label, extra in (("plan", []), ("plan --ort-arena", ["--ort-arena", args.strategy])):
                    path = str(Path(tmp) / f"{len(graphs)}_{pct}.onnx")
                    # this tree's CLI, not an installed memplan from another checkout
                    done = subprocess.run([sys.executable, "-m", "cli", "plan", spec, "--budget", f"{pct}%",
                                           "--device", "cpu", "--deterministic", "--time-limit", args.time_limit,
                                           "--emit", path, "-o", path + ".json", *extra],
                                          cwd=ROOT, capture_output=True, text=True)
                    if done.returncode == 0:
                        added = json.loads(Path(path + ".json").read_text())["added_time_pct"]
                        graphs.append((label, path, added))
                    else:
                        rows.append({"model": spec, "budget_pct": pct, "graph": label, "error": done.stderr.strip()})
                        print(f"| {spec} | {pct}% | {label} | {(done.stderr.strip().splitlines() or ['?'])[-1]} |")
                for label, path, added in graphs:
                    lv = analyze(import_as_run(path), model=MemoryModel(host_copies_resident=True))
                    need = arena_need(lv, strategy=strategy, on_cpu=True)
                    ok = runs(path, feeds, budget, strategy)
                    row = {"model": spec, "budget_pct": pct, "budget_bytes": budget, "graph": label,
                           "added_time_pct": added, "peak_bytes": lv.peak_bytes, "predicted_need_bytes": need,
                           "runs_at_budget": ok}
                    line = (f"| {spec} | {pct}% | {label} | {'-' if added is None else f'{added:.2f}'} | "
                            f"{lv.peak_bytes / budget:.3f} | {need / budget:.3f} | {'yes' if ok else 'no'} |")
                    if args.bisect:
                        measured = least_limit(path, feeds, strategy, need)
                        row["measured_need_bytes"] = measured
                        line += f" {measured / budget:.3f} | {measured / need:.3f} |"
                    rows.append(row)
                    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"strategy": args.strategy, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
