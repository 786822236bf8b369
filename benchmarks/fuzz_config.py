"""Config fuzzer: many bad configs through ``splitfl validate``; none may end in a traceback.

Generates wrong types, non-finite/huge/negative/zero numbers, empty strings, lists and
mappings where scalars belong, unknown keys at every level, bad ``key=value`` overrides,
unknown registry names, bad options of every algorithm (selected or not), malformed YAML
text, non-UTF-8 bytes, tabs, YAML that is a list or a scalar, huge and deeply nested files and
alias bombs. Each case runs in-process through :func:`splitfl.cli.main.main` (``validate``),
catching ``SystemExit``, with a per-case time limit. Reports cases tried, one-line exit-2
errors, tracebacks (must be 0), timeouts, accepted cases and exit-2 errors that do not name
the mutated field.

    PYTHONPATH=src python benchmarks/fuzz_config.py [--quick] [--show 20]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import signal
import sys
import tempfile
import time
import traceback
import typing
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from splitfl.algorithms import ALGORITHMS
from splitfl.cli.main import main
from splitfl.config import ExperimentConfig, set_dotted
from splitfl.testing import config_for

BAD_VALUES: list[tuple[str, Any]] = [
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("-inf", float("-inf")),
    ("huge", 1e308),
    ("huge-int", 10**30),
    ("-huge-int", -(10**30)),
    ("neg", -1),
    ("zero", 0),
    ("empty", ""),
    ("str", "abc"),
    ("list", [1, 2]),
    ("dict", {"a": 1}),
    ("bool", True),
    ("null", None),
]
QUICK_VALUES = {"nan", "inf", "huge-int", "neg", "empty", "list", "dict"}
#: Override texts with the field they should blame (None: no particular field).
BAD_OVERRIDES: list[tuple[str, str | None]] = [
    ("rounds=[", "rounds"),
    ("rounds={", "rounds"),
    ("train.lr=[1", "train.lr"),
    ("a.b.c=1", "a"),
    ("=5", None),
    (".=1", None),
    ("train.=1", None),
    ("train..lr=1", None),
    ("train=3", "train"),
    ("options=3", "options"),
    ("options.s2fl=3", "options.s2fl"),
    ("options.fedavg.group_size=5", "options.fedavg.group_size"),
    ("rounds.x=1", "rounds"),
    ("seed=-1", "seed"),
    ("seed=9223372036854775808", "seed"),
    ("seed=1.5", "seed"),
    ("data.alpha=.nan", "data.alpha"),
    ("data.alpha=.inf", "data.alpha"),
    ("train.lr='x", "train.lr"),
    ("train.lr=\t1", "train.lr"),
    ("train.lr=\udcff", "train.lr"),
    ("rounds=*a", "rounds"),
    ("rounds=!!python/object:os.system 1", "rounds"),
    ("rounds=- 1\n- 2", "rounds"),
    ("algorithm=", "algorithm"),
    ("rounds", None),
]
#: Whole-file texts (str or bytes) that must be refused with one line naming the file.
BAD_TEXTS: dict[str, str | bytes] = {
    "syntax-open-list": "rounds: [\n",
    "syntax-open-map": "data: {alpha: 1\n",
    "tab-indent": "data:\n\talpha: 0.5\n",
    "tab-start": "\tseed: 1\n",
    "bad-colon": ": :\n",
    "mixed": "- a\nb: c\n",
    "unterminated": "algorithm: 'abc\n",
    "python-tag": "seed: !!python/object:os.system 1\n",
    "binary-tag": "seed: !!binary xyz\n",
    "bad-int-tag": "seed: !!int abc\n",
    "unhashable-key": "? [1, 2]\n: 3\n",
    "bad-directive": "%YAML 9.9\n---\nseed: 1\n",
    "two-docs": "seed: 1\n---\nseed: 2\n",
    "list": "- 1\n- 2\n",
    "scalar-int": "42\n",
    "scalar-str": "hello\n",
    "scalar-bool": "true\n",
    "null-byte": "seed: 1\x00\n",
    "non-utf8": b"seed: 1\nname: \xff\xfe\xe9\n",
    "latin1": "algorithm: s\xe9\n".encode("latin-1"),
    "utf16": "seed: 1\n".encode("utf-16"),
    "undefined-alias": "seed: *nope\n",
    "int-key": "1: 2\n",
    "null-key": "~: 2\n",
    "deep-list": "x: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep-map": "".join("  " * i + f"k{i}:\n" for i in range(2000)) + "  " * 2000 + "v\n",
    "huge-comment": "# " + "x" * 5_000_000 + "\nseed: 1\n",
    "huge-list": "tracking: [" + ", ".join(["a"] * 600_000) + "]\n",
    "billion-laughs": "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))
    + "options: {fedavg: {x: *a9}}\n",
    "alias-bomb-options": "b0: &b0 {k: v}\n"
    + "".join(f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 20)}]\n" for i in range(1, 7))
    + "seed: 1\n",
}


@dataclasses.dataclass
class Case:
    """One fuzz case: a config file's content and overrides, and the field it should blame."""

    name: str
    content: str | bytes | None
    overrides: list[str]
    field: str | None = None
    path: str | None = None  # used instead of writing ``content``


