"""memplan command line. Thin: parse, call planner/passes, print a table or one JSON object.

Exit codes: 0 ok, 1 check failed / budget infeasible, 2 usage, 3 bad input model, 4 solver gave no
plan in time. ``--json`` prints exactly one JSON object on stdout; logs go to stderr. Files are
written atomically and never on failure.
"""
from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any, Callable

import click

from planner.errors import (
    BudgetInfeasibleError,
    ModelImportError,
    PlannerError,
    SolverTimeoutError,
    UsageError,
)

log = logging.getLogger("memplan")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_MODEL, EXIT_TIMEOUT = 0, 1, 2, 3, 4


def _exit_code(err: PlannerError) -> int:
    if isinstance(err, UsageError):
        return EXIT_USAGE
    if isinstance(err, ModelImportError):
        return EXIT_BAD_MODEL
    if isinstance(err, BudgetInfeasibleError):
        return EXIT_FAILED
    if isinstance(err, SolverTimeoutError):
        return EXIT_TIMEOUT
    return EXIT_FAILED


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn memplan errors into one stderr line and the documented exit code (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PlannerError as err:
            click.echo(f"memplan: error: {err}", err=True)
            sys.exit(_exit_code(err))
        except FileNotFoundError as err:
            click.echo(f"memplan: error: {err.filename or err}: no such file", err=True)
            sys.exit(EXIT_USAGE)
        except MemoryError:
            click.echo("memplan: error: out of host memory; try a smaller model size or batch", err=True)
            sys.exit(EXIT_FAILED)

    return wrapper


def emit_json(obj: Any) -> None:
    """Print exactly one JSON object on stdout."""
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=_json_default))


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def parse_dims(dims: tuple[str, ...]) -> dict[str, int]:
    """``--dim batch=32 --dim seq=128`` -> {"batch": 32, "seq": 128}."""
    out: dict[str, int] = {}
    for item in dims:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit() or int(value) <= 0:
            raise UsageError(f"--dim {item!r} must look like NAME=POSITIVE_INT, e.g. --dim batch=32")
        out[name.strip()] = int(value)
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-v info, -vv debug).")
@click.version_option(package_name="memplan")
def main(verbose: int) -> None:
    """memplan: static memory planning for ONNX training graphs."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="memplan: %(message)s")


# ---- commands ------------------------------------------------------------------------------
# Each command lives below; keep them thin.

MODEL_HELP = "MODEL is an .onnx file, zoo:NAME[?opt=v&...] (built-in model) or a benchmark JSON graph."
dim_option = click.option("--dim", "dims", multiple=True, metavar="NAME=V",
                          help="Bind a symbolic input dim, e.g. --dim batch=32 (repeatable).")


def training_graph(graph, **options):
    """Forward graph with a scalar loss -> training graph (autodiff)."""
    from passes.autodiff import training_graph as build

    return build(graph, **options)


# ---- inspect ---------------------------------------------------------------------------------
@main.command()
@click.argument("model")
@click.option("--train", is_flag=True, help="Inspect the training step (forward + backward).")
@dim_option
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=0), help="Tensors listed at the peak.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG of memory over steps.")
@handles_errors
def inspect(model: str, train: bool, dims: tuple[str, ...], top: int, as_json: bool, plot: str | None) -> None:
    """Tensors, liveness, constant base and peak of one run of MODEL."""
    from passes.onnx_import import load_graph
    from planner.fileio import atomic_write
    from planner.liveness import analyze
    from planner.report import inspect_dict, inspect_table, timeline_png

    graph = load_graph(model, parse_dims(dims))
    if train:
        graph = training_graph(graph)
    lv = analyze(graph)
    info = inspect_dict(lv, model, top)
    if plot:
        atomic_write(plot, timeline_png(lv, f"{model}{' (training step)' if train else ''}"))
        log.info("wrote %s", plot)
    if as_json:
        emit_json(info)
    else:
        info.pop("timeline_bytes")
        click.echo(inspect_table(info))


# ---- verify ----------------------------------------------------------------------------------
@main.command()
@click.argument("model")
@click.argument("planned", metavar="OUT.onnx")
@dim_option
@click.option("--seed", default=0, show_default=True, help="Seed of the generated inputs.")
@click.option("--rtol", default=0.0, show_default=True, help="Relative tolerance (0: bit-identical).")
@click.option("--atol", default=0.0, show_default=True, help="Absolute tolerance.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handles_errors
def verify(model: str, planned: str, dims: tuple[str, ...], seed: int, rtol: float, atol: float, as_json: bool) -> None:
    """Run MODEL's (training) graph and the planned OUT.onnx on the same inputs in ORT: outputs, peak, time.

    Exit 0 when every output matches within the tolerance, 1 when not.
    """
    import models
    from passes.onnx_export import export_model
    from passes.onnx_import import import_model, load_proto
    from passes.verify import verify_models
    from planner.liveness import MemoryModel, analyze
    from planner.units import format_bytes

    planned_proto, _, _ = load_proto(planned)
    meta = {p.key: p.value for p in planned_proto.metadata_props}
    made_with = json.loads(meta.get("memplan.plan", "{}"))
    graph = import_model(model, parse_dims(dims))
    if made_with.get("train") is not None:
        graph = training_graph(graph, **made_with["train"])
    reference = export_model(graph)
    planned_graph = import_model(planned_proto)
    # On CPU the swap nodes are plain copies in the same RAM: predict what this run will hold.
    predicted = analyze(planned_graph, model=MemoryModel(host_copies_resident=True)).dynamic_peak
    feeds = models.example_feeds(reference, seed=seed)
    report = verify_models(reference, planned_proto, feeds, predicted_planned_peak=predicted,
                           base_bytes=planned_graph.base_bytes, rtol=rtol, atol=atol)
    info = report.as_dict()
    if as_json:
        emit_json(info)
    else:
        p, r = info["planned"], info["reference"]
        click.echo(f"outputs      {'equal' if report.outputs_equal else 'DIFFER'} "
                   f"(rtol {rtol:g}, atol {atol:g}; {len(report.outputs)} compared)")
        for o in report.outputs:
            if not o.ok:
                click.echo(f"  {o.name}: max abs diff {o.max_abs_diff:.3g}, max rel diff {o.max_rel_diff:.3g}")
        click.echo(f"peak         reference {format_bytes(r['peak_bytes'])}, planned {format_bytes(p['peak_bytes'])} "
                   f"(constant {format_bytes(info['base_bytes'])} + dynamic {format_bytes(p['dynamic_peak_bytes'])}; "
                   f"predicted dynamic {format_bytes(p['predicted_dynamic_peak_bytes'])}, "
                   f"measured/predicted {p['measured_over_predicted']:.3f})")
        click.echo(f"default ORT  planned dynamic peak {format_bytes(p['default_options_dynamic_peak_bytes'])} "
                   "with ORT's default session options")
        click.echo(f"step time    reference {r['seconds'] * 1e3:.1f} ms, planned {p['seconds'] * 1e3:.1f} ms "
                   f"({info['time_overhead'] * 100:+.1f}%)")
    if not report.outputs_equal:
        sys.exit(EXIT_FAILED)

# ---- check -----------------------------------------------------------------------------------
def check_plan_fn(graph, budget_bytes: int, device: str, time_limit: float):
    """The gate's one door to the planner: ``-> planner.gate.PlanOutcome``. Wire the planner here."""
    from planner.gate import no_planner

    return no_planner(graph, budget_bytes, device, time_limit)


