"""memplan command line. Thin: parse, call planner/passes, print a table or one JSON object.

Exit codes: 0 ok, 1 check failed / budget infeasible, 2 usage, 3 bad input model, 4 solver gave no
plan in time. ``--json`` prints exactly one JSON object on stdout; logs go to stderr. Files are
written atomically and never on failure.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import sys
from typing import Any, Callable

import click

from planner.errors import (
    OUT_OF_MEMORY,
    BudgetInfeasibleError,
    ModelImportError,
    PlannerError,
    SolverTimeoutError,
    UnknownDimError,
    UsageError,
)
from planner.units import MAX_DIM  # the largest --dim value

log = logging.getLogger("memplan")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_MODEL, EXIT_TIMEOUT = 0, 1, 2, 3, 4
#: `memplan ... | head`: the reader left; the shell status of a process killed by SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141
#: Ctrl-C: the shell status of a process ended by SIGINT (128 + 2), which CI runners and shells read
#: as interrupted, not failed.
EXIT_INTERRUPTED = 130


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
        except BrokenPipeError:
            # the reader of stdout left (`memplan ... | head`): end quietly, as a tool killed by
            # SIGPIPE would (its files are written by then), not as a usage error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(EXIT_BROKEN_PIPE)
        except MemoryError:
            click.echo(f"memplan: error: {OUT_OF_MEMORY}", err=True)
            sys.exit(EXIT_FAILED)
        except OSError as err:  # a folder given as a file, a file that cannot be written, a full disk
            where = f"{err.filename}: " if err.filename else ""
            click.echo(f"memplan: error: {where}{err.strerror or err}", err=True)
            sys.exit(EXIT_USAGE)

    return wrapper


_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class OneLineErrors(click.Group):
    """Click's own usage errors (a bad option value, an unknown option, a missing argument) as one
    stderr line, like memplan's errors, instead of click's four-line usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        if hasattr(sys.stdout, "reconfigure"):
            # a character stdout's encoding lacks is escaped, as Python does on stderr, not a traceback
            # (exit 1, nothing printed): check --markdown -'s "✅ pass", or a model path in check's table,
            # under PYTHONIOENCODING=latin-1 or cp1252
            sys.stdout.reconfigure(errors="backslashreplace")
        try:
            code = super().main(*args, **kwargs)
        except _NO_ARGS as err:  # bare `memplan`: the help, as click prints it
            click.echo(err.format_message(), err=True)
            sys.exit(EXIT_USAGE)
        except click.UsageError as err:
            ctx = err.ctx
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            if isinstance(err, click.NoSuchOption) and err.option_name in ("-v", "--verbose") and ctx is not None:
                # memplan's -v is the group's: `memplan train ... -v`, as an error's "-v shows ..." reads
                root = ctx.find_root().info_name
                hint = (f" ({err.option_name} goes before the command: {root} {err.option_name} "
                        f"{ctx.command_path[len(root) + 1:]} ...)")
            click.echo(f"memplan: error: {err.format_message()}{hint}", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as err:
            click.echo(f"memplan: error: {err.format_message()}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("memplan: aborted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except ImportError as err:
            # SIGTERM or Ctrl-C while a C extension initialised (CP-SAT's, loaded by the first
            # solve): its init turned the signal's exception into "initialization failed"
            if isinstance(err.__cause__, SystemExit):  # planner.interrupt said "terminated"
                sys.exit(err.__cause__.code)
            if isinstance(err.__cause__, KeyboardInterrupt):
                click.echo("memplan: aborted", err=True)
                sys.exit(EXIT_INTERRUPTED)
            raise
        sys.exit(code if isinstance(code, int) else EXIT_OK)


def plan_digest(obj: dict, legacy: bool = False) -> str:
    """SHA-256 of a plan object's fields, as canonical JSON: unchanged by reformatting the file,
    changed by any edit of a value. Left out: the digest itself, the solver's report and the
    arena placement's seconds (wall times differ run to run, so the same plan keeps the same
    digest; rewrite reads none of it). ``legacy``: as plans written before stop 51 digested it,
    with the arena's seconds in."""
    import hashlib

    body = {k: v for k, v in obj.items() if k not in ("plan_digest", "solver")}
    if not legacy and isinstance(body.get("arena"), dict):
        body["arena"] = {k: v for k, v in body["arena"].items() if k != "seconds"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(text.encode()).hexdigest()


def emit_json(obj: Any) -> None:
    """Print exactly one JSON object on stdout. A NaN or infinite number (verify's difference of an
    output NaN on one side or of another shape, a diverged train loss) is null, as JSON has no such
    numbers (Python's NaN and Infinity tokens fail strict parsers)."""
    click.echo(json.dumps(_finite_json(obj), indent=2, sort_keys=False, allow_nan=False, default=_json_default))


def _finite_json(o: Any) -> Any:
    """``o`` with every float that is NaN or infinite (numpy's included) as None."""
    import numpy as np

    if isinstance(o, dict):
        return {k: _finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite_json(v) for v in o]
    if isinstance(o, np.ndarray):
        return _finite_json(o.tolist())
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(o) else None
    return o


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


class FiniteFloat(click.FloatRange):
    """A float option that refuses nan and infinities (click's FloatRange lets both through)."""

    name = "float"

    def _describe_range(self) -> str:
        # unbounded: no "[x<=None]" in --help
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        import math

        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


def parse_dims(dims: tuple[str, ...]) -> dict[str, int]:
    """``--dim batch=32 --dim seq=128`` -> {"batch": 32, "seq": 128}."""
    out: dict[str, int] = {}
    for item in dims:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit() or int(value) <= 0:
            raise UsageError(f"--dim {item!r} must look like NAME=POSITIVE_INT, e.g. --dim batch=32")
        if int(value) > MAX_DIM:  # sizes overflowed int64 with tracebacks (fuzzed, stop 50)
            raise UsageError(f"--dim {item!r}: {int(value)} is beyond any memory; a dim is at most {MAX_DIM}")
        name = name.strip()
        if name in out and out[name] != int(value):
            raise UsageError(f"--dim {name} is given twice ({out[name]} and {int(value)}); keep one")
        out[name] = int(value)
    return out


class _SaidOnce(logging.Filter):
    """Lets each warning text through once."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        text = record.getMessage()
        if text in self.said:
            return False
        self.said.add(text)
        return True


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-v info, -vv debug).")
@click.version_option(package_name="memplan")
def main(verbose: int) -> None:
    """memplan: static memory planning for ONNX training graphs."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="memplan: %(message)s")
    # a command that solves many times (--max-batch's probes, --sweep's rows, --ort-arena's re-solves)
    # says the planner's same warning once: the --wall-cap deadline is the command's, so every solve
    # after it passed says it was capped
    once = _SaidOnce()
    for name in ("planner.planning", "passes.onnx_import"):  # a model is read more than once, too
        said_once = logging.getLogger(name)
        said_once.addFilter(once)
        click.get_current_context().call_on_close(lambda said_once=said_once: said_once.removeFilter(once))
    from planner import interrupt

    # Ctrl-C stops a CP-SAT solve too, and memplan with it (nothing written); undone as the command
    # ends, so that an in-process caller (CliRunner, standalone_mode=False) keeps its own handlers
    click.get_current_context().call_on_close(interrupt.install())


# ---- commands ------------------------------------------------------------------------------
# Each command lives below; keep them thin.

MODEL_HELP = "MODEL is an .onnx file, zoo:NAME[?opt=v&...] (built-in model) or a benchmark JSON graph."
dim_option = click.option("--dim", "dims", multiple=True, metavar="NAME=V",
                          help="Bind a symbolic input dim, e.g. --dim batch=32 (repeatable); on a zoo model, "
                               "set its option of that name (zoo:gpt --dim batch=32 is zoo:gpt?batch=32).")

ADD_LOSS_HELP = ("Append a loss to a model that ends in predictions, for its training step: cross-entropy (classes "
                 "on axis 1, new int64 input <output>_labels), cross-entropy-last (classes on the last axis, as a "
                 "language model's logits), mse (new input <output>_target) or mean, on the float output named "
                 "after the colon (default: the only one). The loss becomes the only output.")
add_loss_option = click.option("--add-loss", "add_loss", default=None, metavar="KIND[:OUTPUT]", help=ADD_LOSS_HELP)
LOSS_HELP = ("The scalar float output to train as the loss (default: the first; a warning names the others "
             "where there are several).")
loss_option = click.option("--loss", default=None, metavar="OUTPUT", help=LOSS_HELP)


def training_graph(graph, **options):
    """Forward graph with a scalar loss -> training graph (autodiff), as ORT runs it."""
    from passes.autodiff import training_graph as build

    return build(graph, **options)


def as_run(graph):
    """A graph run as it is, as ORT runs it: function ops as their bodies (passes/function_ops.py);
    node outputs nobody reads (an unused Split half, LSTM's Y_h / Y_c) left out where optional and
    given a 1-element reader otherwise, as in a training step (passes/portable.py): ORT would hold
    them to the end of the run."""
    from passes.function_ops import inline_functions
    from passes.portable import release_unread_outputs

    return inline_functions(release_unread_outputs(graph)[0])


# ---- inspect ---------------------------------------------------------------------------------
@main.command()
@click.argument("model")
@click.option("--train", is_flag=True, help="Inspect the training step (forward + backward).")
@add_loss_option
@loss_option
@dim_option
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=0), help="Tensors listed at the peak.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a plot of memory over steps: PNG, SVG or PDF by the file's extension (none: PNG).")
@handles_errors
def inspect(model: str, train: bool, add_loss: str | None, loss: str | None, dims: tuple[str, ...], top: int,
            as_json: bool, plot: str | None) -> None:
    """Tensors, liveness, constant base and peak of one run of MODEL."""
    from planner.fileio import atomic_write
    from planner.liveness import analyze
    from planner.report import inspect_dict, inspect_table, plot_format, timeline_plot

    _refuse_json_graph(model, "inspect", "read")
    _output_paths_ok({"--plot": plot}, [model])
    plot_fmt = plot_format("--plot", plot) if plot else None
    # as plan builds it: a loss is only for training, and a step train-graph wrote is inspected as it is
    training = bool(train or add_loss or loss)  # --add-loss and --loss inspect the training step too
    graph, _ = _graph_to_plan(model, parse_dims(dims), forward=not training, add_loss=add_loss, loss=loss)
    lv = analyze(graph)
    info = inspect_dict(lv, model, top)
    if plot:
        atomic_write(plot, timeline_plot(lv, f"{model}{' (training step)' if training else ''}", plot_fmt))
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
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0, max=(1 << 63) - 1),
              help="Seed of the generated inputs and of ORT's random ops (Dropout).")
