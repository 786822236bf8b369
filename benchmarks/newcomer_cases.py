"""Issue 52's newcomer cases, rerun through the CLI as a user meets them, with the verdict each
gets now: a Markdown table (case, issue item, what the user sees, verdict).

The issue's user trial counted 68 deliberate mistakes; its table is not in this repository,
so this script reruns the cases the issue itself names (tracebacks, misleading and silent
outcomes). Each case writes its own files in a temporary folder and runs ``python -m splitfl``
as a subprocess. What a case prints is judged by what a user sees: the exit code, whether a
traceback appears, the first line of the error, a ``warning:`` or ``note:`` line.

    python benchmarks/newcomer_cases.py            # about 2 minutes on 2 cores
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
BASE = yaml.safe_load(QUICKSTART.read_text())

MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn

    def bn_mlp(input_shape, num_classes):
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16),
            nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, num_classes),
        )

    def wide_head(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))

    class Peek(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 8), nn.Linear(8 + 4, 10)

        def forward(self, x):
            x = x.flatten(1)
            return self.b(torch.cat([torch.relu(self.a(x)), x[:, :4]], 1))

    def peek(input_shape, num_classes):
        return Peek()

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return (torch.zeros(1, 8, 8), torch.zeros(3)), i % 2

    def pairs(root=None):
        from splitfl.data.base import DatasetBundle
        return DatasetBundle('m52', Pairs(), Pairs(), 2, (1, 8, 8))
    """
)


@dataclass
class Outcome:
    rc: int
    out: str
    err: str
    folder: Path

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.out + self.err

    def first(self, prefix: str = "") -> str:
        for line in (self.err + self.out).splitlines():
            if line.strip() and line.startswith(prefix):
                return line.strip()
        return ""


@dataclass
class Case:
    name: str
    item: str
    config: dict | str | None  # written as c.yaml (a str: as it is)
    args: list[str]  # after ``python -m splitfl``; {c} is the config, {d} the folder
    expect: Callable[[Outcome], tuple[bool, str]]  # (as the issue asks, what the user sees)


def _config(**changes) -> dict:
    """The quickstart (2 rounds, no plots) with dotted ``changes``."""
    cfg = yaml.safe_load(yaml.safe_dump(BASE))
    cfg["rounds"] = 1
    cfg.setdefault("output", {})["plots"] = False
    for key, value in changes.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def _one_line(o: Outcome, field: str = "") -> tuple[bool, str]:
    line = o.first("error") or o.first()
    ok = o.rc == 2 and not o.traceback and field in line
    return ok, f"exit {o.rc}: {line}"


def _runs(o: Outcome, say: str = "") -> tuple[bool, str]:
    said = o.first(say) if say else ""
    ok = o.rc == 0 and not o.traceback and (not say or bool(said))
    return ok, f"exit {o.rc}" + (f"; {said}" if said else "")


def _no_run_dir(o: Outcome) -> tuple[bool, str]:
    ok, seen = _one_line(o, "")
    left = (o.folder / "run").exists()
    return ok and not left, seen + ("; run folder left behind" if left else "; nothing written")


BN = {"model": "m52:bn_mlp", "data.partition": "iid", "data.num_clients": 4}
BN.update({"train.clients_per_round": 4, "train.batch_size": 179, "algorithm": "splitfed_v1"})
BN.update({"options": {"splitfed_v1": {"cut": 2}}})
FLAT = {"data.dataset": "m52:pairs_flat", "data.num_clients": 4, "data.min_samples": 1}
FLAT.update({"train.clients_per_round": 2, "devices": {"preset": "s2fl_table1"}})
_NO_EVAL = {k: v for k, v in _config().items() if k != "eval"}
ON_YAML = yaml.safe_dump(_NO_EVAL) + "eval:\n  every: 1\n  on: both\n"
TRUE_YAML = yaml.safe_dump(_NO_EVAL) + "eval:\n  every: 1\n  true: both\n"


def _tokens_mode(o: Outcome) -> tuple[bool, str]:
    mode = stat.S_IMODE(os.stat(o.folder / "tokens.txt").st_mode)
    return o.rc == 0 and mode == 0o600, f"exit {o.rc}; tokens.txt mode {mode:o}"


