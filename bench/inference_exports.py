"""Models exported from torch for inference (logits out, no loss) through `memplan plan --add-loss`.

Needs the fixtures extra (torch, transformers: `pip install -e '.[fixtures]'`); memplan itself does
not. For each model: export it with torch.onnx.export (TorchScript exporter, or dynamo with
--dynamo), check memplan's added loss and gradients against torch's own (F.cross_entropy /
F.mse_loss and autograd, on the same inputs and labels), then `memplan plan --add-loss ... --budget B
--emit` and `memplan verify`. Prints a Markdown table; --json writes the rows.

    python bench/inference_exports.py --budget 70% --time-limit 20
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _models():
    import torch
    import torch.nn as nn
    import transformers as hf

    class Logits(nn.Module):
        def __init__(self, m, **kw):
            super().__init__()
            self.m, self.kw = m, kw

        def forward(self, x):
            return self.m(x, **self.kw).logits

    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.f = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

        def forward(self, x):
            return self.f(x)

    class LSTMClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
            self.head = nn.Linear(16, 3)

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])

    gen = torch.Generator().manual_seed(0)

    def distinct(module: nn.Module) -> nn.Module:
        """Norm scales of ones and zero biases get random values: the exporter merges initializers
        of equal values into one, whose gradient is then the sum of theirs (not torch's per parameter)."""
        with torch.no_grad():
            for p in module.parameters():
                if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                    p.add_(0.1 * torch.randn(p.shape, generator=gen))
        return module.eval()

    tokens = torch.randint(0, 128, (8, 16), generator=gen)
    return {
        # name: (module, example input, loss kind, classes)
        "convnet (BatchNorm)": (distinct(ConvNet()), torch.randn(16, 3, 32, 32, generator=gen), "cross-entropy", 10),
        "LSTM classifier": (distinct(LSTMClassifier()), torch.randn(4, 10, 8, generator=gen), "cross-entropy", 3),
        "BertForSequenceClassification": (distinct(Logits(hf.BertForSequenceClassification(hf.BertConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, num_labels=3)))), tokens, "cross-entropy", 3),
        "GPT2LMHeadModel": (distinct(Logits(hf.GPT2LMHeadModel(hf.GPT2Config(
            vocab_size=128, n_embd=32, n_layer=2, n_head=2, n_positions=32)), use_cache=False)), tokens,
            "cross-entropy-last", 128),
        "LlamaForCausalLM": (distinct(Logits(hf.LlamaForCausalLM(hf.LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)), use_cache=False)), tokens,
            "cross-entropy-last", 128),
    }


def _torch_reference(module, x, kind: str, labels: np.ndarray):
    """Torch's loss and parameter gradients for the loss memplan's --add-loss KIND names."""
    import torch
    import torch.nn.functional as F

    module.zero_grad()
    logits = module(x)
    target = torch.from_numpy(labels)
    if kind == "cross-entropy-last":
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    else:
        loss = F.cross_entropy(logits, target)
    loss.backward()
    grads = {n: p.grad.detach().numpy() for n, p in module.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def _memplan_step(path: Path, kind: str, feeds: dict[str, np.ndarray]):
    from passes.autodiff import TrainOptions, build_training_graph
    from passes.gradcheck import run_training_step
    from passes.onnx_import import load_graph

    step = build_training_graph(load_graph(str(path)), TrainOptions(add_loss=kind))
    return run_training_step(step, feeds)


def _cli(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def row(name: str, module, x, kind: str, classes: int, budget: str, time_limit: float, dynamo: bool,
        folder: Path) -> dict:
    import torch

    path = folder / (name.split()[0].lower() + ".onnx")
    # no constant folding: a weight read transposed (or tied) stays the parameter torch names
    kw = {} if dynamo else {"do_constant_folding": False}
    with contextlib.redirect_stdout(sys.stderr):  # the dynamo exporter reports its steps on stdout
        torch.onnx.export(module, (x,), str(path), input_names=["x"], output_names=["logits"],
                          opset_version=18 if dynamo else 17, dynamo=dynamo, **kw)
    rng = np.random.default_rng(0)
    with torch.no_grad():
        out_shape = tuple(module(x).shape)
    label_shape = out_shape[:-1] if kind == "cross-entropy-last" else out_shape[:1] + out_shape[2:]
    labels = rng.integers(0, classes, size=label_shape).astype(np.int64)
    want_loss, want = _torch_reference(module, x, kind, labels)
    got_loss, got = _memplan_step(path, kind, {"x": x.numpy(), "logits_labels": labels})
    from passes.gradcheck import compare

    matched = [k for k in got if k in want]
    # floored at 1e-3 of the model's largest gradient, as bench/gradcheck_models.py: a key bias's
    # gradient is zero in theory (softmax ignores a per-row constant), float noise in both
    errors = dict(compare({k: got[k] for k in matched}, {k: want[k] for k in matched}, got_loss, floor=1e-3).errors)
    worst = max(errors.values(), default=float("nan"))
    print(name, {k: f"{v:.1e}" for k, v in sorted(errors.items(), key=lambda kv: -kv[1])[:3]},
          "unmatched:", sorted(set(got) - set(want))[:4], file=sys.stderr)
    r = {"model": name, "exporter": "dynamo" if dynamo else "torchscript", "loss": kind,
         "loss_rel_diff": abs(got_loss - want_loss) / abs(want_loss), "grads_compared": len(matched),
         "grads_total": len(got), "worst_grad_rel_diff": worst}
    planned = folder / f"{path.stem}.planned.onnx"
    rc, out = _cli("plan", str(path), "--add-loss", kind, "--budget", budget, "--time-limit", str(time_limit),
                   "--emit", str(planned), "--json")
    if rc != 0:
        r.update(plan=out.strip().splitlines()[-1])
        return r
    obj = json.loads(out[out.index("{"):])
    r.update(plan=obj["status"], unplanned_bytes=obj["unplanned_peak_bytes"], peak_bytes=obj["peak_bytes"],
             added_pct=100 * obj["added_time"] / obj["compute_time"])
    rc, out = _cli("verify", str(path), str(planned), "--json")
    rep = json.loads(out[out.index("{"):]) if rc in (0, 1) else {}
    r.update(verify_outputs_equal=rep.get("outputs_equal"), verify_compared=len(rep.get("outputs", [])))
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="70%")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--dynamo", action="store_true", help="export with torch.onnx.export(dynamo=True)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (module, x, kind, classes) in _models().items():
            rows.append(row(name, module, x, kind, classes, args.budget, args.time_limit, args.dynamo, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"| model | exporter | --add-loss | loss vs torch | grads vs torch (worst) | plan at {args.budget} "
          "| peak / unplanned | added | verify |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peak = f"{r['peak_bytes'] / r['unplanned_bytes']:.3f}" if "peak_bytes" in r else "-"
        added = f"+{r['added_pct']:.2f}%" if "added_pct" in r else "-"
        verify = (f"equal over {r['verify_compared']}" if r.get("verify_outputs_equal") else
                  ("-" if "verify_outputs_equal" not in r else "DIFFER"))
        print(f"| {r['model']} | {r['exporter']} | {r['loss']} | {r['loss_rel_diff']:.1e} | "
              f"{r['grads_compared']}/{r['grads_total']} ({r['worst_grad_rel_diff']:.1e}) | {r['plan']} | {peak} | "
              f"{added} | {verify} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
