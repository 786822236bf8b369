"""``splitfl privacy leakage|attack|reconstruct|labels|eval|fsha``: RingSFL Eq. (8)/Fig. 5, the
DLG attack of §4.2.5, a curious server's attacks on a finished run or on what it recorded
during training (``--recorded``, :mod:`splitfl.privacy.on_run`), and a malicious server's FSHA
with the client's SplitGuard score (:mod:`splitfl.privacy.fsha`).

Wire into :func:`splitfl.cli.main.build_parser` with ``add_privacy_parser(sub)``. Bad values
raise :class:`~splitfl.config.ConfigError` (``main`` prints one line and exits 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import replace
from pathlib import Path

from splitfl.config import ConfigError
from splitfl.privacy.experiment import load_attack_config, run_attack
from splitfl.privacy.fsha_run import FshaConfig, run_fsha, validate_fsha
from splitfl.privacy.leakage import leakage_curve, leakage_probability, plot_leakage_curve
from splitfl.privacy.on_run import RunAttack, attack_run
from splitfl.privacy.results import plot_reconstruction, results_to_json, write_results
from splitfl.privacy.sweep import evaluate_sweep, load_sweep

FIG5_E = (0.1, 0.2, 0.4, 0.6)


def _probability(value: float | None, flag: str) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ConfigError(flag, f"must be in [0, 1] (got {value})")


def cmd_leakage(args: argparse.Namespace) -> int:
    """Print P_i (Eq. 8) for ``--clients`` clients and write the Fig. 5 curve."""
    e_prime = args.e if args.e_prime is None else args.e_prime
    _probability(args.e, "--e")
    _probability(e_prime, "--e-prime")
    if args.clients < 1:
        raise ConfigError("--clients", f"must be >= 1 (got {args.clients})")
    if args.n_max < 2:
        raise ConfigError("--n-max", f"must be >= 2 (got {args.n_max})")
    n = args.clients
    p = leakage_probability([args.e] * n, [e_prime] * n)
    print(f"RingSFL Eq. (8): N = {n}, e = {args.e:g}, e' = {e_prime:g}")
    print(f"{'client':>6}  {'e_i':>6}  {'e_i_prime':>9}  {'P_i':>12}")
    for i, value in enumerate(p):
        print(f"{i:>6}  {args.e:>6g}  {e_prime:>9g}  {value:>12.6g}")
    e_values = sorted(set(FIG5_E) | {float(args.e)})
    curve = leakage_curve(e_values, args.n_max)
    out = Path(args.out)
    png = plot_leakage_curve(curve, out / "leakage.png")
    data = {
        "clients": n,
        "e": args.e,
        "e_prime": e_prime,
        "p": p.tolist(),
        "curve": {"n": curve["n"], "curves": {f"{e:g}": v for e, v in curve["curves"].items()}},
    }
    (out / "leakage.json").write_text(json.dumps(data, indent=1))
    print(f"Fig. 5 curve (e = e' in {', '.join(f'{e:g}' for e in e_values)}): {png}")
    return 0


def cmd_attack(args: argparse.Namespace) -> int:
    """Run the DLG attack on FedAvg and RingSFL uploads; write results.json and attack.png."""
    config_path = None
    overrides = []
    for value in args.args:
        if "=" in value or config_path is not None:
            overrides.append(value)
        else:
            config_path = value
    config = load_attack_config(config_path, overrides)
    if args.out:
        config = replace(config, out=args.out)
    results = run_attack(config)
    json_path, png_path = write_results(results, config.out)
    print(
        f"DLG ({config.optimizer}, {config.label} label, {config.iterations} iterations) on "
        f"{config.model}/{config.dataset}, {config.clients} clients, lengths {results['lengths']}"
    )
    for name, label in (("fedavg", "FedAvg"), ("ringsfl", "RingSFL")):
        r = results[name]
        print(
            f"{label:8s} final cosine {r['final_cosine']:.4f}  max {r['max_cosine']:.4f}  "
            f"gradient error {r['gradient_error']:.3g}  ({r['seconds']:.1f} s)"
        )
    print(f"results: {json_path}, {png_path}")
    return 0


def _spec(args: argparse.Namespace, attack: str) -> RunAttack:
    """The :class:`RunAttack` of a ``reconstruct``/``labels`` command line."""
    fields = {
        k: v
        for k, v in vars(args).items()
        if k in RunAttack.__dataclass_fields__ and v is not None and k != "attack"
    }
    return RunAttack(attack=attack, **fields)


def _write_run_attack(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    scores = {k: v for k, v in result.items() if k not in ("true_x", "reconstruction")}
    path = out / "results.json"
    path.write_text(json.dumps(results_to_json(scores), indent=1, allow_nan=False))
    return path


def _recorded_round(result: dict) -> str:
    """``, recorded in round r`` for an attack on recorded tensors, else nothing."""
    return f", recorded in round {result['round']}" if "round" in result else ""


def cmd_reconstruct(args: argparse.Namespace) -> int:
    """UnSplit or the inverse network on a run's victim client; results.json and grid.png."""
    result = attack_run(_spec(args, args.attack))
    out = Path(args.out or Path(args.run_dir) / "privacy")
    json_path = _write_run_attack(result, out)
    grid = plot_reconstruction(result["true_x"], result["reconstruction"], out / "grid.png")
    estimated = " (estimated device part)" if result["spec"]["device_part"] == "estimated" else ""
    print(
        f"{args.attack}{estimated} on client {result['client']} (cut {result['cut']}, "
        f"{result['samples']} samples{_recorded_round(result)}): MSE {result['mse']:.4g}  "
        f"PSNR {result['psnr']:.2f} dB  SSIM {result['ssim']:.3f}"
    )
    print(f"results: {json_path}, {grid}")
    return 0