CASES = [
    Case("BatchNorm model, a client's last batch of one", "1", _config(**BN),
         ["run", "{c}", "--out", "{d}/run"], _runs),
    Case("... with train.drop_last: false", "1", _config(**BN, **{"train.drop_last": False}),
         ["run", "{c}", "--out", "{d}/run"], _no_run_dir),
    Case("eval: {on: both} as the docs write it", "2", ON_YAML,
         ["validate", "{c}"], _runs),
    Case("a boolean key (true: both)", "2", TRUE_YAML,
         ["validate", "{c}"], lambda o: _one_line(o, "eval")),
    Case("items ((img, meta), y)", "3", _config(**{"data.dataset": "m52:pairs"}),
         ["validate", "{c}"], lambda o: _one_line(o, "one tensor")),
    Case("a model that sends a slice of its input", "4",
         _config(model="m52:peek", algorithm="splitfed_v1", **{"options": {}}),
         ["validate", "{c}"], lambda o: _runs(o, "warning:")),
    Case("a 10-way head on 2 classes", "5",
         _config(model="m52:wide_head", **FLAT),
         ["validate", "{c}"], lambda o: _runs(o, "warning:")),
    Case("cse_fsl on the quickstart", "9", _config(algorithm="cse_fsl"),
         ["validate", "{c}"], lambda o: _runs(o, "note:")),
    Case("train.server_optimizer=fedadam", "10", _config(),
         ["validate", "{c}", "train.server_optimizer=fedadam"], _runs),
    Case("a misspelt field (train.lrr)", "(control)", _config(),
         ["validate", "{c}", "train.lrr=0.1"], lambda o: _one_line(o, "train.lrr")),
    Case("splitfl token writes tokens.txt", "8", None,
         ["token", "--tokens", "{d}/tokens.txt", "--out", "{d}/d0.token", "d0"], _tokens_mode),
    Case("a private key passed as --ca-cert", "8", None,
         ["device", "--server", "127.0.0.1:9", "--name", "d0", "--token-file", "{d}/t",
          "--ca-cert", "{d}/key.pem"], lambda o: _one_line(o, "--ca-cert")),
]  # fmt: skip

PAIRS_FLAT = textwrap.dedent(
    """
    class Flat(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.full((1, 8, 8), float(i % 2)), i % 2

    def pairs_flat(root=None):
        from splitfl.data.base import DatasetBundle
        return DatasetBundle('m52', Flat(), Flat(), 2, (1, 8, 8))
    """
)
KEY = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIDc2xTu5vo5bG0m2s6H7pVJ2wC8YyyW3FZh4ebvQf5r0\n-----END PRIVATE KEY-----\n"  # noqa: E501


def run_case(case: Case, folder: Path) -> Outcome:
    (folder / "m52.py").write_text(MODELS + PAIRS_FLAT)
    (folder / "key.pem").write_text(KEY)
    (folder / "t").write_text("x" * 43)
    config = folder / "c.yaml"
    if isinstance(case.config, dict):
        case.config.setdefault("import_dirs", [str(folder)])
        config.write_text(yaml.safe_dump(case.config))
    elif isinstance(case.config, str):
        config.write_text(case.config + f"import_dirs: [{folder}]\n")
    args = [a.format(c=config, d=folder) for a in case.args]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{folder}"}
    done = subprocess.run(
        [sys.executable, "-m", "splitfl", *args], cwd=folder, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    return Outcome(done.returncode, done.stdout, done.stderr, folder)


def main() -> int:
    print("| case | issue 52 item | what the user sees | verdict |")
    print("|---|---|---|---|")
    failed = 0
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            outcome = run_case(case, Path(tmp))
            ok, seen = case.expect(outcome)
        failed += not ok
        seen = seen.replace("|", "\\|")[:160]
        verdict = "as asked" if ok else ("TRACEBACK" if outcome.traceback else "NOT as asked")
        print(f"| {case.name} | {case.item} | {seen} | {verdict} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