@click.option("--rtol", type=FiniteFloat(min=0), default=0.0, show_default=True, help="Relative tolerance (0: bit-identical).")
@click.option("--atol", type=FiniteFloat(min=0), default=0.0, show_default=True, help="Absolute tolerance.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@handles_errors
def verify(model: str, planned: str, dims: tuple[str, ...], seed: int, rtol: float, atol: float, as_json: bool) -> None:
    """Run MODEL's (training) graph and the planned OUT.onnx on the same inputs in ORT: outputs, peak, time.

    Exit 0 when every output matches within the tolerance and the counted peak is within the
    plan's budget, 1 when not, 2 when OUT.onnx was not planned from MODEL as it is now (another
    model or --dim, other weight values, or no memplan plan in it: plan it again), 3 when a model
    cannot be read.
    """
    import tempfile
    from pathlib import Path

    import models
    from passes.onnx_export import export_model, initializer_values, write_model
    from passes.onnx_import import import_as_run, import_model
    from passes.plan_model import fingerprint
    from passes.verify import cpu_float32_fallback_ops, held_base_bytes, verify_models
    from planner.arena import NEXT_POWER_OF_TWO, SAME_AS_REQUESTED, arena_need
    from planner.liveness import MemoryModel, analyze
    from planner.units import format_bytes

    _refuse_json_graph(model, "verify", "run")
    _refuse_memplan_output(planned, f"OUT.onnx {planned}", "give the model memplan plan --emit or memplan rewrite wrote")
    _refuse_json_graph(planned, "verify", "run", label=f"OUT.onnx {planned}")
    if planned.startswith("zoo:") or not Path(planned).is_file():
        raise UsageError(f"OUT.onnx {planned!r} is not a file: give MODEL first, then the .onnx file that memplan "
                         "plan --emit or memplan rewrite wrote")
    meta = _metadata(planned)  # the runs read the file
    if "memplan.plan" not in meta:
        raise UsageError(f"{planned} carries no memplan plan (its metadata has no memplan.plan entry): give a model "
                         "written by memplan plan --emit or memplan rewrite")
    made_with = _made_with(planned, meta["memplan.plan"])
    given, planned_dims = parse_dims(dims), made_with.get("dims") or {}
    graph = import_model(model, given or planned_dims, loose_dims=(), fold=_folds(model))  # as plan read it
    weights = initializer_values(graph)  # the model's own, before the training step adds any
    graph = training_graph(graph, **made_with["train"]) if made_with.get("train") is not None else as_run(graph)
    if "model_fingerprint" in made_with and fingerprint(graph) != made_with["model_fingerprint"]:
        if given and planned_dims and given != planned_dims:  # the same model, bound to other sizes
            shown = " ".join(f"--dim {k}={v}" for k, v in planned_dims.items())
            raise UsageError(f"{planned} was planned with {shown}, not the --dim given here; verify it with "
                             f"those (or leave --dim out), or plan the model again at these sizes")
        raise UsageError(f"{planned} was planned for another model than {model!r} (or the model changed); "
                         "plan it again with memplan plan --emit")
    planned_graph = import_as_run(planned)  # as ORT runs it: its Size nodes run, and early
    changed = _changed_weights(weights, initializer_values(planned_graph))
    if changed:
        # the fingerprint is structural: a planned file kept from before the weights changed ran, and
        # verify said the outputs DIFFER, as if the plan had broken the numerics
        raise UsageError(f"{planned} holds other values than {model!r} for {len(changed)} of its weights "
                         f"({changed[0]!r} first): it was planned from another version of the model; plan it "
                         "again with memplan plan --emit")
    # On CPU the swap nodes are plain copies in the same RAM: predict what this run will hold.
    planned_lv = analyze(planned_graph, model=MemoryModel(host_copies_resident=True))
    predicted = planned_lv.dynamic_peak
    feeds = models.example_feeds(export_model(graph, weights=False), seed=seed)
    if (made_with.get("train") or {}).get("optimizer") == "adam":
        from passes.optimizer import plausible_state

        feeds = plausible_state(feeds)
    with tempfile.TemporaryDirectory(prefix="memplan-verify-") as tmp:
        # the reference as a file, its weights written from the model's own (no proto holds them)
        reference = str(Path(tmp) / "reference.onnx")
        write_model(graph, reference)
        numerics = None
        if made_with.get("pin_order"):  # its Conv weights are read through views: other kernels
            from passes.pin_order import as_pinned_numerics

            stand_in = as_pinned_numerics(graph)
            if stand_in is not None:
                numerics = ("the model with its Conv weights read through views, as the pinned file reads them",
                            str(Path(tmp) / "stand_in.onnx"))
                write_model(stand_in, numerics[1], value_info=False)
        report = verify_models(reference, planned, feeds, predicted_planned_peak=predicted,
                               predicted_allocator_peak=planned_lv.allocator_dynamic_peak,
                               base_bytes=held_base_bytes(planned, planned_graph), rtol=rtol, atol=atol,
                               predicted_time_overhead=made_with.get("added_time_fraction"), numerics=numerics, seed=seed,
                               predicted_device=made_with.get("costs") or (
                                   f"device profile {made_with['device']}" if made_with.get("device") else None))
        # as ORT runs it too: folding made the training step's ConstantOfShape a constant, its shape
        # input gone from the arena (zoo:gpt's reference: a kNextPowerOfTwo limit of 470564 bytes, under
        # which ORT fails; 470580 read as run)
        reference_lv = analyze(import_as_run(reference), model=MemoryModel(host_copies_resident=True))
    info = report.as_dict()
    info["cpu_float32_fallback_ops"] = fallback = cpu_float32_fallback_ops(planned_graph)
    info["budget"] = _verify_budget(made_with, planned_graph, report, info)
    if fallback and not report.outputs_equal:
        # ORT rounds to float16 only where a Cast is left between the ops it runs in float32; the
        # planned file's added nodes (swap copies, ordering edges) keep Casts the reference's run drops
        info["outputs_note"] = (f"ORT's CPU provider ran {fallback} float16/bfloat16 ops of the planned file in "
                                f"float32, rounding to half precision only where a Cast is left between them, and "
                                f"the nodes the plan adds (swap copies, ordering edges) keep Casts that the "
                                f"reference's run drops, so the two may round differently here. Compare with a half-"
                                f"precision tolerance (--rtol 1e-2 --atol 1e-3) or on a device (bench/gpu_check.py)")
    # what a memory limit on ORT's arena (gpu_mem_limit, a CPU arena's max_mem) must be for these two
    # files on this CPU provider: planner/arena.py's replay of ORT's BFC arena, per extend strategy
    run_lv = {"reference": reference_lv, "planned": planned_lv}
    info["ort_arena_limit_bytes"] = {
        name: {"kNextPowerOfTwo": arena_need(lv, strategy=NEXT_POWER_OF_TWO),
               "kSameAsRequested": arena_need(lv, strategy=SAME_AS_REQUESTED)} for name, lv in run_lv.items()}
    status, failure = _verify_status(report, info)
    info = {"schema": info["schema"], "status": status, **info}  # read first, as plan.json's status
    if as_json:
        emit_json(info)
    else:
        p, r = info["planned"], info["reference"]
        click.echo(f"outputs      {'equal' if report.outputs_equal else 'DIFFER'} "
                   f"(rtol {rtol:g}, atol {atol:g}; {len(report.outputs)} compared)")
        if report.compared_with is not None:
            click.echo(f"  compared with {report.compared_with} (ORT runs such Convs with other kernels, "
                       f"which round differently); the model's own outputs differ by at most "
                       f"{report.reference_max_abs_diff:.3g}")
        for o in report.outputs:
            if not o.ok:
                click.echo(f"  {o.name}: max abs diff {o.max_abs_diff:.3g}, max rel diff {o.max_rel_diff:.3g}")
        if info.get("outputs_note"):
            click.echo(f"  {info['outputs_note']}")
        if not report.peak_resolved:
            from passes.verify import RSS_RESOLUTION_BYTES

            click.echo(f"peak         not measured: the planned model's predicted dynamic peak, "
                       f"{format_bytes(p['predicted_dynamic_peak_bytes'])}, is below the "
                       f"{format_bytes(RSS_RESOLUTION_BYTES)} the process high-water mark resolves (the "
                       f"allocation counter, passes/alloc_counter.py, could not be built or preloaded here: -v says "
                       f"why); bind a larger batch (--dim) to measure it")
        else:
            how = "ORT's allocator bytes, counted" if info["measured_by"] == "allocator" else "process RSS"
            click.echo(f"peak         reference {format_bytes(r['peak_bytes'])}, planned {format_bytes(p['peak_bytes'])} "
                       f"(constant {format_bytes(info['base_bytes'])} + dynamic {format_bytes(p['dynamic_peak_bytes'])}; "
                       f"predicted dynamic {format_bytes(p['predicted_dynamic_peak_bytes'])}"
                       + (f" ({format_bytes(p['predicted_allocator_peak_bytes'])} in ORT's allocator, less "
                          f"kernel buffers taken outside it: ScatterElements' index copies, Dropout's mask)"
                          if p['predicted_allocator_peak_bytes'] != p['predicted_dynamic_peak_bytes'] else "")
                       + f", measured/predicted {p['measured_over_predicted']:.3f}; {how})")
            if fallback:
                click.echo(f"  not the plan's memory: ORT's CPU provider has no float16/bfloat16 kernel for some "
                           f"ops here and ran {fallback} ops in float32 (their float32 copies held, Casts inserted "
                           f"around them); the outputs are compared, the peaks are not comparable: measure on a device "
                           f"(bench/gpu_check.py)")
            d = info["ort_default_options"]
            if d["error"] is not None:
                click.echo(f"default ORT  not measured: ONNX Runtime cannot run the planned model under its default "
                           f"session options ({d['error']}); run it with passes.verify.planned_session_options()")
            else:
                click.echo(f"default ORT  {_default_options_line(d, made_with)}")
        click.echo(f"budget       {info['budget']['text']}")
        lim = info["ort_arena_limit_bytes"]
        click.echo(f"arena limit  the least ORT arena limit (gpu_mem_limit, max_mem) each runs under, predicted: "
                   f"planned {format_bytes(lim['planned']['kNextPowerOfTwo'])} (kNextPowerOfTwo), "
                   f"{format_bytes(lim['planned']['kSameAsRequested'])} (kSameAsRequested); reference "
                   f"{format_bytes(lim['reference']['kNextPowerOfTwo'])}, "
                   f"{format_bytes(lim['reference']['kSameAsRequested'])}; plan with --ort-arena to fit a limit")
        pred_t = info["predicted_time_overhead"]
        pred_text = "" if pred_t is None else f"; predicted {pred_t * 100:+.1f}%, op times: {info['predicted_time_device']}"
        rs, ps = r["seconds_spread"], p["seconds_spread"]
        low, high = info["time_overhead_range"]
        click.echo(f"step time    reference {r['seconds'] * 1e3:.1f} ms (IQR {rs['q1'] * 1e3:.1f}-{rs['q3'] * 1e3:.1f}), "
                   f"planned {p['seconds'] * 1e3:.1f} ms (IQR {ps['q1'] * 1e3:.1f}-{ps['q3'] * 1e3:.1f}) (measured "
                   f"{info['time_overhead'] * 100:+.1f}%, medians of {info['time_rounds']} alternating runs each, "
                   f"1 thread{pred_text})")
        if info["time_overhead_within_noise"]:
            click.echo(f"  within noise: the two interquartile ranges overlap (they allow {low * 100:+.1f}% to "
                       f"{high * 100:+.1f}%), so these runs do not tell the planned step's time from the reference's")
        load = info["machine_load"]
        if load["loaded"]:
            click.echo(f"  machine loaded: load average {load['load_average_1min']:.1f} on {load['cpus']} CPUs while "
                       f"timing; step times swing with other work, rerun verify on an idle machine to trust them")
    if failure:
        click.echo(f"memplan: error: {failure}", err=True)
        sys.exit(EXIT_FAILED)


def _default_options_line(d: dict, made_with: dict) -> str:
    """verify's line on the planned model's peaks under ORT's default session options (``d``, the
    report's ort_default_options), with the advice that fits them."""
    from planner.units import format_bytes

    # a pinned model keeps its order and has no memory pattern under ORT's defaults; where it
    # then holds its plan with the arena off, what is left is the CPU arena's fragmentation
    # (bench/results/ort_default_options_arena.md). --pin-order is no advice for a pinned model.
    advice = "run it with passes.verify.planned_session_options()"
    if not made_with.get("pin_order"):
        advice += " (or emit it with --pin-order for ORT's default order)"
    elif d["arena_off_over_predicted"] <= 1.05:
        # the arena's first region is 1 MiB whatever the run asks: a model under it reads
        # 3-7x (zoo:cnn?batch=1 at 70%: 1.00 MiB, 5.44 x), none of it fragmentation
        from planner.arena import FIRST_REGION

        rest = ("the CPU arena's first region (1 MiB, reserved however little the run needs)"
                if d["dynamic_peak_bytes"] <= FIRST_REGION else "the CPU arena's fragmentation")
        advice = (f"the rest is {rest}: SessionOptions.enable_cpu_mem_arena = False, "
                  "or passes.verify.planned_session_options()")
    return (f"planned dynamic peak {format_bytes(d['dynamic_peak_bytes'])} ({d['over_predicted']:.2f} x predicted) "
            f"under ORT's default session options, arena chunks kept included; arena off: "
            f"{format_bytes(d['arena_off_dynamic_peak_bytes'])} ({d['arena_off_over_predicted']:.2f} x); {advice}")


def _changed_weights(model: dict, planned: dict) -> list[str]:
    """Names of ``model``'s initializers that ``planned`` holds under the same name with other
    bytes (or another shape or type)."""
    import numpy as np

    def same(a, b) -> bool:
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype == object:
            return bool(np.array_equal(a, b))
        # bytes, not values: a NaN weight equals itself
        return bool(np.array_equal(np.ascontiguousarray(a).reshape(-1).view(np.uint8),
                                   np.ascontiguousarray(b).reshape(-1).view(np.uint8)))

    return [name for name, value in model.items() if name in planned and not same(value, planned[name])]


def _is_integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    return (_is_integer(v) or isinstance(v, float)) and math.isfinite(v)


TRAIN_FIELD = "an object of optimizer, lr, add_loss and loss"


def _train_field_ok(train: Any, lr_ok: Callable[[dict], bool]) -> bool:
    """Whether the ``train`` field of a plan (rewrite) or of a planned file's metadata (verify) is
    None or the training options memplan records; ``lr_ok(train)`` judges its lr."""
    return train is None or (isinstance(train, dict) and set(train) <= {"optimizer", "lr", "add_loss", "loss"}
                             and isinstance(train.get("optimizer", ""), str) and lr_ok(train)
                             and isinstance(train.get("add_loss") or "", str)
                             and isinstance(train.get("loss") or "", str))


def _made_with(planned: str, text: str) -> dict:
    """The memplan.plan metadata of a planned file, checked field by field: an edited entry (not
    JSON, a list, a string for train or budget_bytes) was a JSONDecodeError/TypeError traceback."""
    try:
        made = json.loads(text)
    except ValueError:
        made = None
    if not isinstance(made, dict):
        raise ModelImportError(f"{planned}: its memplan.plan metadata is not a JSON object; emit the file again "
                               "with memplan plan --emit or memplan rewrite")
    train, dims, budget, added = made.get("train"), made.get("dims"), made.get("budget_bytes"), \
        made.get("added_time_fraction")
    checks = (
        ("train", _train_field_ok(train, lambda t: t.get("lr") is None or _is_integer(t["lr"]) or isinstance(t["lr"], float)),
         TRAIN_FIELD),
        ("dims", dims is None or (isinstance(dims, dict) and all(_is_integer(v) and v > 0 for v in dims.values())),
         "an object of NAME: positive integer"),
        ("budget_bytes", budget is None or (_is_integer(budget) and budget >= 0), "a byte count"),
        ("added_time_fraction", added is None or _is_number(added), "a number"),
        ("model_fingerprint", isinstance(made.get("model_fingerprint", ""), str), "a string"),
        ("device", isinstance(made.get("device") or "", str) and isinstance(made.get("costs") or "", str),
         "a device profile's name"),
        ("pin_order", made.get("pin_order") is None or isinstance(made["pin_order"], bool), "true or false"),
    )
    for field, ok, what in checks:
        if not ok:
            raise ModelImportError(f"{planned}: the {field} of its memplan.plan metadata is not {what}; emit the "
                                   "file again with memplan plan --emit or memplan rewrite")
    return made


def _verify_budget(made_with: dict, planned_graph, report, info: dict) -> dict:
    """The planned run's measured peak against the plan's budget (``memplan verify``): within it or
    not where the allocator counted the run; a plan that swaps is only said, since on CPU its swaps
    are copies in the same memory (fuzzed, stop 49: 1.2-2.0x the budget, and nothing said)."""
    from planner.liveness import analyze
    from planner.units import format_bytes

    budget = made_with.get("budget_bytes")
    swaps = sum(1 for n in planned_graph.nodes if n.op_type == "MemcpyToHost")
    measured = info["planned"]["peak_bytes"]
    out = {"budget_bytes": budget, "swaps": swaps, "within": None}
    if budget is None:
        out["text"] = "not recorded in the file"
    elif swaps:
        device = report.base_bytes + analyze(planned_graph).dynamic_peak
        out.update(predicted_device_peak_bytes=device)
        out["text"] = (f"{format_bytes(budget)}; the plan swaps {swaps} tensors to host memory, which on CPU is the "
                       f"memory they are in, so this run holds {format_bytes(measured)}; on a device the plan "
                       f"peaks at {format_bytes(device)} (predicted): measure it there (bench/gpu_check.py)")
    elif info.get("cpu_float32_fallback_ops"):
        out["text"] = (f"{format_bytes(budget)}; not held against this run: ORT's CPU provider ran float16/bfloat16 "
                       f"ops in float32 ({info['cpu_float32_fallback_ops']} ops), so its peak is not the "
                       f"plan's")
    elif not report.peak_resolved or info["measured_by"] != "allocator":
        out["text"] = f"{format_bytes(budget)}; the run's peak was not counted, so it is not held against it"
    else:
        out["within"] = measured <= budget
        out["text"] = (f"{format_bytes(budget)}: the planned run peaks at {format_bytes(measured)}, "
                       + ("within it" if out["within"] else f"OVER it by {format_bytes(measured - budget)}"))
    return out


def _verify_status(report, info: dict) -> tuple[str, str | None]:
    """``memplan verify``'s verdict: its JSON ``status`` ("ok", "outputs_differ" or "over_budget"; outputs
    first where both fail) and, where it failed, the one error line saying what and how to go on. A CI
    job read ``outputs_equal`` and ``budget.within`` to learn why verify exited 1, and stderr said nothing."""
    from planner.units import format_bytes

    failures = []
    differ = [o for o in report.outputs if not o.ok]
    if differ:
        worst = max(differ, key=lambda o: (o.max_abs_diff, o.max_rel_diff))
        fix = ("compare with a half-precision tolerance (--rtol 1e-2 --atol 1e-3): ORT's CPU provider ran float16 "
               "ops in float32" if info.get("outputs_note") else
               "a plan only reorders, recomputes and copies, so they should be bit-identical: emit the file again "
               "(memplan plan --emit or memplan rewrite) and report it if it still differs, or allow rounding "
               "with --rtol/--atol")
        failures.append(f"{len(differ)} of {len(report.outputs)} outputs differ from the reference's (rtol "
                        f"{report.rtol:g}, atol {report.atol:g}), the most {worst.name!r} (max abs diff "
                        f"{worst.max_abs_diff:.3g}, max rel diff {worst.max_rel_diff:.3g}); {fix}")
    budget = info["budget"]
    if budget["within"] is False:
        measured, limit = info["planned"]["peak_bytes"], budget["budget_bytes"]
        predicted = info["base_bytes"] + info["planned"]["predicted_dynamic_peak_bytes"]
        failures.append(f"the planned run peaks at {format_bytes(measured)} ({measured} bytes, counted), over the "
                        f"plan's budget of {format_bytes(limit)} ({limit} bytes) by {format_bytes(measured - limit)}; "
                        f"memplan predicted {format_bytes(predicted)}: "
                        + ("plan it again with a lower budget to leave that margin, and report the model"
                           if predicted <= limit else "the file's plan does not fit its own budget (was the "
                           "file edited?): emit it again with memplan plan --emit or memplan rewrite"))
    status = "outputs_differ" if differ else "over_budget" if failures else "ok"
    return status, "; and ".join(failures) or None


def _share_of_unplanned(note: str, best: int | None, unplanned: int | None) -> str:
    """``note`` with the lowest plan's peak also given as a share of the model's unplanned peak."""
    if best is None or not unplanned:
        return note
    if best >= unplanned:  # the problem's accounting of in-place outputs: the model as is is the lowest
        return note.replace(f"the lowest plan found peaks at {best} bytes",
                            f"no plan found goes below the unplanned peak ({unplanned} bytes)", 1)
    from planner.units import share_up

    return note.replace(f"peaks at {best} bytes", f"peaks at {best} bytes ({share_up(best, unplanned)} of the "
                                                  "unplanned peak)", 1)


def _infeasible_error(result, budget: int, unplanned: int | None) -> BudgetInfeasibleError:
    """The one-line error for an infeasible solve, with the least memory it proved (``memplan plan``
    and the gate).

    The lowering counts in-place ops' outputs apart (a recompute can move their last use), so its
    least can exceed the real unplanned peak; then the unplanned schedule is the honest bound
    (passes.plan_model.plan_graph reports it so).
    """
    from planner.units import format_bytes, share_up

    least = result.least_bytes
    tail = f"budget {budget} ({format_bytes(budget)})"
    if unplanned is not None and least >= unplanned:
        const = (f", of which initializers and graph inputs hold {format_bytes(result.base_bytes)} throughout"
                 if result.base_bytes else "")
        return BudgetInfeasibleError(
            f"infeasible: memplan finds no plan below the unplanned peak {unplanned} ({format_bytes(unplanned)})"
            f"{const}; {tail}", least_bytes=unplanned)
    word = "is" if result.least_exact else "is at least"
    scope = " in the given node order" if result.least_order == "given" else ""
    share = f", {share_up(least, unplanned)} of the unplanned peak" if unplanned else ""  # for --budget N%
    best, found = result.best_bytes, ""
    if best is not None and not result.least_exact and (unplanned is None or best < unplanned):
        of = f", {share_up(best, unplanned)}" if unplanned else ""
        found = f", and the lowest plan found peaks at {best} ({format_bytes(best)}{of})"
    if budget < result.base_bytes:
        tail += (f", below the {result.base_bytes} bytes ({format_bytes(result.base_bytes)}) that initializers and "
                 f"graph inputs hold throughout: check the budget's unit")
    return BudgetInfeasibleError(
        f"infeasible: the least memory any plan{scope} reaches {word} {least} ({format_bytes(least)}{share}){found}; "
        f"{tail}",
        least_bytes=least, best_bytes=best if found else None)


def _wall_cap(seconds: float | None, deterministic: bool) -> float:
    """--wall-cap -> PlannerOptions.wall_deadline: one deadline for every solve of the command."""
    from planner import clock

    if seconds is not None and not deterministic:
        raise UsageError("--wall-cap caps a --deterministic solve; add --deterministic (--time-limit caps the wall "
                         "time otherwise)")
    return math.inf if seconds is None else clock.wall_deadline(seconds)


# ---- check -----------------------------------------------------------------------------------
#: Share of --time-limit check spends on a budget proven out of reach before any search (below the
#: least peak any node order may reach): only the "lowest plan found" figure improves with more.
CHECK_PROVEN_SHARE = 0.1


def check_plan_fn(graph, budget_bytes: int, device: str, time_limit: float, deterministic: bool = False,
                  ort_arena: str | None = None):
    """The gate's one door to the planner: ``-> planner.gate.PlanOutcome``."""
    from passes.plan_model import plan_graph
    from planner.cpsat import PlannerOptions
    from planner.gate import PlanOutcome

    _, node_time, _ = _device_costs(device)
    # recompute only, like `memplan plan` by default (swap is opt-in there)
    # a budget no plan in any order meets is failed at once; the lowest plan found gets a tenth of the limit
    options = PlannerOptions(time_limit=time_limit, work_limit=deterministic, proven_share=CHECK_PROVEN_SHARE)
    pm = plan_graph(graph, budget_bytes, options=options, node_time=node_time,
                    transfer_time=None, time_unit="s", ort_arena=_ort_arena(ort_arena, device))
    r = pm.result
    if not pm.ok:
        if r.status == "infeasible" and r.least_bytes is not None:
            raise _infeasible_error(r, budget_bytes, pm.unplanned_peak)
        if r.status == "timeout" and pm.arena_least is None:
            raise SolverTimeoutError(r.note or "no plan within the time limit", best_bytes=r.best_bytes)
        # plans the arena refused: the least arena need found is what the gate judges ("best arena");
        # plans that overshot the budget once rewritten: the lowest is the peak that counts (not the
        # unplanned one, which the gate took instead: -1.87 KiB of headroom for a plan 16 B over)
        return PlanOutcome(False, pm.lowest_over or 0, None, r.status, arena_bytes=pm.arena_least)
    return PlanOutcome(True, int(pm.peak_bytes), float(r.added_time / max(r.compute_time, 1e-300)), r.status,
                       arena_bytes=pm.arena_need)


def check_arena_fn(graph, item) -> int:
    """The gate's arena replay: the least limit ORT's arena runs ``graph`` under, as is."""
    return _ort_arena(item.ort_arena, item.device).need(graph)


def _load_for_check(item, matched_dims: set[str] | None = None, dim_names: set[str] | None = None,
                    inputs_read: list[str] | None = None):
    from passes.onnx_import import load_graph

    writer = _step_writer(item.model)
    try:
        graph = load_graph(item.model, dict(item.dims), loose_dims=item.loose_dims, matched_dims=matched_dims,
                           dim_names=dim_names, inputs_read=inputs_read, fold=writer is None)  # as _folds says
    except UnknownDimError as err:  # a typo in a config entry's own dims: named there, not as a --dim never given
        # one entry's dims merged with --dim: its `dims = { bacth = 3 }` was worded as --dim bacth
        if item.dims_where and set(err.dims) <= dict(item.dims).keys() and not set(err.dims) & set(item.cli_dims):
            raise UsageError(f"{item.dims_where}: dims: {err.detail}") from None
        raise
    if not item.train:
        return as_run(graph)
    if writer is not None:  # as plan and inspect take it: differentiated again, it lost its update step
        for flag, key, given in (("--add-loss", "add_loss", item.add_loss), ("--loss", "loss", item.loss)):
            if given:
                raise UsageError(f"already a training step ({writer} wrote it); drop {flag} ({key} in a config)")
        return as_run(graph)
    return training_graph(graph, **({"add_loss": item.add_loss} if item.add_loss else {}),
                          **({"loss": item.loss} if item.loss else {}))


def _training_available() -> bool:
    """Whether ``training_graph`` can work; checked before any model is loaded."""
    import importlib.util

    return importlib.util.find_spec("passes.autodiff") is not None


def _output_paths_ok(outputs: dict[str, str | None], inputs: list[str], models: tuple[str, ...] = (),
                     stdout: tuple[str, ...] = (), onnx_inputs: bool = True) -> None:
    """Before any work: every file memplan will write lands in a folder it can write in, never on
    top of an input (a model, the data file its weights lie in, a profile, a graph), and no two
    options write the same file (``-o p.json --emit p.json`` wrote the plan, then the model over
    it). The options in ``models`` write ONNX models, whose weights may go to ``<file>.data``
    beside them: never the data file an input model reads. ``-`` means stdout only for the
    options in ``stdout``; elsewhere it is refused (it would be a file named ``-``). Without
    ``onnx_inputs`` (alloc's CSV) no input is read as a model for its data files: importing onnx
    for that took 4 s of a 3 s alloc run."""
    from pathlib import Path

    taken = {}
    for p in inputs:
        if p and not p.startswith("zoo:"):
            taken[Path(os.path.realpath(p))] = "an input"  # Path.resolve raised RuntimeError on a link loop
            for data in _external_files(p) if onnx_inputs else ():
                taken[data] = f"the data file {p} reads its weights from"
    for option, path in outputs.items():
        if path is None or (path == "-" and option in stdout):
            continue
        if not path:  # `--junit "$REPORT"` with REPORT unset wrote no report, and check said nothing
            raise UsageError(f"{option} is empty (an unset variable?); give a file name")
        if path == "-":
            raise UsageError(f"{option} - would write a file named '-' ({option} does not print to stdout); "
                             "give a file name")
        if path.endswith(("/", os.sep)):  # resolve drops the slash: -o out/ wrote a file named out
            raise UsageError(f"{option} {path} names a folder; give a file name")
        if _names_a_descriptor(path):  # renamed over /dev/stdout's file: `> log` lost the table to the report
            also = " (- prints it)" if option in stdout else ""
            raise UsageError(f"{option} {path} names an open file descriptor, not a file (writing it would replace "
                             f"whatever that stream goes to); give a file name{also}")
        try:
            target = Path(path).resolve()
        except RuntimeError:  # Python < 3.13: "Symlink loop from ..."
            raise UsageError(f"{option} {path} is a symbolic link that loops; give a file name") from None
        if not target.parent.is_dir():  # the folder as given: resolved, it named the machine's cwd in CI logs
            folder = os.path.dirname(path) or "."
            if target.parent.exists():  # it was "does not exist" for a folder that is a file
                raise UsageError(f"{option} {path}: {folder} is a file, not a folder; give a path in a folder")
            raise UsageError(f"{option} {path}: folder {folder} does not exist; create it first")
        if target.is_dir():
            raise UsageError(f"{option} {path} is a folder; give a file name")
        if target.exists() and not target.is_file():  # renamed over, as root: /dev/null became the plan
            raise UsageError(f"{option} {path} is not a regular file (a device, pipe or socket); give a file name")
        if target in taken:
            raise UsageError(f"{option} {path} is {taken[target]}; choose another file name")
        _writable_folder(option, path, target.parent)
        taken[target] = f"written by {option} too"
    for option in models:
        path = outputs.get(option)
        data = Path(os.path.realpath(f"{path}.data")) if path else None
        if data is not None and data in taken:
            raise UsageError(f"{option} {path} would write its weights over {data.name}, which is {taken[data]}; "
                             "choose another file name")


def _names_a_descriptor(path: str) -> bool:
    """Whether ``path`` (/dev/stdout, /dev/fd/2, /proc/self/fd/1) goes through a folder of this
    process's file descriptors: its file is whatever stdout or stderr was sent to, and writing
    (temp + rename) would replace that file, or fail in /proc with a puzzling message for a pipe."""
    import re

    hop = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        if re.fullmatch(r"/proc/\d+(/task/\d+)?/fd", os.path.realpath(os.path.dirname(hop))):
            return True
        if not os.path.islink(hop):
            return False
        hop = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
    return False


def _writable_folder(option: str, path: str, folder) -> None:
    """Refuse ``option`` before any work when ``folder`` takes no new file (permissions, a
    read-only or immutable folder), rather than after a long solve."""
    import os
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".memplan-probe-", dir=folder)
    except OSError as err:
        raise UsageError(f"{option} {path}: cannot write in folder {os.path.dirname(path) or '.'} ({err.strerror}); "
                         "choose another folder") from None
    os.close(fd)
    os.unlink(probe)