def _load_for_check(item):
    from passes.onnx_import import load_graph

    graph = load_graph(item.model, dict(item.dims))
    return training_graph(graph) if item.train else graph


def _training_available() -> bool:
    """Whether ``training_graph`` can work; checked before any model is loaded."""
    import importlib.util

    return importlib.util.find_spec("passes.autodiff") is not None


def _output_paths_ok(outputs: dict[str, str | None], inputs: list[str]) -> None:
    """Report files must land in an existing folder and never on top of an input."""
    from pathlib import Path

    taken = {Path(p).resolve() for p in inputs if not p.startswith("zoo:")}
    for option, path in outputs.items():
        if not path or path == "-":
            continue
        target = Path(path).resolve()
        if not target.parent.is_dir():
            raise UsageError(f"{option} {path}: folder {target.parent} does not exist; create it first")
        if target in taken:
            raise UsageError(f"{option} {path} is one of the inputs; choose another file name")


@main.command()
@click.argument("models", nargs=-1, metavar="[MODEL]...")
@click.option("--budget", "budgets", multiple=True, metavar="B",
              help="Memory budget: 8GiB, 512MiB, 1.5GB, or 60% of the unplanned peak (needs a plan). Repeatable.")
@click.option("--train", is_flag=True, help="Check the training step (forward + backward).")
@click.option("--device", default=None, help="Device profile the planner prices time on (default h100).")
@dim_option
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds per plan (default 30).")
@click.option("--no-plan", is_flag=True, help="Only 'fits as is' counts; do not try to plan.")
@click.option("--config", "config", type=click.Path(dir_okay=False),
              help="Config file (pyproject.toml with [tool.memplan], or memplan.toml). Default: found upward.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--junit", type=click.Path(dir_okay=False), help="Write JUnit XML: one testcase per model and budget.")
