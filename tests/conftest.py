import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The shared benchmark data lies beside the checkout; tests that need it skip where it is absent.
BENCHMARKS = ROOT.parent / "shared" / "benchmarks"


@pytest.fixture(scope="session")  # constant: module fixtures may build on it
def benchmarks_dir():
    if not BENCHMARKS.is_dir():
        pytest.skip(f"shared benchmarks not found at {BENCHMARKS}")
    return BENCHMARKS