def _external_files(model: str) -> set:
    """The data files an ONNX model file keeps its weights in (none for anything else)."""
    from pathlib import Path

    from planner.problem import is_remat_json

    # a JSON graph is never read as ONNX: no onnx import (1.4 s of a 1 s solve on RL1000)
    if model.startswith("zoo:") or is_remat_json(model) or not Path(model).is_file():
        return set()
    import onnx

    from passes.onnx_import import load_proto

    try:
        proto, folder, _ = load_proto(model, weights=False)
    except PlannerError:
        return set()  # not a model: the command says so when it reads it
    return {Path(os.path.realpath(folder / e.value))
            for t in onnx.external_data_helper._get_all_tensors(proto)  # noqa: SLF001
            if t.data_location == onnx.TensorProto.EXTERNAL for e in t.external_data if e.key == "location"}


@main.command()
@click.argument("models", nargs=-1, metavar="[MODEL]...")
@click.option("--budget", "budgets", multiple=True, metavar="B",
              help="Memory budget: 8GiB, 512MiB, 1.5GB, or 60% of the unplanned peak (needs a plan). Repeatable.")
@click.option("--train", is_flag=True, help="Check the training step (forward + backward).")
@add_loss_option
@loss_option
@click.option("--device", default=None, help="Device profile the planner prices time on (default H100).")
@dim_option
@click.option("--time-limit", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Seconds per plan (default 30); a budget below the least peak any node order may reach "
              "fails at once, and gets a tenth of it for its 'lowest plan found' figure.")
@click.option("--no-plan", is_flag=True, help="Only 'fits as is' counts; do not try to plan.")
@click.option("--deterministic", is_flag=True, help="Count --time-limit in CP-SAT's deterministic seconds: "
              "the same verdict on any machine and under any load (the wall time then varies).")
@click.option("--ort-arena", "ort_arena", type=click.Choice(["same-as-requested", "next-power-of-two"]),
              default=None, help="Judge the least limit ONNX Runtime's arena (this arena_extend_strategy) runs "
              "the step under, not the liveness peak; plans must fit it too (as memplan plan --ort-arena).")
@click.option("--config", "config", type=click.Path(dir_okay=False),
              help="Config file (pyproject.toml with [tool.memplan], or memplan.toml). Default: found upward.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--junit", type=click.Path(dir_okay=False), help="Write JUnit XML: one testcase per model and budget.")