@click.option("--markdown", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write a Markdown table (for $GITHUB_STEP_SUMMARY); '-' prints it instead of the table.")
@handles_errors
def check(models: tuple[str, ...], budgets: tuple[str, ...], train: bool, device: str | None,
          dims: tuple[str, ...], time_limit: float | None, no_plan: bool, config: str | None, as_json: bool,
          junit: str | None, markdown: str | None) -> None:
    """CI gate: does each MODEL fit its budget, as is or with a plan?

    Exit 0 when every model fits, 1 when any does not, 2 usage error, 3 a model cannot be loaded
    (the others are still checked and reported). Without MODEL, checks the models listed in the
    config ([tool.memplan] in pyproject.toml, or memplan.toml).
    """
    from pathlib import Path

    from planner import gate, gate_report
    from planner.fileio import atomic_write
    from planner.gate_config import Overrides, collect_items

    if as_json and markdown == "-":
        raise UsageError("--json and --markdown - both want stdout; write the Markdown to a file")
    cli = Overrides(budgets=budgets, train=train, dims=parse_dims(dims), device=device, time_limit=time_limit,
                    no_plan=no_plan)
    items, config_path = collect_items(models, cli, config, Path.cwd())
    if any(item.train for item in items) and not _training_available():
        raise UsageError("--train (train = true) needs autodiff, which this build does not have yet")
    inputs = [item.model for item in items] + ([str(config_path)] if config_path else [])
    _output_paths_ok({"--junit": junit, "--markdown": markdown}, inputs)

    verdicts = gate.run_checks(items, _load_for_check, check_plan_fn,
                               progress=lambda line: click.echo(f"memplan: {line}", err=True))
    for message in gate.model_errors(verdicts):
        click.echo(f"memplan: error: {message}", err=True)
    if junit:
        atomic_write(junit, gate_report.to_junit(verdicts))
    if markdown and markdown != "-":
        atomic_write(markdown, gate_report.to_markdown(verdicts))
    if as_json:
        emit_json(gate_report.to_json(verdicts))
    else:
        click.echo(gate_report.to_markdown(verdicts) if markdown == "-" else gate_report.to_table(verdicts))
    sys.exit(gate.exit_code(verdicts))


# ---- train-graph / train (autodiff) ----------------------------------------------------------
def optimizer_options(f):
    """Flags shared by train-graph and train: optimizer, its hyper-parameters, --freeze, --dim."""
    for opt in reversed([
        click.option("--optimizer", type=click.Choice(["none", "sgd", "adam"]), default=None,
                     help="Append an update step (default: none for train-graph, adam for train)."),
        click.option("--lr", type=float, default=None, help="Learning rate (default 0.01 sgd, 0.003 adam)."),
        click.option("--momentum", type=float, default=0.0, show_default=True, help="SGD momentum."),
        click.option("--beta1", type=float, default=0.9, show_default=True, help="Adam beta1."),
        click.option("--beta2", type=float, default=0.999, show_default=True, help="Adam beta2."),
        click.option("--weight-decay", type=float, default=0.0, show_default=True, help="L2 weight decay."),
        click.option("--freeze", multiple=True, metavar="PATTERN",
                     help="Initializers (glob on the name) that get no gradient; repeatable."),
        click.option("--loss", default=None, help="Loss output (default: the first scalar float output)."),
        dim_option,
    ]):
        f = opt(f)
    return f


def _train_options(optimizer, lr, momentum, beta1, beta2, weight_decay, freeze, loss, default_optimizer, **extra):
    from passes.autodiff import TrainOptions

    kind = optimizer or default_optimizer
    lr = lr if lr is not None else (0.003 if kind == "adam" else 0.01)
    return TrainOptions.from_kwargs(loss=loss, freeze=freeze, optimizer=kind, lr=lr, momentum=momentum,
                                    beta1=beta1, beta2=beta2, weight_decay=weight_decay, **extra)


@main.command("train-graph")
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Training-step model to write.")
@optimizer_options
@click.option("--keep-grads", is_flag=True, help="With an optimizer, also output the <param>_grad tensors.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handles_errors
def train_graph(model: str, output: str, dims: tuple[str, ...], keep_grads: bool, as_json: bool, **flags) -> None:
    """Forward MODEL ending in a scalar loss -> OUT.onnx with the backward (and optimizer step) in standard ops.

    Outputs: the loss, <param>_grad per trainable initializer; with --optimizer also <param>_new and
    the optimizer state (inputs <state>, outputs <state>_new; zeros before the first step).
    """
    import json as json_lib
    from pathlib import Path

    from passes.autodiff import build_training_graph
    from passes.onnx_export import check_model, export_model, save_model
    from passes.onnx_import import load_graph

    if not model.startswith("zoo:") and Path(model).resolve() == Path(output).resolve():
        raise UsageError(f"-o {output} is the input model; choose another file name")
    if not Path(output).resolve().parent.is_dir():
        raise UsageError(f"-o {output}: folder {Path(output).resolve().parent} does not exist; create it first")
    options = _train_options(default_optimizer="none", keep_grads=keep_grads, **flags)
    forward = load_graph(model, parse_dims(dims))
    step = build_training_graph(forward, options)
    proto = export_model(step.graph, metadata={"memplan.train": json_lib.dumps(options.as_kwargs())})
    check_model(proto, full=True)
    save_model(proto, output)
    backward = len(step.graph.nodes) - step.forward_nodes
    info = {"model": model, "output": output, "loss": step.loss, "params": len(step.params),
            "optimizer": options.optimizer.kind, "nodes": len(step.graph.nodes), "backward_nodes": backward,
            "inputs": [step.graph.tensors[t].name for t in step.graph.inputs],
            "outputs": [step.graph.tensors[t].name for t in step.graph.outputs],
            "saved": {k: list(v) for k, v in step.saved.items()}}
    if as_json:
        emit_json(info)
    else:
        click.echo(f"wrote {output}: {info['nodes']} nodes ({backward} backward/update), {len(step.params)} trainable "
                   f"initializers, optimizer {options.optimizer.kind}, {len(info['outputs'])} outputs")


@main.command("train")
@click.argument("model")
@optimizer_options
@click.option("--steps", default=100, show_default=True, type=click.IntRange(min=1), help="Optimizer steps.")
@click.option("--seed", default=0, show_default=True, help="Seed of the synthetic data.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (with every step's loss).")
@handles_errors
def train_cmd(model: str, dims: tuple[str, ...], steps: int, seed: int, provider: str, as_json: bool, **flags) -> None:
    """Train MODEL for --steps steps on a synthetic learnable task, running memplan's training step in ORT."""
    from passes.autodiff import build_training_graph
    from passes.onnx_import import load_graph
    from passes.training import summary, train

    options = _train_options(default_optimizer="adam", **flags)
    if options.optimizer.kind == "none":
        raise UsageError("memplan train needs --optimizer sgd or adam")
    forward = load_graph(model, parse_dims(dims))
    result = train(build_training_graph(forward, options), forward, steps, seed=seed, provider=provider)
    info = {"model": model, "task": result.task, "optimizer": options.optimizer.kind, "lr": options.optimizer.lr,
            "steps": steps, "provider": result.provider, "seconds": result.seconds, **summary(result)}
    if as_json:
        emit_json({**info, "losses": list(result.losses)})
        return
    stride = max(1, steps // 10)
    for k in range(0, steps, stride):
        click.echo(f"step {k:5d}  loss {result.losses[k]:.5f}")
    click.echo(f"step {steps - 1:5d}  loss {result.losses[-1]:.5f}")
    click.echo(f"{model}: {result.task} task, {options.optimizer.kind} lr {options.optimizer.lr:g}, "
               f"loss {info['first_loss']:.4f} -> {info['last_loss']:.4f} "
               f"(mean of first/last tenth {info['first_mean']:.4f} -> {info['last_mean']:.4f}) "
               f"in {result.seconds:.2f} s on {result.provider}")


# ---- memplan alloc: static arena offsets (planner/alloc.py) ------------------------------------
@main.command("alloc")
@click.argument("problem", type=click.Path(dir_okay=False))
@click.option("--capacity", help="Arena size (bytes or 1MiB style): every offset + size must fit.")
@click.option("--minimize", is_flag=True, help="Least arena height (within --capacity if given). "
              "The default when --capacity is not given.")
@click.option("--time-limit", type=float, default=10.0, show_default=True,
              help="Seconds for the exact search; the best valid placement found is returned.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the solution CSV (the problem's columns plus offset).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@handles_errors
def alloc_command(problem: str, capacity: str | None, minimize: bool, time_limit: float,
                  output: str | None, as_json: bool) -> None:
    """Fixed offsets in one arena for buffers in MiniMalloc's CSV (id,lower,upper,size[,alignment])."""
    import os

    from planner.alloc import AllocStatus, solve
    from planner.alloc_io import read_csv, write_solution
    from planner.units import format_bytes, parse_bytes

    if time_limit < 0:
        raise UsageError(f"--time-limit {time_limit} must be >= 0 seconds")
    if output and os.path.exists(output) and os.path.samefile(output, problem):
        raise UsageError(f"-o {output} is the problem file; write the solution to another path")
    cap = parse_bytes(capacity, "--capacity") if capacity else None
    buffers, _ = read_csv(problem)
    result = solve(buffers, capacity=cap, minimize=minimize, time_limit=time_limit)
    lb = result.lower_bound
    if result.status is AllocStatus.INFEASIBLE:
        raise BudgetInfeasibleError(
            f"capacity {cap} bytes is below what any placement needs: the lower bound is {lb} bytes"
            if lb > (cap or 0) else
            f"no placement fits capacity {cap} bytes (proven; lower bound {lb}); raise --capacity",
            least_bytes=lb,
        )
    if result.status is AllocStatus.TIMEOUT:
        why = ("the exact search skips problems this large" if result.stats.get("too_large_blocks")
               else f"nothing found in {time_limit:g} s")
        raise SolverTimeoutError(
            f"no placement within capacity {cap} bytes: {why} (lower bound {lb}, greedy "
            f"{result.greedy_height}); raise --time-limit or --capacity"
        )
    if output:
        write_solution(output, buffers, result.offsets)
    if as_json:
        emit_json({**result.to_json(), "solution": output,
                   "offsets": {b.id: off for b, off in zip(buffers, result.offsets)}})
        return
    rows = [
        ("buffers", f"{len(buffers)}"),
        ("lower bound", f"{lb} ({format_bytes(lb)})"),
        ("greedy", f"{result.greedy_height} (x{result.greedy_height / lb:.3f})" if lb else "0"),
        ("height", f"{result.height} (x{result.height / lb:.3f}) {result.status.value}" if lb else "0"),
        ("time", f"{result.wall_s:.2f} s ({result.method})"),
    ]
    if output:
        rows.append(("solution", output))
    for key, value in rows:
        click.echo(f"{key:<12} {value}")


if __name__ == "__main__":  # pragma: no cover
    main()
