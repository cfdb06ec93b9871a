"""Gradient accuracy of memplan's training graphs on the zoo and the torch-exported fixtures.

Zoo: ORT (float32) gradients vs float64 directional finite differences (onnx reference evaluator),
error |FD - |g|| / |g| along each parameter's own gradient direction. Fixtures: ORT gradients vs
torch autograd, max |diff| / max |torch grad| per initializer (floored at 1e-3 of the model's
largest gradient, for gradients that are zero in theory). Prints one Markdown table.

    python bench/gradcheck_models.py            # everything
    python bench/gradcheck_models.py zoo:cnn vgg
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from passes import gradcheck  # noqa: E402
from passes.gradients import supported_ops  # noqa: E402
from planner.errors import PlannerError  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"


def main(names: list[str]) -> None:
    names = names or [f"zoo:{n}" for n in sorted(models.ZOO)] + sorted(p.stem for p in FIXTURES.glob("*.onnx"))
    unknown = [n for n in names if not (n[4:] in models.ZOO if n.startswith("zoo:") else (FIXTURES / f"{n}.onnx").exists())]
    if unknown:
        known = [f"zoo:{n}" for n in sorted(models.ZOO)] + sorted(p.stem for p in FIXTURES.glob("*.onnx"))
        sys.exit(f"unknown model {', '.join(unknown)}; choose from {', '.join(known)}")
    print(f"gradient rules: {len(supported_ops())} op types\n")
    print("| model | reference | params | loss | worst param | worst rel. error | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        start = time.perf_counter()
        try:
            if name.startswith("zoo:"):
                report, ref = gradcheck.zoo_report(name[4:], size="small"), "float64 FD"
            else:
                report, ref = gradcheck.fixture_report(FIXTURES / f"{name}.onnx"), "torch autograd"
        except PlannerError as err:
            print(f"| {name} | - | - | - | error: {err} | - | - |")
            continue
        param, worst = report.worst
        print(f"| {name} | {ref} | {len(report.errors)} | {report.loss:.5f} | {param} | {worst:.1e} | "
              f"{time.perf_counter() - start:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="zoo:NAME or a fixture stem (default: every zoo model and fixture)")
    main(parser.parse_args().names)