def _leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _leaf_fields(tp, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", tp))
    return out


def _with(base: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    import copy

    data = copy.deepcopy(base)
    set_dotted(data, key.split("."), value)
    return data


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def _value_cases(quick: bool) -> list[Case]:
    """Every config field and every algorithm option field set to every bad value."""
    values = [(n, v) for n, v in BAD_VALUES if not quick or n in QUICK_VALUES]
    cases = []
    base = config_for("s2fl")
    for key, _ in _leaf_fields(ExperimentConfig):
        if key == "options":
            continue
        for label, value in values:
            cases.append(Case(f"{key}={label}", _dump(_with(base, key, value)), [], key))
    for alg, cls in ALGORITHMS.items():
        for key, _ in _leaf_fields(cls.Options, f"options.{alg}."):
            for label, value in values:
                other = "fedavg" if alg != "fedavg" else "s2fl"
                for selected in (alg, other) if label in QUICK_VALUES else (other,):
                    data = _with(config_for(selected), key, value)
                    name = f"{key}={label} (algorithm {selected})"
                    cases.append(Case(name, _dump(data), [], key))
    return cases


def _structure_cases() -> list[Case]:
    """Unknown keys at every level, containers where scalars belong and the reverse."""
    base = config_for("s2fl")
    keys = ["bogus", "data.bogus", "devices.bogus", "train.bogus", "eval.bogus", "output.bogus"]
    keys += ["options.bogus", "options.s2fl.bogus", "options.fedavg.bogus", "options.s2fl+R.bogus"]
    cases = [Case(f"unknown {k}", _dump(_with(base, k, 1)), [], k) for k in keys]
    for section in ["data", "devices", "train", "eval", "output", "options", "options.s2fl"]:
        for label, value in [("int", 3), ("list", [1]), ("str", "x"), ("null", None)]:
            data = _with(base, section, value)
            cases.append(Case(f"{section}={label}", _dump(data), [], section))
    for label, value in [("list-of-list", [["a"]]), ("int-item", [1]), ("unknown", ["x"])]:
        data = _with(base, "output.tracking", value)
        cases.append(Case(f"output.tracking={label}", _dump(data), [], "output.tracking"))
    names = {"algorithm": "nope", "model": "nope", "data.dataset": "nope", "executor": "nope"}
    names |= {"devices.preset": "nope", "devices.composition": "1:2", "data.partition": "x"}
    names |= {"precision": "fp8", "device": "tpu", "options.nope": {}}
    for key, value in names.items():
        cases.append(Case(f"{key}={value!r}", _dump(_with(base, key, value)), [], key))
    return cases


def _override_cases() -> list[Case]:
    text = _dump(config_for("s2fl"))
    return [Case(f"override {o!r}", text, [o], f) for o, f in BAD_OVERRIDES]


def _file_cases(tmp: Path) -> list[Case]:
    cases = [Case(f"text {k}", v, [], None) for k, v in BAD_TEXTS.items()]
    cases.append(Case("missing file", None, [], None, path=str(tmp / "missing.yaml")))
    cases.append(Case("directory", None, [], None, path=str(tmp)))
    return cases


def _run_case(case: Case, path: Path, limit: float) -> tuple[str, str, float]:
    """``(outcome, detail, seconds)``; outcome in ok, error, multiline, traceback, timeout."""
    if case.path is None:
        if isinstance(case.content, bytes):
            path.write_bytes(case.content)
        else:
            path.write_text(case.content or "", encoding="utf-8", errors="surrogateescape")
    target = case.path or str(path)
    err, out = io.StringIO(), io.StringIO()

    def alarm(signum, frame):  # noqa: ARG001
        raise TimeoutError(f"over {limit} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    start = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(["validate", target, *case.overrides])
            except SystemExit as exc:
                code = exc.code
    except TimeoutError as exc:
        return "timeout", str(exc), time.perf_counter() - start
    except BaseException as exc:  # noqa: BLE001 - a traceback is what we count
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{Path(last.filename).name}:{last.lineno}"
        first = (str(exc).splitlines() or [""])[0][:120]
        return "traceback", f"{type(exc).__name__} at {where}: {first}", time.perf_counter() - start
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - start
    text = err.getvalue()
    if code == 0:
        return "accepted", out.getvalue().strip()[:120], seconds
    if code == 2 and text.count("\n") == 1 and text.startswith("error: "):
        return "error", text.strip(), seconds
    return "multiline", f"exit {code}: {text.strip()[:200]!r}", seconds


def _names_field(case: Case, detail: str) -> bool:
    if case.field is None:
        return True
    message = detail.removeprefix("error: ")
    head = ".".join(case.field.split(".")[:2]) if case.field.startswith("options.") else case.field
    return message.startswith(head) or case.field in message


def main_fuzz(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer values per field")
    parser.add_argument("--limit", type=float, default=10.0, help="seconds per case")
    parser.add_argument("--show", type=int, default=30, help="cases listed per outcome")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        cases = _value_cases(args.quick) + _structure_cases() + _override_cases()
        cases += _file_cases(tmp_path)
        results: dict[str, list[tuple[Case, str]]] = {}
        unnamed, slow = [], []
        start = time.perf_counter()
        for case in cases:
            outcome, detail, seconds = _run_case(case, tmp_path / "cfg.yaml", args.limit)
            results.setdefault(outcome, []).append((case, detail))
            if outcome == "error" and not _names_field(case, detail):
                unnamed.append((case, detail))
            if seconds > 2:
                slow.append((case, f"{seconds:.1f} s"))
    counts = Counter({k: len(v) for k, v in results.items()})
    print(f"cases tried: {len(cases)} in {time.perf_counter() - start:.0f} s")
    for outcome in ["error", "traceback", "timeout", "multiline", "accepted"]:
        print(f"  {outcome:10s} {counts.get(outcome, 0)}")
    print(f"  one-line errors not naming the mutated field: {len(unnamed)}")
    print(f"  cases slower than 2 s: {len(slow)}")
    shown = {k: v for k, v in results.items() if k != "error"}
    for title, rows in [*shown.items(), ("unnamed", unnamed), ("slow", slow)]:
        if rows:
            print(f"\n{title}:")
            for case, detail in rows[: args.show]:
                print(f"  {case.name[:70]:70s} -> {detail}")
    return 1 if counts.get("traceback") or counts.get("timeout") else 0


if __name__ == "__main__":
    sys.exit(main_fuzz())