def cmd_labels(args: argparse.Namespace) -> int:
    """Li et al.'s label inference on a U-shaped run's head gradients; results.json."""
    result = attack_run(_spec(args, "labels"))
    json_path = _write_run_attack(result, Path(args.out or Path(args.run_dir) / "privacy"))
    print(
        f"label inference on client {result['client']} (cut {result['cut']}, tail "
        f"{result['tail']}, {result['samples']} samples, {result['positives']} of class "
        f"{args.positive}{_recorded_round(result)}): AUC norm {result['auc_norm']:.3f}  direction "
        f"{result['auc_direction']:.3f}"
    )
    print(f"results: {json_path}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """The privacy–utility sweep (:func:`splitfl.privacy.sweep.evaluate_sweep`)."""
    sweep = load_sweep(args.sweep)  # a bad field: one ConfigError line, exit 2, nothing written
    out = Path(args.out or sweep.out)
    progress = None if args.no_progress else (lambda line: print(line, file=sys.stderr, flush=True))
    result = evaluate_sweep(sweep, out, progress)
    print(f"{len(result['rows'])} rows: {out / 'table.md'}, {out / 'table.json'}, "
          f"{out / 'privacy_utility.png'}")  # fmt: skip
    return 0


def _fsha_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _fsha_config(args: argparse.Namespace) -> FshaConfig:
    """The :class:`FshaConfig` of a command line; a bad value is one line naming its flag."""
    given = {k: v for k, v in vars(args).items() if k in FshaConfig.__dataclass_fields__}
    config = FshaConfig(**{k: v for k, v in given.items() if v is not None})
    try:
        validate_fsha(config)
    except ConfigError as err:
        raise ConfigError(_fsha_flag(err.field_path), str(err).split(": ", 1)[1]) from None
    return config


def cmd_fsha(args: argparse.Namespace) -> int:
    """FSHA and its honest control on one client; results.json and grid.png."""
    config = _fsha_config(args)
    try:
        result = run_fsha(config)
    except ConfigError as err:
        if err.field_path not in FshaConfig.__dataclass_fields__:
            raise
        raise ConfigError(_fsha_flag(err.field_path), str(err).split(": ", 1)[1]) from None
    out = Path(config.out)
    json_path = _write_run_attack(result, out)
    grid = plot_reconstruction(result["true_x"], result["reconstruction"], out / "grid.png")
    last = result["fsha"]["checkpoints"][-1]
    guess = result["baseline"]["public_mean"]
    print(
        f"FSHA on {config.model} cut {config.cut} ({config.dataset}, {config.iterations} "
        f"iterations): MSE {last['mse']:.4g}  PSNR {last['psnr']:.2f} dB  SSIM "
        f"{last['ssim']:.3f}  (public mean image: MSE {guess['mse']:.4g}, SSIM "
        f"{guess['ssim']:.3f})"
    )
    print(
        f"SplitGuard mean score: FSHA server {result['fsha']['splitguard_mean']:.3f}, honest "
        f"server {result['honest']['splitguard_mean']:.3f} "
        f"({result['fsha']['fake_batches']} fake batches)"
    )
    print(f"results: {json_path}, {grid}")
    return 0


FSHA_HELP = {
    "model": "registered model whose device part is attacked",
    "dataset": "dataset: the client's training split, the server's test split",
    "root": "dataset folder",
    "cut": "cut point: the client holds blocks [0, cut)",
    "iterations": "training iterations of each run",
    "batch_size": "batch size (client and server)",
    "lr_client": "client's learning rate (FSHA's lr_f)",
    "lr_pilot": "pilot and decoder learning rate (lr_tilde)",
    "lr_discriminator": "discriminator learning rate (lr_D)",
    "gradient_penalty": "WGAN-GP weight",
    "lr_server": "honest server's Adam learning rate",
    "client_optimizer": "client's optimiser",
    "pilot": "pilot architecture: client (the client part's, fresh) or linear (the authors')",
    "width": "channels of the server's nets",
    "private_samples": "client's training samples (0: all)",
    "eval_samples": "private samples reconstructed at each checkpoint",
    "checkpoint_every": "iterations between checkpoints",
    "fake_probability": "SplitGuard's probability of a fake batch",
    "splitguard_start": "batches before SplitGuard starts",
    "seed": "seed of every random choice",
    "out": "output folder",
}


def _fsha_flags(p: argparse.ArgumentParser) -> None:
    for field in dataclasses.fields(FshaConfig):
        kind = {"int": int, "float": float}.get(str(field.type), str)
        p.add_argument(
            _fsha_flag(field.name), type=kind, dest=field.name, default=field.default,
            help=FSHA_HELP[field.name],
        )  # fmt: skip


def _victim_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's folder (model.pt)")
    p.add_argument("--client", type=int, help="victim client (default: last round's first)")
    p.add_argument("--samples", type=int, help="victim's training samples attacked (16)")
    p.add_argument("--cut", type=int, help="cut point (default: the client's last cut)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: RUN_DIR/privacy)")
    p.add_argument(
        "--recorded",
        action="store_true",
        default=None,
        help="attack the tensors the server recorded during training (privacy.record)",
    )
    p.add_argument("--round", type=int, help="with --recorded: the round (default: the first)")


def add_privacy_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``privacy leakage`` and ``privacy attack`` to a ``add_subparsers()`` object."""
    parser = subparsers.add_parser(
        "privacy",
        help="privacy: RingSFL leakage (Eq. 8), DLG, server attacks on a run's cut",
    )
    sub = parser.add_subparsers(dest="privacy_command", required=True)
    p = sub.add_parser("leakage", help="eavesdropper leakage probability P_i (Eq. 8, Fig. 5)")
    p.add_argument("--clients", type=int, default=5, help="number of clients N (default 5)")
    p.add_argument("--e", type=float, required=True, help="P(server link heard), in [0, 1]")
    p.add_argument("--e-prime", type=float, help="P(ring link heard) (default: --e)")
    p.add_argument("--n-max", type=int, default=20, help="largest N of the Fig. 5 curve")
    p.add_argument("--out", default="runs/privacy-leakage", metavar="DIR", help="output folder")
    p.set_defaults(fn=cmd_leakage)
    p = sub.add_parser("attack", help="DLG on FedAvg vs RingSFL uploads (RingSFL §4.2.5)")
    p.add_argument("args", nargs="*", metavar="CONFIG [key=value ...]")
    p.add_argument("--out", metavar="DIR", help="output folder (default: the config's out)")
    p.set_defaults(fn=cmd_attack)
    p = sub.add_parser(
        "reconstruct", help="UnSplit / inverse network on a run's smashed data (server attack)"
    )
    _victim_flags(p)
    p.add_argument("--attack", choices=("unsplit", "inverse"), default="unsplit")
    p.add_argument("--iterations", type=int, help="UnSplit's Adam steps (300)")
    p.add_argument("--lr", type=float, help="UnSplit's Adam learning rate (0.05)")
    p.add_argument("--optimizer", choices=("adam", "lbfgs"), help="UnSplit's optimiser (adam)")
    p.add_argument(
        "--device-part",
        metavar="known|estimated",
        help="UnSplit's server holds the device part (known, default) or only its "
        "architecture (estimated: a re-drawn part fitted by model stealing)",
    )
    p.add_argument(
        "--model-iters", type=int, help="UnSplit's steps of the part per iteration (0; estimated 1)"
    )
    p.add_argument("--input-iters", type=int, help="UnSplit's input steps per iteration (1)")
    p.add_argument("--lambda-tv", type=float, help="UnSplit's total-variation weight (0.1)")
    p.add_argument("--lambda-l2", type=float, help="UnSplit's mean(x²) weight (1)")
    p.add_argument("--epochs", type=int, help="inverse network's training epochs (20)")
    p.add_argument("--aux-samples", type=int, help="server's test samples it trains on (1024)")
    p.set_defaults(fn=cmd_reconstruct)
    p = sub.add_parser("labels", help="label inference on a U-shaped run's head gradients")
    _victim_flags(p)
    p.add_argument("--positive", type=int, default=1, help="the class scored (default 1)")
    p.set_defaults(fn=cmd_labels)
    p = sub.add_parser("eval", help="privacy–utility sweep: algorithms × cuts × defences × attacks")
    p.add_argument("sweep", metavar="SWEEP.yaml")
    p.add_argument("--out", metavar="DIR", help="output folder (default: the sweep's out)")
    p.add_argument("--no-progress", action="store_true", help="no line per finished cell")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("fsha", help="FSHA by a malicious server, SplitGuard score vs an honest one")
    _fsha_flags(p)
    p.set_defaults(fn=cmd_fsha)
    return parser
