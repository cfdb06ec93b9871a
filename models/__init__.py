"""Built-in model zoo: ONNX forward models ending in a scalar loss, seeded weights."""
