"""``splitfl`` command line: run, compare, sweep, report, list, validate, privacy.

Bad input (config values, missing data files) prints one line ``error: <field>: <allowed>`` and
exits with code 2 before any run directory is written (so does a run or sweep directory that
another process holds, a damaged checkpoint or one of another config, and any OS error — a
full disk, a read-only or missing folder, a name too long — printed as ``error: <path>:
<reason>``); a diverged run (NaN/inf or exploding loss)
exits with code 3; a sweep in which some trial did not finish exits with code 1 (the others
still ran); Ctrl-C or SIGTERM exits with code 130 after recording where the run stopped.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from splitfl.cli.network import add_network_parsers
from splitfl.config import ConfigError
from splitfl.core.atomic import describe_os_error
from splitfl.data.base import DatasetError, DatasetWarning
from splitfl.executors import NonFiniteLossError, WorkersLostError
from splitfl.experiment import compare, resume, run, validate
from splitfl.experiment.model_card import cards_markdown
from splitfl.extensions import add_import_flag
from splitfl.listing import catalog
from splitfl.metrics.background import wait_plots
from splitfl.metrics.report import report
from splitfl.metrics.summary import comparison_table
from splitfl.models.crossing import RawInputWarning
from splitfl.privacy.cli import add_privacy_parser
from splitfl.sweeps import sweep

#: ok
EXIT_OK = 0
#: sweep: some trials failed or diverged (the others ran)
EXIT_TRIALS_FAILED = 1
#: bad input: config value, data file, damaged checkpoint or one of another config, a
#: run/sweep directory held by another process (``pid`` named) or holding a different sweep, a
#: Ray address that is malformed or does not answer, a sweep trial larger than the Ray
#: cluster, ``executor: parallel`` workers lost more than ``parallel.max_retries`` times
#: (checkpoint kept; ``--resume`` continues); an OS error (``error: <path>: <reason>``: disk
#: full, read-only, name too long, ...)
EXIT_BAD_INPUT = 2
#: diverged: NaN/inf loss or exploding loss; ``summary.json`` status ``diverged at round k:
#: ...``
EXIT_DIVERGED = 3
#: interrupted (Ctrl-C or SIGTERM); ``summary.json`` status ``interrupted at round k``; the
#: checkpoint holds every finished round (an interrupt in the middle of a round checkpoints
#: the rounds before it, whatever ``checkpoint_every``); ``splitfl run --resume DIR``
#: continues exactly
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention


def _split_args(values: list[str]) -> tuple[str | None, list[str]]:
    """First positional that is not ``key=value`` is the config path; the rest are overrides."""
    config = None
    overrides = []
    for v in values:
        if "=" in v or config is not None:
            overrides.append(v)
        else:
            config = v
    return config, overrides


def cmd_run(args: argparse.Namespace) -> int:
    config, overrides = _split_args(args.args)
    progress = False if args.no_progress else None
    if args.resume:
        if config or any(not o.startswith("rounds=") for o in overrides):
            raise ConfigError(
                "--resume", "takes the run directory and at most rounds=N (its config is reused)"
            )
        result = resume(
            args.resume,
            progress=progress,
            overrides=overrides,
            imports=args.imports,
            address=args.address,
        )
    else:
        if config is None:
            raise ConfigError("CONFIG", "give a config file (e.g. configs/quickstart.yaml)")
        run_dir = Path(args.out) if args.out else None
        result = run(
            config,
            overrides,
            run_dir=run_dir,
            progress=progress,
            imports=args.imports,
            address=args.address,
        )
    print(comparison_table({result.config.algorithm: result.summary}))
    print(f"run directory: {result.run_dir}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    config, overrides = _split_args(args.args)
    if config is None:
        raise ConfigError("CONFIG", "give a config file (e.g. configs/quickstart.yaml)")
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    result = compare(
        config,
        algorithms,
        overrides,
        out_dir=args.out,
        progress=False if args.no_progress else None,
        imports=args.imports,
    )
    print(result.table)
    files = "accuracy.png, loss.png, waiting.png, comparison.md"
    print(f"comparison directory: {result.out_dir} ({files})")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    spec, overrides = _split_args(args.args)
    if args.resume:
        if spec:
            raise ConfigError(
                "--resume", "takes only the sweep directory (its sweep.yaml is reused)"
            )
        spec = args.resume
    if spec is None:
        raise ConfigError(
            "SWEEP", "give a sweep file (e.g. benchmarks/papers/s2fl/sweep_mnist.yaml)"
        )
    result = sweep(
        spec,
        out_dir=args.out,
        backend=args.backend,
        address=args.address,
        gpus_per_trial=args.gpus_per_trial,
        cpus_per_trial=args.cpus_per_trial,
        keep_going=args.keep_going,
        overrides=overrides,
        imports=args.imports,
    )
    counts = ", ".join(f"{n} {status}" for status, n in sorted(result.counts.items()))
    print(f"sweep directory: {result.out_dir} ({counts}; report.md, report.html)")
    return 0 if result.ok else EXIT_TRIALS_FAILED


def cmd_report(args: argparse.Namespace) -> int:
    result = report(args.dir, out_dir=args.out, target=args.target)
    for line in result.damaged:
        print(f"warning: damaged run {line}", file=sys.stderr)
    print(result.table)
    print(f"report: {result.files['report.html']} (report.md, report.csv, plots)")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    config, overrides = _split_args(args.args)
    if config is None:  # as `splitfl run`: the defaults alone are not a config to check
        raise ConfigError("CONFIG", "give a config file (e.g. configs/quickstart.yaml)")
    print(validate(config, overrides, imports=args.imports))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    if args.model_cards:
        print(cards_markdown(), end="")
        return 0
    for section, entries in catalog().items():
        print(f"{section.replace('_', ' ')}:")
        for name, description in entries.items():
            print(f"  {name:14s} {description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splitfl", description="Split federated learning on heterogeneous devices."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run one experiment: splitfl run CONFIG [key=value ...]")
    p.add_argument("args", nargs="*", metavar="CONFIG [key=value ...]")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run")
    p.add_argument("--out", metavar="RUN_DIR", help="run directory (default: output.out_dir/…)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-wait-plots",
        action="store_true",
        help="exit once summary.json is written; accuracy.png and loss.png are drawn by a "
        "background process that finishes after the command (default: wait for them)",
    )
    p.add_argument(
        "--address",
        help="Ray cluster of executor: parallel's workers (parallel.backend: ray): auto or "
        "ray://host:10001; sets parallel.address (default: a local Ray instance)",
    )
    add_import_flag(p)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("compare", help="run several algorithms on one config and tabulate")
    p.add_argument("args", nargs="+", metavar="CONFIG [key=value ...]")
    p.add_argument("--algorithms", required=True, help="comma-separated, e.g. fedavg,s2fl")
    p.add_argument("--out", metavar="DIR", help="comparison directory")
    p.add_argument("--no-progress", action="store_true")
    add_import_flag(p)
    p.set_defaults(fn=cmd_compare)
    p = sub.add_parser(
        "sweep",
        help="run every combination of a sweep file's axes as trials (Ray or local)",
        description="Trials write ordinary run directories under one sweep directory; running "
        "the same sweep into the same directory again resumes it. --backend picks how trials "
        "are run (ray or local), not the training executor (the config field `executor`); "
        "--executor is its deprecated old name.",
    )
    p.add_argument("args", nargs="*", metavar="SWEEP.yaml [key=value ...]")
    p.add_argument("--out", metavar="DIR", help="sweep directory (default: <out_dir>/<name>)")
    p.add_argument("--resume", metavar="DIR", help="resume the sweep in DIR (its sweep.yaml)")
    p.add_argument(
        "--backend",
        "--executor",  # deprecated alias (the name clashed with the config field `executor`)
        dest="backend",
        choices=["ray", "local"],
        default="ray",
        help="how trials run: ray or local (--executor: deprecated alias)",
    )
    p.add_argument("--address", help="Ray cluster: auto or ray://host:10001 (default: local)")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, metavar="G")
    p.add_argument("--cpus-per-trial", type=float, default=1.0, metavar="C")
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="record invalid trials as failed and run the others (default: stop before running)",
    )
    add_import_flag(p)
    p.set_defaults(fn=cmd_sweep)
    p = sub.add_parser("report", help="table (mean ± std over seeds), plots and an HTML page")
    p.add_argument("dir", metavar="DIR", help="a sweep, comparison or run directory")
    p.add_argument("--out", metavar="DIR", help="where to write (default: DIR)")
    p.add_argument("--target", type=float, help="accuracy target in (0, 1] for time/traffic")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("validate", help="check a config (and its data) without running")
    p.add_argument("args", nargs="+", metavar="CONFIG [key=value ...]")
    add_import_flag(p)
    p.set_defaults(fn=cmd_validate)
    p = sub.add_parser("list", help="algorithms, models, datasets, device presets")
    p.add_argument(
        "--model-cards",
        action="store_true",
        help="every clock decision of each device preset and paper algorithm, with its source",
    )
    p.set_defaults(fn=cmd_list)

    add_network_parsers(sub)
    add_privacy_parser(sub)
    return parser


def _one_line_data_warnings() -> None:
    """Show :class:`~splitfl.data.base.DatasetWarning` and
    :class:`~splitfl.models.crossing.RawInputWarning` as one ``warning: ...`` line (like the
    ``error: ...`` lines); other warnings keep Python's format."""

    shown = warnings.showwarning
    if getattr(shown, "splitfl_data", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if issubclass(category, DatasetWarning | RawInputWarning):
            print(f"warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    show.splitfl_data = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    _one_line_data_warnings()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    stray = [e for e in extra if "=" not in e or e.startswith("-")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:  # key=value overrides given after an option, e.g. after --algorithms
        args.args = [*getattr(args, "args", []), *extra]
    try:
        try:
            return args.fn(args)
        finally:  # the end-of-run plots, drawn by background processes
            if not getattr(args, "no_wait_plots", False):
                wait_plots()
    except (ConfigError, DatasetError, WorkersLostError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except NonFiniteLossError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt as err:
        print(str(err) or "interrupted", file=sys.stderr)  # the run's message says where
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return 0
    except OSError as err:  # a full disk, a read-only folder, a name too long, ...
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
