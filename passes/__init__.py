"""memplan's passes: everything that reads or writes ONNX (import, autodiff, rewrite, export, verify)."""