@click.option("--markdown", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write a Markdown table (for $GITHUB_STEP_SUMMARY); '-' prints it instead of the table.")
@handles_errors
def check(models: tuple[str, ...], budgets: tuple[str, ...], train: bool, add_loss: str | None, loss: str | None,
          device: str | None,
          dims: tuple[str, ...], time_limit: float | None, no_plan: bool, deterministic: bool,
          ort_arena: str | None, config: str | None, as_json: bool,
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
    cli = Overrides(budgets=budgets, train=train, add_loss=add_loss, loss=loss, dims=parse_dims(dims), device=device,
                    time_limit=time_limit,
                    no_plan=no_plan, deterministic=deterministic, ort_arena=ort_arena)
    items, config_path = collect_items(models, cli, config, Path.cwd())
    for item in items:  # read as ONNX, a JSON graph was "not a valid ONNX protobuf" (exit 3)
        _refuse_json_graph(item.model, "check", "gate", label=item.label or item.model)
    if any(item.train for item in items) and not _training_available():
        raise UsageError("--train (train = true) needs autodiff, which this build does not have yet")
    inputs = [item.model for item in items] + ([str(config_path)] if config_path else [])
    _output_paths_ok({"--junit": junit, "--markdown": markdown}, inputs, stdout=("--markdown",))

    matched: set[str] = set()
    dims_of: list[set[str]] = []  # per item, in order: the dims its model has
    read_of: list[list[str]] = []  # per item: its model's name once its inputs were read (none: unread)
    load_errors: dict[int, str] = {}  # item index -> why its model could not be loaded

    def load(item):
        dims_of.append(set())
        read_of.append([])
        try:
            return _load_for_check(item, matched, dims_of[-1], read_of[-1])
        except ModelImportError as err:
            load_errors[len(dims_of) - 1] = str(err)
            raise

    def shared_dims_matched(failed) -> None:
        """A dim given for several models at once (config top level, --dim with several models)
        may miss some of them (a warning); one that matches none is a typo: the gate would check
        every model at its default size and pass. A model that failed to load counts where its
        inputs were read: a typo leaves the dim it meant unbound, that model fails (exit 3), and
        the typo is what to fix (exit 2), also where its input dims are all fixed (no names read).
        One whose inputs were never read may be the dim's model: then
        it stays a bad model, unless every such dim is one edit from a name a model read has
        (bacth, batch): that is a typo whatever the unread model holds, and both are named."""
        loose = sorted({d for item in items for d in item.loose_dims} - matched)
        has = sorted(set().union(*dims_of))
        unread = [item for item, known, read in zip(items, dims_of, read_of) if item in failed and not (known or read)]
        if not loose or (unread and not all(any(_one_edit(d, h) for h in has) for d in loose)):
            return
        word = "dims" if len(loose) > 1 else "dim"
        have = f" (their dims and options: {', '.join(has)})" if has else ""
        # the models that failed to load are not reported after a usage error: say why here, as
        # plan would (an opset-5 Relu's convert_version), not "could not be read either"
        why = [load_errors[k] for k in sorted(load_errors)]
        if len(why) > 1:
            why = [f"({k}) {w}" for k, w in enumerate(why, start=1)]
        also = f"; and {'these models' if len(why) > 1 else 'a model'} failed to load: {' '.join(why)}" if why else ""
        raise UsageError(f"{word} {', '.join(loose)} matched no model's symbolic input dims or zoo options{have}; "
                         f"fix the name, or drop it{also}")

    verdicts = gate.run_checks(items, load, check_plan_fn,
                               progress=lambda line: click.echo(f"memplan: {line}", err=True), arena=check_arena_fn,
                               after_load=shared_dims_matched)
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


def _one_edit(a: str, b: str) -> bool:
    """Whether ``a`` becomes ``b`` by one insertion, deletion, substitution or swap of two
    neighbouring letters (bacth, batch): a typo of ``b``, not a name of its own."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if len(a) == len(b):
        return a[i + 1:] == b[i + 1:] or (a[i + 2:] == b[i + 2:] and a[i:i + 2] == b[i + 1::-1][:2])
    return a[i + 1:] == b[i:] if len(a) > len(b) else a[i:] == b[i + 1:]


# ---- options shared by plan, bench remat and train --budget ------------------------------
#: --seed of plan and bench remat: CP-SAT takes a 32-bit seed (99999999999 ended in a TypeError
#: traceback) and later runs add their count to it; the neighbourhood search's numpy generator
#: takes no negative one.
SEED_OPTION = dict(type=click.IntRange(min=0, max=1 << 30), default=0, show_default=True,
                   help="Random seed of the CP-SAT search (with the same --workers and --deterministic: the same plan).")

#: --budget, --device and --time-limit of plan and of train --budget (which plans the step it runs).
BUDGET_HELP = "Bytes with a unit (8GiB) or a percentage of the unplanned peak (60%)"
DEVICE_OPTION = dict(default="H100", show_default=True, help="ONNX models: device profile for op times and the "
                     "host link (H200, H100, A100, V100, T4, cpu).")


def time_limit_option(first: str = ""):
    """--time-limit of a command that plans; ``first`` leads the parenthesis (plan: what --max-batch does with it)."""
    return click.option("--time-limit", type=FiniteFloat(min=0.1), default=60.0, show_default=True,
                        help=f"Seconds for the whole solve ({first}one that ends without a plan, or below the given "
                             "node order's least memory, may take a quarter more for its last resorts; a plan whose "
                             "rewritten model overshoots the budget is solved again tighter in half the time of the "
                             "solve before, up to twice the limit in all).")


#: --pin-order (memplan plan --emit, memplan rewrite): passes/pin_order.py.
FIXED_ORDER_HELP = ("cpsat: plan in the graph's own node order only. By default a memory-aware order is also "
                    "tried when its unplanned peak is at least 5% lower (else the given order with its weight "
                    "gradients made late), and the cheaper plan is kept.")
DETERMINISTIC_HELP = ("cpsat: count --time-limit in CP-SAT's deterministic seconds instead of wall seconds, so "
                      "the same plan comes back on any machine and under any load (the wall time then varies: "
                      "on large models 10-100x the limit, and more on the largest: 507 s for --time-limit 1 on "
                      "the lstm fixture at batch 8, seq 128; --wall-cap bounds it).")
WALL_CAP_HELP = ("With --deterministic: stop planning once the command has run this many wall seconds, whatever "
                 "the deterministic clock says, and say so (that plan may then differ on another machine). "
                 "Default: no cap.")
ORT_ARENA_HELP = ("ONNX models: the budget is also the memory limit of ONNX Runtime's arena (gpu_mem_limit on CUDA, "
                  "an arena's max_mem on CPU) with this arena_extend_strategy: keep only a plan that the arena's "
                  "replay runs under it with the planned session options, re-solving tighter (the arena wastes 2-75% over a plan's peak on the zoo's models, and up to 3x on models of a few KiB, whose buffers it rounds up to 256 bytes each; --device "
                  "cpu: fed inputs are the caller's arrays, otherwise copied into the arena).")
PIN_ORDER_HELP = ("ONNX models: chain the planned order with ordering edges (about one small node per node), "
                  "hide static shapes from ORT and add an unfed optional input that switches ORT's memory pattern "
                  "off, so the model keeps its plan under ORT's default session options too. The unplanned "
                  "peak is then the pinned model's, edges included.")
#: plan's --pin-order: the budget percentage follows the pinned model's peak
PLAN_PIN_ORDER_HELP = PIN_ORDER_HELP[:-1] + ", and so is a --budget percentage of it."


# ---- train-graph / train (autodiff) ----------------------------------------------------------
def optimizer_options(f, training: bool = False):
    """Flags shared by train-graph and train: optimizer, its hyper-parameters, --freeze, --dim.
    ``training`` (memplan train): an update step is needed, so "none" is not offered."""
    for opt in reversed([
        click.option("--optimizer", type=click.Choice(["sgd", "adam"] if training else ["none", "sgd", "adam"]),
                     default=None, help="The update step (default adam)." if training else
                     "Append an update step (default none: the gradients are the outputs)."),
        click.option("--lr", type=FiniteFloat(), default=None, help="Learning rate (default 0.01 sgd, 0.003 adam)."),
        click.option("--momentum", type=FiniteFloat(), default=None, help="SGD momentum (default 0)."),
        click.option("--beta1", type=FiniteFloat(), default=None, help="Adam beta1 (default 0.9)."),
        click.option("--beta2", type=FiniteFloat(), default=None, help="Adam beta2 (default 0.999)."),
        click.option("--weight-decay", type=FiniteFloat(), default=None, help="L2 weight decay (default 0)."),
        click.option("--freeze", multiple=True, metavar="PATTERN",
                     help="Initializers (glob on the name) that get no gradient; repeatable."),
        click.option("--loss", default=None, help="Loss output (default: the first scalar float output)."),
        add_loss_option,
        dim_option,
    ]):
        f = opt(f)
    return f


def _freeze_patterns_match(forward, patterns) -> None:
    """Each --freeze pattern names some trainable initializer: a typo would train what was meant
    to stay frozen, silently."""
    import fnmatch

    from planner.graph import TensorKind

    trainable = [t.name for t in forward.tensors if t.kind is TensorKind.TRAINABLE]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in trainable):
            shown = ", ".join(trainable[:5]) + (", ..." if len(trainable) > 5 else "")
            raise UsageError(f"--freeze {pattern!r} matches no trainable initializer (they are: {shown or 'none'}); "
                             "fix the pattern (a glob on the initializer's name)")


def _train_options(optimizer, lr, momentum, beta1, beta2, weight_decay, freeze, loss, default_optimizer, **extra):
    from passes.autodiff import TrainOptions

    kind = optimizer or default_optimizer
    if kind == "none" and lr is not None:
        raise UsageError("--lr is the optimizer step's learning rate; add --optimizer sgd or adam (or drop --lr)")
    # a hyper-parameter of another optimizer was dropped without a word: `memplan train --momentum
    # 0.9` ran Adam (the default) with no momentum, `--optimizer sgd --beta1 0.5` plain SGD
    owners = {"--momentum": (momentum, ("sgd",)), "--beta1": (beta1, ("adam",)), "--beta2": (beta2, ("adam",)),
              "--weight-decay": (weight_decay, ("sgd", "adam"))}
    for flag, (value, kinds) in owners.items():
        if value is not None and kind not in kinds:
            raise UsageError(f"{flag} is a hyper-parameter of --optimizer {' or '.join(kinds)}, and this step's "
                             f"optimizer is {kind}{'' if optimizer else ' (the default)'}; "
                             f"add --optimizer {' or '.join(kinds)} (or drop {flag})")
    lr = lr if lr is not None else (0.003 if kind == "adam" else 0.01)
    given = {k: v for k, v in dict(momentum=momentum, beta1=beta1, beta2=beta2, weight_decay=weight_decay).items()
             if v is not None}  # the others keep OptimizerOptions' defaults
    return TrainOptions.from_kwargs(loss=loss, freeze=freeze, optimizer=kind, lr=lr, **given, **extra)


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

    from passes.autodiff import build_training_graph
    from passes.onnx_export import check_model, write_model
    from passes.onnx_import import load_graph

    _output_paths_ok({"-o": output}, [model], models=("-o",))
    _refuse_json_graph(model, "train-graph", "differentiate")
    _refuse_training_step(model, "train-graph")
    options = _train_options(default_optimizer="none", keep_grads=keep_grads, **flags)
    forward = load_graph(model, parse_dims(dims))
    _freeze_patterns_match(forward, options.freeze)
    step = build_training_graph(forward, options)
    write_model(step.graph, output, check=lambda path: check_model(path, full=True),
                metadata={"memplan.train": json_lib.dumps(options.as_kwargs())})
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
@functools.partial(optimizer_options, training=True)
@click.option("--steps", default=100, show_default=True, type=click.IntRange(min=1), help="Optimizer steps.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of the synthetic data and of ORT's random ops (Dropout).")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider.")
@click.option("--budget", "budget_text", default=None,
              help=f"{BUDGET_HELP}: plan the training step (with its optimizer, recompute only) to fit it and "
                   "train with the planned step, run with passes.verify.planned_session_options() (ORT's graph "
                   "optimizations off). On CPU its losses are the unplanned step's, bit for bit under those "
                   "options (recompute is bit-exact there); the unplanned run (no --budget) keeps ORT's default "
                   "optimizations, whose fused kernels may round the last bit otherwise (a fuzzed model: 1 ulp "
                   "at step 3), and random ops (Dropout) may draw other values where the plan reorders them.")
@click.option("--device", "device_name", **DEVICE_OPTION)
@time_limit_option()
@click.option("--deterministic", is_flag=True, help=DETERMINISTIC_HELP)
@click.option("--wall-cap", type=FiniteFloat(min=0, min_open=True), default=None, help=WALL_CAP_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (with every step's loss).")
@handles_errors
def train_cmd(model: str, dims: tuple[str, ...], steps: int, seed: int, provider: str, budget_text: str | None,
              device_name: str, time_limit: float, deterministic: bool, wall_cap: float | None, as_json: bool,
              **flags) -> None:
    """Train MODEL for --steps steps on a synthetic learnable task, running memplan's training step in ORT
    (with --budget: the step planned to fit it)."""
    from passes.autodiff import build_training_graph
    from passes.onnx_import import load_graph
    from passes.training import check_provider, summary, train
    from planner.units import format_bytes, parse_budget

    budget_spec = parse_budget(budget_text) if budget_text is not None else None
    given = click.get_current_context().get_parameter_source
    unused = [flag for flag, name in (("--device", "device_name"), ("--time-limit", "time_limit"),
                                      ("--deterministic", "deterministic"), ("--wall-cap", "wall_cap"))
              if given(name) is not click.core.ParameterSource.DEFAULT]
    if unused and budget_spec is None:
        raise UsageError(f"{unused[0]} applies to planning the step; add --budget B (or drop {unused[0]})")
    wall_deadline = _wall_cap(wall_cap, deterministic)
    options = _train_options(default_optimizer="adam", **flags)
    if options.optimizer.kind == "none":
        raise UsageError("memplan train needs --optimizer sgd or adam")
    _refuse_json_graph(model, "train", "run")
    _refuse_training_step(model, "memplan train")
    check_provider(provider)  # before the step is built and planned, which can take the whole --time-limit
    forward = load_graph(model, parse_dims(dims))
    if options.add_loss:  # the synthetic task reads the loss (its labels input) from the forward graph
        from dataclasses import replace

        from passes.loss import append_loss
        from passes.opset_upgrade import with_upgrades

        # as build_training_graph does, for the forward train() reads too
        _, (forward, loss) = with_upgrades(forward, lambda f: append_loss(f, options.add_loss))
        options = replace(options, add_loss=None, loss=loss)
    _freeze_patterns_match(forward, options.freeze)
    step = build_training_graph(forward, options)
    planned = None
    if budget_spec is not None:
        from planner.cpsat import PlannerOptions

        planner_options = PlannerOptions(time_limit=time_limit, work_limit=deterministic, wall_deadline=wall_deadline)
        # --json: no plan is still the one object --json promises, as plan --json prints a plan that failed
        head = {"model": model, "optimizer": options.optimizer.kind, "lr": options.optimizer.lr, "steps": steps,
                "provider": provider}
        no_plan = (lambda figures: emit_json({**head, "status": figures["status"], "plan": figures})) if as_json else None
        step, planned = _plan_training_step(step, budget_spec, device_name, planner_options, no_plan)
    result = train(step, forward, steps, seed=seed, provider=provider, planned=planned is not None)
    info = {"model": model, "task": result.task, "optimizer": options.optimizer.kind, "lr": options.optimizer.lr,
            "steps": steps, "provider": result.provider, "seconds": result.seconds, **summary(result)}
    if planned is not None:
        info["plan"] = planned
    if as_json:
        emit_json({**info, "losses": list(result.losses)})
        return
    if planned is not None:
        click.echo(f"plan: {planned['status']}, peak {format_bytes(planned['peak_bytes'])} under budget "
                   f"{format_bytes(planned['budget_bytes'])} (unplanned {format_bytes(planned['unplanned_peak_bytes'])}"
                   f"), nodes recomputed: {len(planned['recomputed'])}, predicted added time "
                   f"+{planned['added_time_pct']:.2f}% on {planned['device']}")
    stride = max(1, steps // 10)
    for k in sorted({*range(0, steps, stride), steps - 1}):  # the last step once
        click.echo(f"step {k:5d}  loss {result.losses[k]:.5f}")
    click.echo(f"{model}: {result.task} task, {options.optimizer.kind} lr {options.optimizer.lr:g}, "
               f"loss {info['first_loss']:.4f} -> {info['last_loss']:.4f} "
               f"(mean of first/last tenth {info['first_mean']:.4f} -> {info['last_mean']:.4f}) "
               f"in {result.seconds:.3g} s on {result.provider}")


def _plan_training_step(step, budget_spec, device_name: str, options,
                        no_plan: Callable[[dict], None] | None = None):
    """``train --budget``: ``step`` planned to fit the budget (cpsat, recompute only, as ``memplan plan``
    plans it) -> (the step with the planned graph in its place, the plan's figures for the output). No
    plan is plan's one-line error and exit code, and nothing is trained; ``no_plan`` is first given the
    figures of the solve that failed (status, budget, least_bytes, best_peak_bytes and note as plan.json
    names them; peak_bytes, added_time_pct and recomputed null). Every outcome has the same keys, null
    where they do not apply, as plan.json's (SolveResult.to_json)."""
    from dataclasses import replace

    from passes.plan_model import added_fraction, plan_graph
    from planner.liveness import analyze

    dev, node_time, _ = _device_costs(device_name)
    unplanned = analyze(step.graph).peak_bytes
    budget = budget_spec.resolve(unplanned)
    pm = plan_graph(step.graph, budget, options=options, node_time=node_time, transfer_time=None, time_unit="s")
    res = pm.result
    figures = {"status": res.status, "budget_bytes": budget, "unplanned_peak_bytes": unplanned,
               "peak_bytes": None, "added_time_pct": None, "recomputed": None, "device": dev.name,
               "least_bytes": res.least_bytes, "best_peak_bytes": res.best_bytes, "note": res.note or None}
    if not pm.ok:
        if no_plan is not None:
            no_plan(figures)
        raise _no_plan_error(res, pm.problem.can_swap, budget, unplanned, None)
    # the names, as plan.json's "recomputed" (this was their count, an int under the same key)
    figures.update(peak_bytes=pm.peak_bytes, added_time_pct=100 * added_fraction(pm),
                   recomputed=_recomputed_names(res.plan, pm.problem))
    return replace(step, graph=pm.planned), figures


def _recomputed_names(plan, problem) -> list[str]:
    """plan.json's ``recomputed`` of an ONNX model's plan: the names of the nodes it computes more than once."""
    return [problem.names[i] for i in plan.recomputed(problem.n)]


# ---- plan / rewrite for ONNX models ----------------------------------------------------------
def _device_costs(device_name: str):
    """(profile, node_time(graph, node), transfer_time(bytes)) for a device profile. Whether copies
    overlap compute is not the device's: the planning functions' default, COPIES_OVERLAP_COMPUTE
    (ONNX Runtime runs the written model's copies on the compute stream)."""
    from planner.costs import op_time
    from planner.devices import device, transfer_time
    from planner.graph import DTYPE_BITS

    dev = device(device_name)

    def node_time(graph, node):
        shape = lambda t: None if t < 0 else graph.tensors[t].shape  # noqa: E731
        first = next((t for t in node.outputs if t >= 0), -1)
        dtype = graph.tensors[first].dtype if first >= 0 else "float32"
        width = max(1, DTYPE_BITS[dtype] // 8) if first >= 0 else 4
        return op_time(node.op_type, [shape(t) for t in node.inputs], [shape(t) for t in node.outputs],
                       node.attrs, dev, width, dtype)

    return dev, node_time, (lambda nbytes: transfer_time(nbytes, dev))


def _graph_costs(graph, device_name: str, costs: str, swap: bool = False):
    """``_device_costs`` with op times from ``--costs``: the device profile, a measurement on this
    machine, or an ORT profile file (passes/measured_costs.py); and a line saying which. With
    ``swap``, op times measured on the CPU are refused: the copies are priced at the device's host
    link, and against a CPU's op times (an H100's are ~100x shorter) every swap looks free."""
    import os

    dev, estimate, transfer = _device_costs(device_name)
    if costs not in ("device", "measured") and not os.path.exists(costs):
        raise UsageError(f"--costs {costs}: not 'device', 'measured' or an existing ORT profile JSON file")
    if costs == "device":
        return dev, estimate, transfer, f"device profile {dev.name}"
    from passes import measured_costs

    found = measured_costs.measure(graph) if costs == "measured" else measured_costs.read_profile(graph, costs)
    if swap and found.source.endswith("on CPUExecutionProvider"):
        # a profile the user made on the CPU is the same mismatch (zoo:gpt?batch=8 at 45%: 23 nodes
        # swapped, added time 0 s)
        timed = ("--costs measured timed the ops on this machine's CPU" if costs == "measured" else
                 f"--costs {costs} timed the ops on the CPU (CPUExecutionProvider)")
        redo = "measure" if costs == "measured" else "profile the step"
        raise UsageError(f"{timed}, and --swap prices the copies at --device {dev.name}'s host link: the two do not "
                         f"mix (swaps would look nearly free); {redo} where onnxruntime-gpu runs, or use --costs device")
    source = f"{found.source} ({found.timed} of {found.total} nodes timed)"
    return dev, found.node_time(graph, estimate), transfer, source


def _refuse_json_graph(model: str, command: str, what: str, label: str | None = None) -> None:
    """A Checkmate/Moccasin JSON graph is a planning problem (node costs and sizes), not a model:
    only ``memplan plan`` reads it. Every other command that takes MODEL says so in one line
    (exit 2) where it was read as ONNX, "not a valid ONNX protobuf" (exit 3, a bad model)."""
    from planner.problem import is_remat_json

    _refuse_memplan_output(model, label)
    if is_remat_json(model):
        raise UsageError(f"{label or model} is a Checkmate/Moccasin JSON graph, which memplan {command} does not "
                         f"{what} (it takes an .onnx file or zoo:NAME); use memplan plan GRAPH --budget B "
                         "(its --json also gives unplanned_peak_bytes)")


def _refuse_memplan_output(model: str, label: str | None = None,
                           fix: str = "give the .onnx file, zoo:NAME or JSON graph it was made from") -> None:
    """A JSON file memplan wrote (a plan from ``plan -o``, a ``--json`` report) given as MODEL was
    called "a Checkmate/Moccasin JSON graph" (exit 2), by plan "not a Checkmate/Moccasin node-link
    graph (missing or bad field 'nodes')" (exit 3): neither says which file goes there."""
    from pathlib import Path

    from planner.plan import SCHEMA
    from planner.problem import is_remat_json

    if not is_remat_json(model) or not Path(model).is_file():
        return
    try:
        schema = json.loads(Path(model).read_text()).get("schema")
    except (OSError, ValueError, AttributeError):  # not JSON, or not an object: the caller says so
        return
    if isinstance(schema, str) and schema.startswith("memplan."):
        apply = "; memplan rewrite MODEL PLAN.json -o OUT.onnx applies a plan" if schema == SCHEMA else ""
        raise UsageError(f"{label or model} is memplan's own {schema} output, not a model; {fix}{apply}")


def _metadata(model: str) -> dict[str, str]:
    """MODEL's metadata entries (its header only: the graph is not read)."""
    from passes.onnx_import import load_header

    return {p.key: p.value for p in load_header(model).metadata_props}


def _step_writer(model: str) -> str | None:
    """Which memplan command wrote MODEL as a training step (its metadata says so), or None:
    train-graph, or plan --emit / rewrite for a planned step. A planned step read as a forward
    model was differentiated again, its optimizer's constants trained (zoo:gpt?layers=1 --optimizer
    adam --emit, then train-graph: 21 trainable initializers where the model has 16; plan: a
    371304-byte peak where the file holds 387040)."""
    meta = _metadata(model)
    planned = "memplan plan --emit or rewrite"
    if "memplan.train" in meta:
        return planned if "memplan.plan" in meta else "memplan train-graph"
    try:  # planned files written before they carried memplan.train: their plan names the training
        return planned if isinstance(json.loads(meta.get("memplan.plan", "null")).get("train"), dict) else None
    except (ValueError, AttributeError):
        return None


def _training_metadata(model: str, train: dict | None) -> dict[str, str]:
    """The memplan.train entry for a planned file of a training step (a step memplan built with the
    ``train`` options, or MODEL itself when it is one): the file is then known as a training step."""
    if train is not None:
        return {"memplan.train": json.dumps(train, sort_keys=True)}
    meta = _metadata(model)
    return {"memplan.train": meta["memplan.train"]} if "memplan.train" in meta else {}


def _folds(model: str) -> bool:
    """Whether MODEL is imported with its constant subgraphs folded: not a training step memplan
    wrote, which runs under the planned session options (ORT_DISABLE_ALL), its ordering edges'
    Size nodes and its gradients' ConstantOfShape zeros made and freed as it runs. Folded, those
    zeros joined the constant base: a planned step (fuzzed, --ops multi seed 303) that runs at 2916
    bytes was planned again as 'infeasible: the least memory any plan reaches is at least 3692'."""
    return _step_writer(model) is None


def _refuse_training_step(model: str, command: str) -> None:
    """train-graph and train differentiate a forward model: a step they wrote would be differentiated
    again (its loss's ancestors, with every float constant there trained: zoo:gpt's Adam step got
    gradients for its causal mask and GELU constants)."""
    writer = _step_writer(model)
    if writer is not None:
        raise UsageError(f"{model} is already a training step ({writer} wrote it); give {command} "
                         "the forward model it was made from")


def _graph_to_plan(model: str, dims: dict, forward: bool, optimizer: str = "none", lr: float = 0.01,
                   add_loss: str | None = None, loss: str | None = None):
    """MODEL -> (graph to plan, the training options used or None)."""
    from passes.onnx_import import import_model

    for flag, given in (("--add-loss", add_loss), ("--loss", loss)):
        if given and forward:
            raise UsageError(f"{flag} builds a training step; --forward plans the model as it is: "
                             "give only one of them")
    writer = _step_writer(model)
    already = writer is not None
    for flag, given in (("--add-loss", add_loss), ("--loss", loss)):
        if given and already:
            raise UsageError(f"{model} is already a training step ({writer} wrote it); drop {flag}")
    graph = import_model(model, dims, loose_dims=(), fold=not already)
    if forward or already:
        return as_run(graph), None
    # only a --loss given is recorded: plans made before it keep their digest
    train = {"optimizer": optimizer, "lr": lr, **({"add_loss": add_loss} if add_loss else {}),
             **({"loss": loss} if loss else {})}
    return training_graph(graph, **train), train


# ---- plan + bench remat (planner helper) ---------------------------------------------------
def _load_planning_problem(model: str, swap_bandwidth: float | None, swap_overlap: bool):
    """MODEL -> PlanningProblem. JSON graphs here; ONNX models come with the importer."""
    from planner.problem import load_remat_json

    try:
        problem = load_remat_json(model)  # the link options were checked where the command started
    except ModelImportError:
        _refuse_memplan_output(model)
        raise
    if swap_bandwidth is not None:
        problem = problem.with_swap(problem.size / swap_bandwidth, copy_overlap=swap_overlap)
    return problem


def _check_swap_bandwidth(swap_bandwidth: float | None, swap_overlap: bool) -> None:
    if swap_bandwidth is not None and not swap_bandwidth > 0:
        raise UsageError(f"--swap-bandwidth must be > 0 bytes per cost unit, got {swap_bandwidth}")
    if not swap_overlap and swap_bandwidth is None:  # it did nothing, without a word
        raise UsageError("--no-swap-overlap applies to swaps over --swap-bandwidth BW (JSON graphs); add "
                         "--swap-bandwidth, or drop --no-swap-overlap (an ONNX model's swaps never overlap compute: "
                         "ONNX Runtime runs the copies on the compute stream)")


def _resolve_budget(text: str, problem) -> int:
    from planner.units import parse_budget

    b = parse_budget(text)
    return b.bytes if b.bytes is not None else problem.budget_for(b.fraction)


@main.command()
@click.argument("model")
@click.option("--budget", "budget_text", default=None, help=f"{BUDGET_HELP}; required unless --sweep.")
@click.option("--strategy", type=click.Choice(["cpsat", "greedy", "chen", "none"]), default="cpsat", show_default=True,
              help="cpsat: the CP-SAT model, hinted with the baselines; greedy, chen (sqrt(n) checkpoints) or none "
                   "(no remat): a baseline alone.")
@click.option("--device", "device_name", **DEVICE_OPTION)
@click.option("--swap/--no-swap", default=False, show_default=True,
              help="ONNX models: also allow swapping to host memory, each copy priced in line with compute as "
                   "ONNX Runtime runs it (the swap model solves slower; opt in).")
@click.option("--costs", default="device", show_default=True, metavar="device|measured|PROFILE.json",
              callback=lambda ctx, param, v: v.lower() if v.lower() in ("device", "measured") else v,
              help="ONNX models: op times from the --device profile; measured by profiling the training step in "
                   "ONNX Runtime on this machine (timings vary, so plans may); or an ORT profile JSON of the model "
                   "`memplan train-graph` writes (the same file gives the same plan).")
@dim_option
@click.option("--forward", is_flag=True, help="ONNX models: plan the graph as it is (no training step); node outputs "
              "nobody reads are released once made (optional ones left out, others given a 1-element reader).")
@click.option("--optimizer", type=click.Choice(["none", "sgd", "adam"]), default="none", show_default=True,
              help="ONNX models: optimizer step added to the training graph.")
@click.option("--lr", type=FiniteFloat(), default=None, help="Learning rate of --optimizer (default 0.01 sgd, 0.003 adam, "
              "as train-graph).")
@add_loss_option
@loss_option
@time_limit_option("with --max-batch: for each batch tried; ")
@click.option("--seed", **SEED_OPTION)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="CP-SAT search workers.")
@click.option("--max-computations", type=click.IntRange(min=1), default=3, show_default=True, help="Computations allowed per node.")
@click.option("--fixed-order", is_flag=True, help=FIXED_ORDER_HELP)
@click.option("--deterministic", is_flag=True, help=DETERMINISTIC_HELP)
@click.option("--wall-cap", type=FiniteFloat(min=0, min_open=True), default=None, help=WALL_CAP_HELP)
@click.option("--swap-bandwidth", type=FiniteFloat(), default=None, help="JSON graphs: host link in bytes per cost unit; enables swap.")
@click.option("--swap-overlap/--no-swap-overlap", default=True, show_default=True, help="JSON graphs, with --swap-bandwidth: transfers overlap compute.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the plan JSON here.")
@click.option("--emit", type=click.Path(dir_okay=False), default=None, help="ONNX models: write the planned model here.")
@click.option("--pin-order", is_flag=True, help=PLAN_PIN_ORDER_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@click.option("--explain", is_flag=True, help="Say per tensor what was decided and why.")
@click.option("--arena", is_flag=True, help="ONNX models: place every buffer at a fixed offset in one arena and "
              "check the budget against the arena height.")
@click.option("--ort-arena", "ort_arena", type=click.Choice(["next-power-of-two", "same-as-requested"]), default=None,
              help=ORT_ARENA_HELP)
@click.option("--max-batch", is_flag=True, help="ONNX models: find the largest batch that fits an absolute --budget "
              "(e.g. 8GiB), unplanned and planned. Each batch it tries is its own solve with its own --time-limit "
              "(about 2 log2(batch) solves in all), so the search can take many times the limit. With --emit / -o: "
              "the largest planned batch's model and plan, as its probe planned it (no new solve), the model "
              "bound at that batch.")
@click.option("--sweep", "sweep_png", type=click.Path(dir_okay=False), default=None,
              help="Write a plot (PNG, SVG or PDF by the file's extension; none: PNG) of budget (100%..40%) vs added "
                   "time for cpsat, greedy and chen, each point what --budget P% --strategy S reports (with --json: "
                   "the rows); takes no --budget or --strategy.")
@click.option("--batch-dim", default="batch", show_default=True, help="With --max-batch: the symbolic dim (or zoo option) to grow.")
@click.option("--max-added-time", "max_added_pct", type=FiniteFloat(min=0), default=None,
              help="With --max-batch: count a plan only if it adds at most this % of compute time.")
@handles_errors
def plan(model, budget_text, strategy, device_name, swap, costs, dims, forward, optimizer, lr, add_loss, loss, time_limit, seed,
         workers, max_computations, fixed_order, deterministic, wall_cap, swap_bandwidth, swap_overlap, output, emit, pin_order, as_json, explain, arena, ort_arena,
         max_batch, batch_dim, sweep_png, max_added_pct) -> None:
    """Choose keep / recompute / swap for every tensor so the peak fits --budget.

    MODEL is an ONNX model (planned as a training step unless --forward or it already is one),
    zoo:NAME, or a Checkmate/Moccasin JSON graph. Exit 1 when no plan reaches the budget (proven),
    4 when no plan was found and none was ruled out: the solver ran out of --time-limit, or node
    orders it cannot search went unsearched (the message says which).
    """
    from planner.cpsat import PlannerOptions
    from planner.explain import explain as explain_plan, explain_table
    from planner.problem import is_remat_json
    from planner.units import format_bytes, format_gap, parse_budget

    if budget_text is None and not sweep_png:
        raise UsageError("missing --budget B: bytes with a unit (8GiB) or a percentage of the unplanned peak (60%)")
    budget_spec = parse_budget(budget_text) if budget_text is not None else None
    if lr is not None and optimizer == "none":
        raise UsageError("--lr is the optimizer step's learning rate; add --optimizer sgd or adam (or drop --lr)")
    lr = lr if lr is not None else (0.003 if optimizer == "adam" else 0.01)  # train-graph's defaults
    train = {"optimizer": optimizer, "lr": lr, "add_loss": add_loss, "loss": loss}  # ONNX models: how the step is built
    for flag, given in (("--add-loss", add_loss), ("--loss", loss)):
        if given and is_remat_json(model):
            raise UsageError(f"{flag} applies to ONNX models; a JSON graph is a training graph already")
    onnx_only = {"--dim": bool(dims), "--forward": forward, "--optimizer": optimizer != "none", "--arena": arena,
                 "--pin-order": pin_order, "--swap": swap, "--device": device_name != "H100"}
    given = [flag for flag, on in onnx_only.items() if on]
    if given and is_remat_json(model):
        raise UsageError(f"{given[0]} applies to ONNX models; a JSON graph is a training graph with its own node "
                         "costs (swap with --swap-bandwidth BW)")
    if swap_bandwidth is not None and not is_remat_json(model):
        raise UsageError("--swap-bandwidth applies to JSON graphs; an ONNX model swaps over its --device's host link "
                         "with --swap")
    _check_swap_bandwidth(swap_bandwidth, swap_overlap)
    options = PlannerOptions(time_limit=time_limit, seed=seed, workers=workers, max_computations=max_computations,
                             reorder=not fixed_order, work_limit=deterministic,
                             wall_deadline=_wall_cap(wall_cap, deterministic))
    profile = [costs] if costs not in ("device", "measured") else []  # an ORT profile is read too
    _output_paths_ok({"-o": output, "--emit": emit, "--sweep": sweep_png}, [model, *profile], models=("--emit",))
    if sweep_png:  # its format, from the name, before any work
        from planner.report import plot_format

        plot_format("--sweep", sweep_png)
    if costs != "device" and is_remat_json(model):
        raise UsageError("--costs applies to ONNX models; a JSON graph carries its own node costs")
    if ort_arena and (is_remat_json(model) or sweep_png):
        raise UsageError("--ort-arena applies to ONNX models planned at one budget (or with --max-batch); "
                         "JSON graphs have no runtime arena, and --sweep does not check it")
    if swap and device_name.lower() == "cpu":
        raise UsageError("--swap moves tensors to host memory, which with --device cpu is the memory they are in: "
                         "drop --swap, or plan for a GPU (--device H200, H100, A100, V100 or T4)")
    if swap and strategy in ("greedy", "chen"):
        raise UsageError(f"--strategy {strategy} recomputes only; --swap applies to --strategy cpsat")
    for mode, on, off, writes in (
            ("--sweep", sweep_png, {"-o": output, "--emit": emit, "--max-batch": max_batch}, "writes no plan or model"),
            # -o and --emit write the largest planned batch's plan and model; these change how it is planned
            ("--max-batch", max_batch, {}, "plans each batch without it")):
        common = {"--pin-order": pin_order, "--arena": arena, "--explain": explain}
        unused = [flag for flag, value in {**off, **common}.items() if value] if on else []
        if unused:
            raise UsageError(f"{unused[0]} applies to one plan; {mode} {writes} (plan one batch "
                             "with --dim batch=N, or one budget, to use it)")
    if sweep_png:
        # --sweep runs every strategy at 100%..40% of the unplanned peak: these would do nothing
        explicit = click.get_current_context().get_parameter_source("strategy") is not \
            click.core.ParameterSource.DEFAULT
        ignored = [flag for flag, on in (("--budget", budget_text is not None), ("--strategy", explicit)) if on]
        if ignored:
            raise UsageError(f"{ignored[0]} applies to one plan; --sweep plans cpsat, greedy and chen at 100%..40% "
                             f"of the unplanned peak (drop {ignored[0]}, or drop --sweep to plan one budget)")
    if not max_batch:
        lone = [flag for flag, given in (("--max-added-time", max_added_pct is not None),
                                         ("--batch-dim", batch_dim != "batch")) if given]
        if lone:
            raise UsageError(f"{lone[0]} applies to --max-batch; add --max-batch (or drop {lone[0]})")
    if costs != "device" and max_batch:
        raise UsageError("--max-batch plans a new graph per batch and needs a device profile; drop --costs "
                         "(or plan one batch with --dim batch=N --costs ...)")
    if deterministic and costs == "measured":
        # the solve repeats, its op times do not (zoo:cnn at 70%, three runs: added 12.94%, 9.42%, 13.00%)
        log.warning("--costs measured times the ops afresh each run, so this --deterministic plan (and its digest) "
                    "can differ from run to run; profile the step once and pass --costs PROFILE.json to repeat it")
    if sweep_png:
        return _sweep(model, sweep_png, options, device_name, swap, parse_dims(dims), forward, train,
                      swap_bandwidth, swap_overlap, as_json, costs)
    if max_batch:
        return _max_batch(model, budget_spec, strategy, options, device_name, swap, parse_dims(dims), forward,
                          train, batch_dim, as_json, max_added_pct, ort_arena, emit, output)
    if is_remat_json(model):
        if emit:
            raise UsageError("--emit writes ONNX models; MODEL is a JSON graph (use -o for the plan)")
        from planner.planning import plan_strategy, solve

        problem = _load_planning_problem(model, swap_bandwidth, swap_overlap)
        budget = budget_spec.bytes if budget_spec.bytes is not None else problem.budget_for(budget_spec.fraction)
        # a baseline at a budget the graph fits as it is returns it unplanned, as for ONNX models
        result = solve(problem, budget, plan_strategy(problem, budget, strategy), options)
        obj = result.to_json(problem)
        planned = None
    else:
        problem, result, obj, planned, budget = _plan_onnx(model, budget_spec, strategy, options, device_name, swap,
                                                            parse_dims(dims), forward, train, arena, pin_order,
                                                            costs, ort_arena)
    if explain and result.plan is not None:
        obj["explain"] = explain_plan(problem, result.plan, result.budget_bytes)
    obj["plan_digest"] = plan_digest(obj)  # memplan rewrite refuses an edited plan
    if as_json:
        emit_json(obj)
    if result.plan is None:
        swap_flag = "--swap-bandwidth BW" if is_remat_json(model) else "--swap"
        raise _no_plan_error(result, problem.can_swap, budget, obj.get("unplanned_peak_bytes"), swap_flag)
    _write_plan_files(emit, output, planned, obj)
    if not as_json:
        unit = f" {problem.time_unit}" if problem.time_unit else ""
        click.echo(f"{obj['model']}: {result.strategy} {result.status}")
        click.echo(f"  budget        {format_bytes(budget)} ({budget} B)")
        click.echo(f"  peak          {format_bytes(obj['peak_bytes'])} (unplanned {format_bytes(obj['unplanned_peak_bytes'])})")
        click.echo(f"  added time    {result.added_time:.4g}{unit} ({obj['added_time_pct']:.2f}% of {problem.total_cost:.4g}{unit})")
        if "costs" in obj:
            click.echo(f"  op times      {obj['costs']}")
        added_loss = (obj.get("train") or {}).get("add_loss")
        if added_loss:
            click.echo(f"  loss          added: {added_loss} (the step's only output)")
        gap = result.solver.gap
        # both counts in planning nodes, as --explain lists them (the JSON's "swapped" of an ONNX
        # model names tensors: a node's outputs move together; zoo:cnn --swap at 66%: 11 nodes, 13 tensors)
        counts = result.plan.counts(problem.n)
        n_swapped = int(sum(1 for c in counts["swap_in"] if c > 0))
        tensors = f" ({len(obj['swapped'])} tensors)" if len(obj["swapped"]) != n_swapped else ""
        click.echo(f"  solver        {result.solver.wall_s:.2f} s, gap {format_gap(gap)}"
                   f", nodes: {len(obj['recomputed'])} recomputed, {n_swapped} swapped{tensors}")
        if result.note:
            click.echo(f"  note          {result.note}")
        if obj.get("ort_arena", {}).get("need_bytes") is not None:
            a = obj["ort_arena"]
            click.echo(f"  ORT arena     runs under a limit of {format_bytes(a['need_bytes'])} "
                       f"({a['extend_strategy']}; the budget is its limit)"
                       + (f"; its first node primes the arena with {format_bytes(a['primed_bytes'])}"
                          if a.get("primed_bytes") else ""))
        if "arena" in obj:
            a = obj["arena"]
            click.echo(f"  arena         {format_bytes(a['height_bytes'])} ({a['height_bytes'] / max(1, a['lower_bound_bytes']):.4f}"
                       f" x lower bound, {a['status']}); with constants {format_bytes(a['total_bytes'])}")
        if emit:
            runs = "ORT's default session options keep its order" if pin_order else \
                "run it with passes.verify.planned_session_options()"
            click.echo(f"  wrote         {emit} ({runs})")
        if explain:
            click.echo(explain_table(obj["explain"]))


def _no_plan_error(result, can_swap: bool, budget: int, unplanned: int | None, swap_flag: str | None) -> PlannerError:
    """The one-line error (and so the exit code) of a solve that gave no plan, as ``memplan plan``
    says it; ``swap_flag``: the flag that allows swapping, suggested where it is off (None: no such flag)."""
    from planner.planning import TIMED_OUT
    from planner.units import format_bytes

    if result.status == "timeout":
        also = "" if can_swap or swap_flag is None else f", or allow swapping to host memory ({swap_flag})"
        note = _share_of_unplanned(result.note, result.best_bytes, unplanned)
        longer = "a longer --time-limit or " if note.startswith(TIMED_OUT) else ""
        return SolverTimeoutError(f"{note}; try {longer}a larger --budget{also}")
    if result.status == "infeasible" and result.least_bytes is not None:
        return _infeasible_error(result, budget, unplanned)
    hint = "; try --strategy cpsat" if result.strategy != "cpsat" else ""
    return BudgetInfeasibleError(f"{result.note}; budget {budget} ({format_bytes(budget)}){hint}")


def _write_plan_files(emit: str | None, output: str | None, planned, obj: dict) -> None:
    """Write the planned model (--emit; ``planned`` as ``_plan_object`` returns it) and the plan
    (-o), each atomically; when the second write fails the first goes too (no half of the outputs)."""
    from planner.fileio import atomic_write, indented_json

    if emit and planned is not None:  # the model first: the larger write, the likelier to fail
        from passes.onnx_export import write_model

        write_model(planned[0], emit, **planned[1])
    if output:
        try:
            atomic_write(output, indented_json(obj) + "\n")
        except BaseException:  # no half of the outputs: the model just written goes too
            if emit and planned is not None:
                for written in (emit, f"{emit}.data"):
                    if os.path.isfile(written):
                        os.unlink(written)
            raise


def _max_batch(model, budget_spec, strategy, options, device_name, swap, dims, forward, train, batch_dim,
               as_json, max_added_pct=None, ort_arena=None, emit=None, output=None) -> None:
    """--max-batch: bisect the batch, unplanned vs planned, under an absolute budget. --emit and -o
    write the plan the largest planned batch's probe found (not a new solve: a wall-clock solve of
    that batch again may differ, or fail), as plan --emit / -o of that batch write theirs."""
    from dataclasses import replace

    import models
    from passes.plan_model import MAX_BATCH_LIMIT, added_fraction, max_batch, plan_graph
    from planner.problem import is_remat_json
    from planner.units import format_bytes

    if is_remat_json(model):
        raise UsageError("--max-batch needs an ONNX model or zoo:NAME (JSON graphs have no batch dim)")
    if budget_spec.bytes is None:
        raise UsageError("--max-batch needs an absolute --budget (e.g. 8GiB), not a percentage")
    budget = budget_spec.bytes
    _, node_time, transfer = _device_costs(device_name)
    if batch_dim in dims:  # every probe sets it: --dim batch=4 was dropped without a word
        raise UsageError(f"--dim {batch_dim}={dims[batch_dim]}: --max-batch grows {batch_dim!r} itself; drop it "
                         f"(or plan that one batch without --max-batch)")
    if model.startswith("zoo:"):
        name, opts = models.parse_spec(model)
        if batch_dim in opts:
            raise UsageError(f"{model}: --max-batch grows {batch_dim!r} itself; drop {batch_dim}={opts[batch_dim]} "
                             f"from the spec (or plan that one batch without --max-batch)")
        if batch_dim not in models.ZOO[name].option_names:
            raise UsageError(f"--batch-dim {batch_dim!r}: zoo:{name} has no such option (options: "
                             f"{', '.join(models.ZOO[name].option_names)}); name the one to grow with --batch-dim")
        # hw=1 would fail at once (cnn's hw comes in steps of 2**depth): only legal values are tried
        step = models.ZOO[name].growth_step(batch_dim, opts)

        def spec_at(b: int) -> tuple[str, dict]:
            return models.format_spec(name, {**opts, batch_dim: b}), dims
    else:
        from passes.onnx_import import input_shapes_text, load_proto, symbolic_input_dims

        proto, _, _ = load_proto(model, weights=False)  # the inputs only: every probe loads the model
        if batch_dim not in symbolic_input_dims(proto):
            raise UsageError(
                f"--max-batch grows the symbolic input dim {batch_dim!r}, which {model} does not have (inputs: "
                f"{input_shapes_text(proto)}); name another with --batch-dim, or export the model with a dynamic "
                "batch axis")
        step = 1

        def spec_at(b: int) -> tuple[str, dict]:
            return model, {**dims, batch_dim: b}

    if train.get("add_loss") and not forward and _step_writer(spec_at(2 * step)[0]) is None:
        # the output named once, where a batch dim shows: at batch 1 an output [batch, 1] is one element,
        # taken for the loss the model already has, and the first probe refused the search (exit 2)
        from passes.loss import loss_output
        from passes.onnx_import import import_model

        spec, d = spec_at(2 * step)
        train = {**train, "add_loss": loss_output(import_model(spec, d, loose_dims=()), train["add_loss"])}
    made_with = {}  # the training options the probes' graphs were built with, as plan's JSON says them

    def build(b: int):
        spec, d = spec_at(b)
        graph, made_with["train"] = _graph_to_plan(spec, d, forward, **train)
        return graph

    bfc = _ort_arena(ort_arena, device_name)

    # a batch that does not fit only has to say so: no search for its lowest plan
    probe_options = replace(options, least_share=0.0)

    planned_from = {}  # id(plan) -> (plan, the graph it planned as imported) of each probe with a plan

    def plan_at(graph, limit, how=strategy):
        pm = plan_graph(graph, limit, strategy=how, options=probe_options, node_time=node_time,
                        transfer_time=transfer if swap else None, time_unit="s", ort_arena=bfc)
        if pm.ok and (emit or output):  # the winner's is written: its graph, as plan's, is fingerprinted
            planned_from[id(pm)] = (pm, graph)
        return pm

    cap = None if max_added_pct is None else max_added_pct / 100
    result = max_batch(build, budget, plan_at, max_added=cap, ort_arena=bfc, step=step)
    pm = result.planned_result
    written = None
    if (emit or output) and result.planned:
        written = _write_max_batch(result, planned_from, spec_at, build, plan_at, made_with, budget, device_name,
                                   batch_dim, options, bfc, emit, output)
    added = None if pm is None else added_fraction(pm)
    obj = {"schema": "memplan.max_batch/1", "model": model, "status": _max_batch_status(result),
           "budget_bytes": budget, "batch_dim": batch_dim,
           "device": device_name, "strategy": strategy, "swap": swap, "dims": dims,
           "train": made_with.get("train"), "time_limit_s_per_batch": options.time_limit,
           "deterministic": options.work_limit, "max_added_time_fraction": cap,
           "unplanned_batch": result.unplanned, "planned_batch": result.planned, "ratio": result.ratio,
           "planned_added_time_fraction": added, "planned_peak_bytes": None if pm is None else pm.peak_bytes,
           "probes": [{"batch": b, "kind": k, "fits": f,
                       **({"why": result.misses[b]} if k == "planned" and not f and b in result.misses else {})}
                      for b, k, f in result.probes]}
    capped = [kind for kind, b in (("unplanned", result.unplanned), ("planned", result.planned))
              if b and b + step > MAX_BATCH_LIMIT]
    above = result.misses.get(result.planned + step)
    if above == "timeout":  # the bisection's "no" next to the answer was not a proof
        obj["note"] = (f"{batch_dim} {result.planned + step} found no plan within --time-limit (not proven infeasible); "
                       "a longer --time-limit may fit it")
    if above == "wall cap":  # nor when the command's --wall-cap stopped that solve
        obj["note"] = (f"{batch_dim} {result.planned + step} found no plan before --wall-cap stopped its solve (not proven "
                       "infeasible); a larger --wall-cap may fit it")
    if above == "added time (not proven)":  # nor a plan over the cap not proven the cheapest
        obj["note"] = (f"{batch_dim} {result.planned + step}'s plan adds more time than --max-added-time but was not "
                       "proven the cheapest (a cheaper one may be under the cap); "
                       + ("a longer --time-limit" if strategy == "cpsat" else "--strategy cpsat") + " may find it")
    if capped:  # the search stops there: the batch fits, the largest is not known
        obj["note"] = (f"the search stops at {batch_dim} {MAX_BATCH_LIMIT // step * step}, which fits {' and '.join(capped)}: "
                       f"a larger {batch_dim} may fit too")
    if written is not None:
        obj["emitted"] = written
    if as_json:
        emit_json(obj)
        return _some_batch_fits(result, model, budget, batch_dim)
    click.echo(f"{model} under {format_bytes(budget)}:")
    # the dim grown (--batch-dim seq: 'largest seq'), the columns aligned as for batch
    width = max(len("largest batch unplanned "), len(f"largest {batch_dim} unplanned "))
    click.echo(f"  {f'largest {batch_dim} unplanned':{width}} {result.unplanned}")
    # the plan's added time and peak whether or not batch 1 fits unplanned (no ratio then)
    ratio = f"{result.ratio:.2f}x, " if result.ratio else ""
    click.echo(f"  {f'largest {batch_dim} planned':{width}} {result.planned}"
               + (f"  ({ratio}+{100 * added:.1f}% time, peak {format_bytes(pm.peak_bytes)})"
                  if pm is not None else ""))
    if "note" in obj:
        click.echo(f"  {'note':{width}} {obj['note']}")
    if written is not None:
        import shlex

        at = [written["model"], *(f"--dim {k}={v}" for k, v in written["dims"].items())]
        if written["path"]:
            click.echo(f"  {'wrote':{width}} {written['path']} (the planned model at {batch_dim} {written['batch']}; "
                       f"check it: memplan verify {shlex.join([at[0], written['path']])}"
                       f"{''.join(' ' + d for d in at[1:])})")
        if written["plan"]:
            click.echo(f"  {'wrote':{width}} {written['plan']} (the plan at {batch_dim} {written['batch']}; "
                       f"memplan rewrite {shlex.join([at[0], written['plan']])}{''.join(' ' + d for d in at[1:])} "
                       "-o OUT.onnx applies it)")
    _some_batch_fits(result, model, budget, batch_dim)


def _write_max_batch(result, planned_from, spec_at, build, plan_at, made_with, budget, device_name, batch_dim,
                     options, bfc, emit, output) -> dict:
    """--max-batch --emit / -o: write the plan of the largest planned batch as plan --emit / -o of that
    batch write theirs (its model bound at that batch), and say what was written (``emitted``).
    Where the largest batch fits as it is, its probe's plan keeps every tensor, as plan --emit at a
    budget the model fits writes it (the model in planned order, no recompute or swap); where that
    probe kept no plan (its plan was over --max-added-time), the batch is planned with --strategy
    none, which is that plan."""
    from planner.liveness import analyze

    b = result.planned
    spec, dims = spec_at(b)
    pm = result.planned_result
    if pm is not None and id(pm) in planned_from:  # the entry holds pm: no other plan has its id
        graph = planned_from[id(pm)][1]
    else:
        graph = build(b)
        pm = plan_at(graph, budget, how="none")
        if not pm.ok:
            raise BudgetInfeasibleError(f"{spec}: fits {budget} bytes as it is, but no plan of it came back to write "
                                        f"({pm.result.note or pm.result.status}); plan it without --max-batch")
    dev = _device_costs(device_name)[0]  # as plan names it (H100, not h100)
    obj, planned = _plan_object(spec, graph, pm, dims, made_with.get("train"), dev.name,
                                f"device profile {dev.name}", budget, analyze(graph).peak_bytes, options, bfc=bfc)
    obj["plan_digest"] = plan_digest(obj)
    _write_plan_files(emit, output, planned, obj)
    return {"path": emit, "plan": output, "batch": b, "model": spec, "dims": dims, "plan_digest": obj["plan_digest"]}


def _max_batch_status(result) -> str:
    """--max-batch --json's ``status``, in plan's words and with its exit code: "feasible" where some
    batch fits (planned or not, exit 0), else "timeout" where the first batch's solve ran out of time
    (exit 4) and "infeasible" otherwise (exit 1), as ``_some_batch_fits`` decides."""
    if result.planned or result.unplanned:
        return "feasible"
    return "timeout" if result.misses.get(result.step) in ("timeout", "wall cap") else "infeasible"


def _some_batch_fits(result, model: str, budget: int, dim: str = "batch") -> None:
    """--max-batch fails (exit 1) when not even the first batch (1, or the option's step) fits, planned or not."""
    from planner.units import format_bytes

    if not result.planned and not result.unplanned:
        if result.misses.get(result.step) in ("timeout", "wall cap"):  # not a proof: the solve ran out of time
            flag = "--time-limit" if result.misses[result.step] == "timeout" else "--wall-cap"
            raise SolverTimeoutError(f"{model}: {dim} {result.step} found no plan under {format_bytes(budget)} within "
                                     f"{flag} (not proven infeasible); try a longer {flag} or a larger --budget")
        if result.misses.get(result.step) == "added time (not proven)":  # a cheaper plan may be under the cap
            raise BudgetInfeasibleError(f"{model}: {dim} {result.step} fits {format_bytes(budget)} with a plan that adds "
                                        "more time than --max-added-time allows, not proven the cheapest (a cheaper one "
                                        "may be under the cap); try a longer --time-limit (or --strategy cpsat), a "
                                        "larger --max-added-time or --budget")
        if result.misses.get(result.step) == "added time":  # it fits, only dearer than the cap allows
            raise BudgetInfeasibleError(f"{model}: {dim} {result.step} fits {format_bytes(budget)} only with a plan that adds "
                                        "more time than --max-added-time allows; try a larger --max-added-time or "
                                        "--budget")
        raise BudgetInfeasibleError(f"{model}: not even {dim} {result.step} fits {format_bytes(budget)}, planned or not; "
                                    "try a larger --budget")


def _sweep(model, png, options, device_name, swap, dims, forward, train, swap_bandwidth, swap_overlap,
           as_json, costs="device") -> None:
    """--sweep: every strategy at 100%..40% of the unplanned peak; a plot and a table. Each row is
    what ``plan --budget P% --strategy S`` with the same options reports: for an ONNX model
    passes.plan_model.sweep_graph (the budget a share of the model's own unplanned peak, the peak
    the rewritten model's), for a JSON graph planner.sweep.sweep."""
    from planner.fileio import atomic_write
    from planner.problem import is_remat_json
    from planner.report import plot_format
    from planner.sweep import sweep, sweep_plot

    fractions = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    strategies = ["cpsat", "greedy", "chen"]
    if is_remat_json(model):
        rows = sweep(_load_planning_problem(model, swap_bandwidth, swap_overlap), fractions, strategies, options)
    else:
        from passes.plan_model import sweep_graph

        graph, _ = _graph_to_plan(model, dims, forward, **train)
        _, node_time, transfer, _ = _graph_costs(graph, device_name, costs, swap)
        rows = sweep_graph(graph, fractions, strategies, options, node_time=node_time,
                           transfer_time=transfer if swap else None, time_unit="s")
    atomic_write(png, sweep_plot(rows, f"{model}: budget vs added time", plot_format("--sweep", png)))
    if as_json:
        emit_json({"schema": "memplan.sweep/1", "model": model, "rows": rows})
        return
    click.echo(f"{'strategy':8s} {'budget':>6s} {'status':>12s} {'added %':>8s} {'solve s':>7s}")
    for r in rows:
        added = "-" if r["added_time_pct"] is None else f"{r['added_time_pct']:.2f}"
        click.echo(f"{r['strategy']:8s} {100 * r['budget_fraction']:5.0f}% {r['status']:>12s} {added:>8s} "
                   f"{r['solve_s']:7.2f}")
    click.echo(f"wrote {png}")


def _ort_arena(choice: str | None, device_name: str):
    """--ort-arena CHOICE on --device DEVICE -> passes.plan_model.OrtArena (None without the flag)."""
    from passes.plan_model import OrtArena
    from planner.arena import NEXT_POWER_OF_TWO, SAME_AS_REQUESTED

    if choice is None:
        return None
    return OrtArena(NEXT_POWER_OF_TWO if choice == "next-power-of-two" else SAME_AS_REQUESTED,
                    device_name.lower() != "cpu")


def _arena_report(graph, budget: int, options) -> dict:
    """Offsets for every dynamic buffer of ``graph``'s run; the budget checked against the arena.
    With --deterministic the placement's search counts its limit on the work clock too (its
    nodes and CP-SAT's deterministic seconds): on the wall clock a loaded machine's placement
    went over the budget where an idle one's fit (the gpt2 fixture at 80%, stop 51's audit)."""
    import contextlib

    from planner import clock
    from planner.alloc import liveness_buffers, solve
    from planner.liveness import analyze

    lv = analyze(graph)
    counted = clock.work_clock(options.wall_deadline) if options.work_limit else contextlib.nullcontext()
    with counted:
        res = solve(liveness_buffers(lv), time_limit=min(options.time_limit, 30.0))
    if res.height is None:
        raise SolverTimeoutError("no arena placement found in time; try a longer --time-limit")
    total = lv.base_bytes + res.height
    if total > budget:
        raise BudgetInfeasibleError(
            f"the arena needs {res.height} bytes (+ {lv.base_bytes} constant = {total}), over the budget {budget}; "
            "plan for a lower budget or raise it")
    return {"height_bytes": res.height, "lower_bound_bytes": res.lower_bound, "gap": res.gap,
            "status": res.status.value, "total_bytes": total, "seconds": round(res.wall_s, 3)}


def _plan_onnx(model, budget_spec, strategy, options, device_name, swap, dims, forward, train_flags, arena=False,
               pin=False, costs="device", ort_arena=None):
    """ONNX MODEL -> (problem, result, plan.json object, (planned Graph, write_model options) or None,
    budget bytes)."""
    from passes.plan_model import lower_graph, pinned_unplanned_peak, plan_graph
    from planner.liveness import analyze

    graph, train = _graph_to_plan(model, dims, forward, **train_flags)
    dev, node_time, transfer, cost_source = _graph_costs(graph, device_name, costs, swap)
    unplanned = analyze(graph).peak_bytes
    lowered = pinned = None
    if pin:
        # the unplanned peak is the pinned file's: its ordering edges hold a few bytes that no plan
        # removes, so 100% of the unpinned peak was refused as over budget (the lstm fixture --forward)
        lowered = lower_graph(graph, node_time=node_time, transfer_time=transfer if swap else None, time_unit="s")
        pinned = pinned_unplanned_peak(graph, lowered)
        unplanned = max(unplanned, pinned)
    budget = budget_spec.resolve(unplanned)
    bfc = _ort_arena(ort_arena, dev.name)
    pm = plan_graph(graph, budget, strategy=strategy, options=options, node_time=node_time,
                    transfer_time=transfer if swap else None, time_unit="s", pin=pin,
                    ort_arena=bfc, lowered=lowered, pinned_peak=pinned)
    obj, planned = _plan_object(model, graph, pm, dims, train, dev.name, cost_source, budget, unplanned, options,
                                arena=arena, pin=pin, bfc=bfc)
    return pm.problem, pm.result, obj, planned, budget


def _plan_object(model, graph, pm, dims, train, device_name, cost_source, budget, unplanned, options, arena=False,
                 pin=False, bfc=None):
    """A plan of ``graph`` (MODEL with ``dims`` as imported, before the planner inlines functions) ->
    (plan.json object, (planned Graph, write_model options) or None): what plan -o and --emit write,
    for one budget or for the batch --max-batch found."""
    from passes.plan_model import added_fraction, fingerprint

    result, problem = pm.result, pm.problem
    obj = result.to_json(problem)
    made = {"source": model, "dims": dims, "train": train, "device": device_name, "costs": cost_source,
            "budget_bytes": budget, "model_fingerprint": fingerprint(graph)}
    obj.update(model=model, unplanned_peak_bytes=unplanned, peak_bytes=pm.peak_bytes,
               problem_peak_bytes=result.peak_bytes, **{k: v for k, v in made.items() if k != "source"})
    obj["budget_bytes"] = budget
    if result.plan is not None:
        obj["recomputed"] = _recomputed_names(result.plan, problem)
        # the tensors the schedule moves out (a planner node's outputs move together: layer0.ln1
        # with its __mean and __inv_std), as the emitted model's copies and verify name and count them
        obj["swapped"] = list(dict.fromkeys(e["tensor"] for e in pm.events if e["op"] == "swap_out"))
        obj["schedule"] = list(pm.events)
    if arena and pm.planned is not None:
        obj["arena"] = _arena_report(pm.planned, budget, options)
    if pin:  # rewrite pins as --emit did (only when set: the digests of other plans stay as they were)
        obj["pin_order"] = True
    if bfc is not None:
        obj["ort_arena"] = {"extend_strategy": bfc.label, "inputs_in_arena": bfc.device_inputs,
                            "limit_bytes": budget, "need_bytes": pm.arena_need, "primed_bytes": pm.primed_bytes}
    planned = None
    if pm.planned is not None:
        made.update(peak_bytes=pm.peak_bytes, added_time_fraction=added_fraction(pm), pin_order=pin)
        planned = (pm.planned, {"metadata": {"memplan.plan": json.dumps(made, sort_keys=True),
                                             **_training_metadata(model, train)},
                                "value_info": not pin, "mem_pattern": not pin,
                                "overridable": _overridable(model, train)})
    return obj, planned


@main.command()
@click.argument("model")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Write the planned model here.")
@click.option("--pin-order/--no-pin-order", "pin", default=None,
              help=PIN_ORDER_HELP + " Default: as the plan was made (plan --pin-order).")
@handles_errors
def rewrite(model: str, plan_path: str, output: str, pin: bool | None) -> None:
    """Apply a saved plan (from memplan plan -o) to MODEL and write the planned ONNX model."""
    from passes.onnx_export import write_model
    from passes.plan_model import fingerprint
    from passes.pin_order import pin_order
    from passes.rewrite import PlanMismatchError, apply_schedule, prime_arena
    from planner.liveness import analyze
    from planner.units import format_bytes

    if plan_path.startswith("zoo:") or plan_path.endswith(".onnx"):
        raise UsageError(f"PLAN.json {plan_path!r} is not a plan file: the arguments are MODEL PLAN.json -o OUT.onnx")
    _refuse_json_graph(model, "rewrite", "rewrite (its plan, from memplan plan -o, is the result)")
    _output_paths_ok({"-o": output}, [model, plan_path], models=("-o",))
    try:
        with open(plan_path) as fh:
            obj = json.load(fh)
    except FileNotFoundError:
        raise UsageError(f"{plan_path}: no such file") from None
    except (OSError, ValueError) as err:
        raise UsageError(f"{plan_path}: not a plan JSON file ({err})") from None
    if not isinstance(obj, dict) or obj.get("schema") != "memplan.plan/1" or "model_fingerprint" not in obj:
        raise UsageError(f"{plan_path}: not a memplan.plan/1 plan of an ONNX model; write one with memplan plan -o")
    digest = obj.get("plan_digest")
    # the legacy digest only where the current one differs: each hashes the whole schedule (0.5 s
    # apiece on a plan of 733k events)
    if digest is not None and digest != plan_digest(obj) and digest != plan_digest(obj, legacy=True):
        raise UsageError(f"{plan_path} was changed after memplan plan wrote it (its plan_digest no longer matches "
                         "its fields); make a new plan with memplan plan -o")
    bad = _plan_field_error(obj)
    if bad:
        raise UsageError(f"{plan_path}: {bad}; make a new plan with memplan plan -o")
    train = obj.get("train")
    graph, _ = _graph_to_plan(model, obj.get("dims") or {}, train is None, **(train or {}))
    if fingerprint(graph) != obj["model_fingerprint"]:
        raise UsageError(f"{plan_path} was made for another model than {model!r} (or the model changed); "
                         "make a new plan with memplan plan")
    try:
        planned = apply_schedule(graph, obj.get("schedule") or [])
    except PlanMismatchError as err:
        raise UsageError(f"{plan_path}: {err}; make a new plan with memplan plan -o") from None
    primed = (obj.get("ort_arena") or {}).get("primed_bytes") or 0
    if primed:  # as plan --emit wrote it: the arena primer first (passes.rewrite.prime_arena)
        planned = prime_arena(planned, primed)
    peak = analyze(planned).peak_bytes
    budget = obj.get("budget_bytes")
    if isinstance(budget, int) and peak > budget:
        raise UsageError(f"{plan_path}: its schedule peaks at {peak} bytes, over its budget_bytes {budget}; "
                         "make a new plan with memplan plan -o")
    if pin is None:  # as plan --emit wrote it
        pin = obj.get("pin_order") is True
    if pin:
        planned = pin_order(planned)
        peak = analyze(planned).peak_bytes
    made = {k: obj.get(k) for k in ("dims", "train", "device", "costs", "budget_bytes", "model_fingerprint")}
    if obj.get("compute_time"):
        made["added_time_fraction"] = obj["added_time"] / obj["compute_time"]
    made.update(source=model, peak_bytes=peak, pin_order=pin)
    write_model(planned, output, metadata={"memplan.plan": json.dumps(made, sort_keys=True),
                                           **_training_metadata(model, train)}, value_info=not pin,
                mem_pattern=not pin, overridable=_overridable(model, train))
    click.echo(f"wrote {output}: {len(planned.nodes)} nodes, predicted peak {format_bytes(peak)}")


def _overridable(model: str, train) -> tuple[str, ...]:
    """The initializers of MODEL that are graph inputs too, for a planned model of the graph as it is
    (``train`` None: --forward or a training step already); a training step memplan builds has the
    forward model's inputs without them."""
    from passes.onnx_import import overridable_initializers

    return overridable_initializers(model) if train is None else ()


def _plan_field_error(obj: dict) -> str | None:
    """What in a plan object rewrite cannot use, in words (None: nothing). A plan without a digest
    (written before digests, or edited and the digest dropped) is read field by field: a field of
    the wrong type was a TypeError/AttributeError traceback (a list for ``train``, a string for
    ``schedule``), and a ``budget_bytes`` that is no integer skipped the replay against the budget."""
    status, schedule = obj.get("status"), obj.get("schedule")
    if status not in ("optimal", "feasible") or schedule is None:
        return (f"it holds no plan (status {status!r}: memplan plan found none within its budget), "
                "so there is nothing to apply")
    train, dims, arena = obj.get("train"), obj.get("dims"), obj.get("ort_arena")
    checks = (
        ("schedule", isinstance(schedule, list) and all(isinstance(e, dict) for e in schedule), "a list of events"),
        ("train", _train_field_ok(train, lambda t: _is_number(t.get("lr", 0))), TRAIN_FIELD),
        ("dims", dims is None or (isinstance(dims, dict) and all(_is_integer(v) for v in dims.values())),
         "an object of NAME: integer"),
        ("budget_bytes", _is_integer(obj.get("budget_bytes")), "an integer"),
        ("compute_time", _is_number(obj.get("compute_time")), "a number"),
        ("added_time", _is_number(obj.get("added_time")), "a number"),
        ("ort_arena", arena is None or (isinstance(arena, dict) and (arena.get("primed_bytes") is None
                                                                      or _is_integer(arena.get("primed_bytes")))),
         "an object whose primed_bytes is an integer"),
        # a bool: 0/1 passed the `in (None, True, False)` check (1 == True) and 1 wrote an unpinned model
        ("pin_order", obj.get("pin_order") is None or isinstance(obj["pin_order"], bool), "true or false"),
    )
    for field, ok, what in checks:
        if not ok:
            return f"its {field} is not {what}"
    return None


#: --plot of the bench commands (inspect --plot's formats).
PLOT_OPTION = dict(type=click.Path(dir_okay=False), default=None,
                   help="Write a plot: PNG, SVG or PDF by the file's extension (none: PNG).")


def _bench_group() -> click.Group:
    """The shared ``bench`` group (other benchmarks add their own subcommands to it)."""
    grp = main.commands.get("bench")
    if grp is None:
        @main.group("bench")
        def grp() -> None:
            """Solver and allocator benchmark tables."""
    return grp


@_bench_group().command("remat")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Folder of the remat JSON graphs (default: ../shared/benchmarks/remat beside the checkout).")
@click.option("--graph", "graphs", multiple=True, help="Graph label (VGG16, ResNet50, RL100, ...); repeatable. Default: all.")
@click.option("--budgets", default="90,80,70,60,50,40", show_default=True, help="Comma-separated percentages of the no-remat peak (90,80 or 90%,80%).")
@click.option("--strategies", default="cpsat,greedy,chen", show_default=True,
              help="Comma-separated, of cpsat, greedy, chen, none.")
@click.option("--time-limit", type=FiniteFloat(min=0.1), default=60.0, show_default=True,
              help="CP-SAT seconds per solve for graphs up to 400 nodes (doubled above).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="CP-SAT search workers.")
@click.option("--seed", **SEED_OPTION)
@click.option("--fixed-order", is_flag=True, help=FIXED_ORDER_HELP)
@click.option("--deterministic", is_flag=True, help=DETERMINISTIC_HELP)
@click.option("--swap-bandwidth", type=FiniteFloat(), default=None,
              help="Host link in bytes per cost unit: buffers may also be swapped out and back (off by default).")
@click.option("--swap-overlap/--no-swap-overlap", default=True, show_default=True,
              help="With --swap-bandwidth: transfers overlap compute.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the rows as JSON.")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False), default=None, help="Write the table as Markdown.")
@click.option("--plot", **PLOT_OPTION)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
@handles_errors
def bench_remat(directory, graphs, budgets, strategies, time_limit, workers, seed, fixed_order, deterministic,
                swap_bandwidth, swap_overlap, output, md_path, plot, as_json) -> None:
    """keep/recompute (with --swap-bandwidth also swap) strategies on the Checkmate/Moccasin train graphs at a
    sweep of budgets."""
    from planner import remat_bench
    from planner.cpsat import PlannerOptions
    from planner.planning import STRATEGIES

    _check_swap_bandwidth(swap_bandwidth, swap_overlap)
    folder = _bench_folder(directory, "remat", "remat benchmark graphs")
    _output_paths_ok({"-o": output, "--markdown": md_path, "--plot": plot},
                     [str(p) for p in sorted(folder.glob("*.json"))])
    plot_fmt = _plot_format("--plot", plot)
    fractions = _bench_budgets(budgets)
    strats = [s.strip() for s in strategies.split(",") if s.strip()]
    bad = [s for s in strats if s not in STRATEGIES]
    if bad or not strats:
        raise UsageError(f"--strategies {strategies!r}: unknown {bad}; use any of {', '.join(STRATEGIES)}")
    try:
        found = remat_bench.find_graphs(folder, graphs or None)
    except KeyError as err:
        raise UsageError(f"--graph {err.args[0]!r} is not one of {', '.join(remat_bench.TRAIN_GRAPHS)}") from None
    if not found:
        raise UsageError(f"no remat train graphs found in {folder}")
    options = PlannerOptions(time_limit=time_limit, workers=workers, seed=seed, reorder=not fixed_order,
                             work_limit=deterministic)
    rows = remat_bench.run(found, fractions, strats, options,
                           load=lambda path: _load_planning_problem(str(path), swap_bandwidth, swap_overlap))
    obj = {"schema": "memplan.bench.remat/1", "workers": workers, "seed": seed, "time_limit_s": time_limit,
           "deterministic": deterministic, "fixed_order": fixed_order, "swap_bandwidth": swap_bandwidth,
           "swap_overlap": swap_overlap if swap_bandwidth is not None else None, "rows": rows}
    _bench_report(obj, as_json, lambda: remat_bench.table(rows), [
        (output, lambda: json.dumps(obj, indent=2) + "\n"), (md_path, lambda: remat_bench.markdown(rows)),
        (plot, lambda: remat_bench.plot(rows, plot_fmt))])


def _bench_report(obj: dict, as_json: bool, text: Callable[[], str],
                  files: list[tuple[str | None, Callable[[], str | bytes]]]) -> None:
    """A bench command's results: each (path, contents) file that was asked for, written atomically,
    then the rows as one JSON object (--json) or the table on stdout."""
    from planner.fileio import atomic_write

    for path, contents in files:
        if path:
            atomic_write(path, contents())
    if as_json:
        emit_json(obj)
    else:
        click.echo(text())


def _bench_folder(directory: str | None, suite: str, what: str):
    """The folder a bench command reads: --dir, or ../shared/benchmarks/SUITE beside the checkout."""
    from pathlib import Path

    folder = Path(directory) if directory else Path(__file__).resolve().parent.parent / "shared" / "benchmarks" / suite
    if not folder.is_dir() and directory:
        raise UsageError(f"--dir {str(folder)!r} is not a folder; point it at shared/benchmarks/{suite}")
    if not folder.is_dir():
        # The default lies beside a checkout; an installed memplan (pip install, a wheel) has none beside it.
        raise UsageError(f"no {what} at {str(folder)!r} (shared/benchmarks/{suite} beside the "
                         "checkout; an installed memplan has no checkout there): give their folder with --dir FOLDER")
    return folder


def _bench_budgets(budgets: str) -> list[float]:
    """--budgets of the bench commands: comma-separated percentages of the unplanned peak, as fractions."""
    from planner.units import percent_fraction

    try:
        # "90%" as plan's --budget writes a percentage, or a bare 90
        fractions = [percent_fraction(x.strip().removesuffix("%")) for x in budgets.split(",") if x.strip()]
    except (ValueError, OverflowError):
        raise UsageError(f"--budgets {budgets!r} must be comma-separated percentages, e.g. 90,50") from None
    if not fractions or any(not 0 < f <= 10 for f in fractions):
        raise UsageError(f"--budgets {budgets!r} must be percentages in (0, 1000]")
    return list(dict.fromkeys(fractions))  # a budget given twice is one row (as --only given twice)


def _plot_format(option: str, path: str | None) -> str | None:
    """--plot's image format (by the file's extension), checked before any work; None without it."""
    from planner.report import plot_format

    return plot_format(option, path) if path else None


@_bench_group().command("alloc")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Folder of the MiniMalloc CSV instances (default: ../shared/benchmarks/minimalloc/challenging "
                   "beside the checkout).")
@click.option("--instance", "instances", multiple=True, help="Instance name (A, B, ..., K); repeatable. Default: all.")
@click.option("--time-limit", type=FiniteFloat(min=0), default=60.0, show_default=True,
              help="Seconds of search per instance.")
@click.option("--no-minimize", is_flag=True, help="Skip C's minimization (its least height, beside its fit).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the rows as JSON.")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False), default=None, help="Write the table as Markdown.")
@click.option("--plot", **PLOT_OPTION)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
@handles_errors
def bench_alloc(directory, instances, time_limit, no_minimize, output, md_path, plot, as_json) -> None:
    """The static allocator (memplan alloc) on MiniMalloc's challenging suite: each instance at the capacity
    in its file name, validated; exit 1 where a placement fails validation or none is found."""
    import time

    from planner import alloc_bench

    folder = _bench_folder(directory, "minimalloc/challenging", "MiniMalloc instances")
    _output_paths_ok({"-o": output, "--markdown": md_path, "--plot": plot},
                     [str(p) for p in sorted(folder.glob("*.csv"))], onnx_inputs=False)
    plot_fmt = _plot_format("--plot", plot)
    try:
        files = alloc_bench.find_instances(folder, instances)
    except KeyError as err:
        name = err.args[0]
        # R.csv or R.1MiB.csv is there, but not as NAME.CAPACITY.csv: say so, not that R is missing
        named = sorted(p.name for p in folder.glob("*.csv") if p.name.split(".")[0] == name)
        if named:
            raise UsageError(f"--instance {name!r}: {folder / named[0]} has no capacity in its name; bench alloc "
                             "reads NAME.CAPACITY.csv, the capacity in bytes (A.1048576.csv)") from None
        names = ", ".join(p.name.split(".")[0] for p in alloc_bench.find_instances(folder)) or "none"
        raise UsageError(f"--instance {name!r} is not in {folder} (it holds: {names})") from None
    if not files:
        raise UsageError(f"no MiniMalloc instances (NAME.CAPACITY.csv) found in {folder}")
    t0 = time.perf_counter()
    rows = alloc_bench.run(files, time_limit, minimize=not no_minimize)
    total = time.perf_counter() - t0
    obj = {"schema": "memplan.bench.alloc/1", "time_limit_s": time_limit, "total_seconds": round(total, 2),
           "rows": rows}
    _bench_report(obj, as_json, lambda: alloc_bench.table(rows), [
        (output, lambda: json.dumps(obj, indent=2) + "\n"), (md_path, lambda: alloc_bench.markdown(rows, total)),
        (plot, lambda: alloc_bench.plot(rows, plot_fmt))])
    if not all(r["validated"] for r in rows):
        # an instance the search found no placement for (its capacity under the lower bound, or the
        # limit reached first) has none to validate: said as such, not as a placement that failed
        unplaced = [f"{r['instance']} within {r['capacity']} bytes ({r['status']}; lower bound {r['lower_bound']})"
                    for r in rows if r["height"] is None]
        bad = [r["instance"] for r in rows if r["height"] is not None and not r["validated"]]
        said = ([f"no placement of {', '.join(unplaced)}"] if unplaced else []) + (
            [f"the placement of {', '.join(bad)} failed validation"] if bad else [])
        click.echo(f"memplan: error: {'; '.join(said)}", err=True)
        sys.exit(EXIT_FAILED)


@_bench_group().command("zoo")
@click.option("--only", "names", multiple=True, help="Zoo model (mlp, cnn, resnet, unet, gpt); repeatable. Default: all, "
              "each at its own small default size.")
@click.option("--budgets", default="80,60,50", show_default=True, help="Comma-separated percentages of the unplanned training peak (80,60 or 80%,60%).")
@click.option("--strategy", type=click.Choice(["cpsat", "greedy", "chen"]), default="cpsat", show_default=True,
              help="How each plan is made.")
@click.option("--time-limit", type=FiniteFloat(min=0.1), default=20.0, show_default=True, help="CP-SAT seconds per plan.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="CP-SAT search workers.")
@click.option("--seed", **SEED_OPTION)
@click.option("--deterministic", is_flag=True, help=DETERMINISTIC_HELP)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the rows as JSON.")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False), default=None, help="Write the table as Markdown.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
@handles_errors
def bench_zoo(names, budgets, strategy, time_limit, workers, seed, deterministic, output, md_path, as_json) -> None:
    """Plan each zoo model's training step at a sweep of budgets, emit it and verify it in CPU ORT against the
    unplanned step (outputs equal, measured peak over predicted); exit 1 where a verified plan's outputs differ."""
    import models
    from passes.autodiff import training_graph
    from passes.onnx_export import export_model
    from passes.onnx_import import import_model
    from passes.zoo_bench import SMALL, cells, markdown, table, verify_row
    from planner.cpsat import PlannerOptions
    from planner.remat_bench import _percent

    bad = [n for n in names if n not in models.ZOO]
    if bad:
        raise UsageError(f"--only {bad[0]!r} is not a zoo model; use any of {', '.join(SMALL)}")
    _output_paths_ok({"-o": output, "--markdown": md_path}, [])
    pcts = [_percent(f) for f in _bench_budgets(budgets)]
    _, node_time, _ = _device_costs("cpu")  # verified on CPU ORT: the prediction is CPU's
    options = PlannerOptions(time_limit=time_limit, workers=workers, seed=seed, work_limit=deterministic)
    rows = []
    for name in dict.fromkeys(names or SMALL):
        graph = training_graph(import_model(f"zoo:{name}", {}))
        ref = export_model(graph)
        feeds = models.example_feeds(ref, seed=0)
        for pct in pcts:
            rows.append(verify_row(name, graph, ref, feeds, pct, strategy, node_time, options))
            log.warning("zoo:%s %g%%: %s", name, pct, " ".join(cells(rows[-1])[2:]))
    obj = {"schema": "memplan.bench.zoo/1", "strategy": strategy, "workers": workers, "seed": seed,
           "time_limit_s": time_limit, "deterministic": deterministic, "rows": rows}
    _bench_report(obj, as_json, lambda: table(rows), [
        (output, lambda: json.dumps(obj, indent=2) + "\n"), (md_path, lambda: markdown(rows))])
    differ = [f"zoo:{r['model']} at {r['budget_pct']:g}%" for r in rows if r.get("equal") is False]
    if differ:
        click.echo(f"memplan: error: the planned step's outputs differ from the unplanned one's: {', '.join(differ)}",
                   err=True)
        sys.exit(EXIT_FAILED)


# ---- memplan alloc: static arena offsets (planner/alloc.py) ------------------------------------
@main.command("alloc")
@click.argument("problem", type=click.Path(dir_okay=False))
@click.option("--capacity", help="Arena size (bytes or 1MiB style): every offset + size must fit.")
@click.option("--minimize", is_flag=True, help="Least arena height (within --capacity if given). "
              "The default when --capacity is not given.")
@click.option("--time-limit", type=FiniteFloat(min=0), default=10.0, show_default=True,
              help="Seconds for the search (the first greedy order runs in any case); the best valid "
              "placement found is returned.")
@click.option("--deterministic", is_flag=True,
              help="Count --time-limit in search nodes and CP-SAT's deterministic seconds instead of wall "
              "seconds, so a search the limit cuts short returns the same offsets on any machine and under "
              "any load (the wall time then varies: challenging D at --time-limit 4 took 47 s on a loaded "
              "2-core machine; --wall-cap bounds it).")
@click.option("--wall-cap", type=FiniteFloat(min=0, min_open=True), default=None, help=WALL_CAP_HELP)
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the solution CSV (the problem's columns plus offset).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@handles_errors
def alloc_command(problem: str, capacity: str | None, minimize: bool, time_limit: float, deterministic: bool,
                  wall_cap: float | None, output: str | None, as_json: bool) -> None:
    """Fixed offsets in one arena for buffers in MiniMalloc's CSV (id,lower,upper,size[,alignment])."""
    import contextlib

    from planner import clock
    from planner.alloc import AllocStatus, solve
    from planner.alloc_io import read_csv, write_solution
    from planner.units import format_bytes, parse_bytes

    _output_paths_ok({"-o": output}, [problem], onnx_inputs=False)
    deadline = _wall_cap(wall_cap, deterministic)
    cap = parse_bytes(capacity, "--capacity") if capacity else None
    buffers, given = read_csv(problem)
    if given is not None:
        # MiniMalloc keeps an offset column's offsets fixed; solve would have moved them silently
        raise ModelImportError(f"{problem}: has an offset column, and alloc does not keep given offsets "
                               "(it places every buffer); remove the column")
    # on the wall clock a limit that cut the search short gave another placement under load
    # (challenging D, --time-limit 4: height 1075200 alone, 1105920 with two more runs beside it)
    with clock.work_clock(deadline) if deterministic else contextlib.nullcontext():
        result = solve(buffers, capacity=cap, minimize=minimize, time_limit=time_limit)
        if clock.capped():
            log.warning("--wall-cap stopped the search: this placement may differ on another machine")
            result.stats["wall_capped"] = True
    result.stats["deterministic"] = deterministic
    lb = result.lower_bound
    if as_json and result.status in (AllocStatus.INFEASIBLE, AllocStatus.TIMEOUT):
        # the one JSON object --json promises, as plan --json prints an infeasible plan's; the
        # error line follows on stderr
        emit_json({**result.to_json(), "solution": None, "offsets": None})
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
    ]
    if result.proven_bound > lb:  # the exact search ruled out heights above the lower bound
        rows.append(("proven bound", f"{result.proven_bound} (no lower height fits; gap {result.gap:.2%})"))
    rows += [
        ("time", f"{result.wall_s:.2f} s ({result.method})"),
    ]
    if result.status is AllocStatus.FEASIBLE:  # the table said "feasible" and not why it stopped there
        if cap is not None and not minimize:
            rows.append(("note", "fits --capacity; add --minimize for the least height"))
        elif result.stats.get("too_large_blocks"):
            rows.append(("note", "a lower height is not ruled out: the exact search skips problems this large"))
        else:
            rows.append(("note", f"a lower height is not ruled out in --time-limit {time_limit:g} s; raise it "
                                 "to search longer"))
    if output:
        rows.append(("solution", output))
    for key, value in rows:
        click.echo(f"{key:<12} {value}")


if __name__ == "__main__":  # pragma: no cover
    main()
