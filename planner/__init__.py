"""memplan's planner: graph IR, liveness, costs, solvers and simulator. Pure: numpy + ortools, no ONNX."""
