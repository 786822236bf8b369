"""Config hardening (issue 11 item 6): every bad config is one line naming the field or file,
exit code 2, and no run directory; nothing ends in a traceback (see benchmarks/fuzz_config.py).
"""

import dataclasses
import math
import typing

import numpy as np
import pytest
import yaml

import splitfl
from conftest import tiny_config
from splitfl.algorithms import ALGORITHMS
from splitfl.cli.main import main
from splitfl.config import (
    FLOAT_RANGES,
    ConfigError,
    DataConfig,
    ExperimentConfig,
    from_dict,
    load_yaml,
    parse_override,
    read_yaml_mapping,
    yaml_limits,
)
from splitfl.experiment.runner import as_config
from splitfl.experiment.validation import check_config as validate

BOMB = (
    "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))
    + "options: {fedavg: {x: *a9}}\n"
)
# (name, config changes, overrides, raw file content or None, expected text in the one line)
CASES = [
    ("alpha-inf", {"data.alpha": math.inf}, [], None, "data.alpha: must be a finite number"),
    ("lr-inf", {"train.lr": math.inf}, [], None, "train.lr: must be a finite number"),
    ("lr_min-inf", {"train.lr_min": math.inf}, [], None, "train.lr_min: must be a finite"),
    ("wd-inf", {"train.weight_decay": math.inf}, [], None, "train.weight_decay: must be a finite"),
    ("jitter-inf", {"devices.jitter": math.inf}, [], None, "devices.jitter: must be a finite"),
    ("p-nan", {"data.p": math.nan}, [], None, "data.p: must be a finite number"),
    ("jitter-big", {"devices.jitter": 11.0}, [], None, "devices.jitter: must be <= 10"),
    ("lr-big", {"train.lr": 1e10}, [], None, "train.lr: must be <= 1e+09"),
    ("seed-neg", {}, ["seed=-1"], None, "seed: must be in [0, 2**63)"),
    ("seed-2^63", {"seed": 2**63}, [], None, "seed: must fit in a 64-bit integer"),
    ("rounds-huge", {"rounds": 10**30}, [], None, "rounds: must fit in a 64-bit integer"),
    ("threads-huge", {"threads": 2**40}, [], None, "threads: must be in [1, 4096]"),
    ("fedavg-opts", {}, ["options.fedavg.group_size=5"], None, "options.fedavg.group_size: un"),
    (
        "other-range",
        {"options.s2fl.group_size": 0, "algorithm": "fedavg"},
        [],
        None,
        "options.s2fl.group_size: must be >= 1",
    ),
    (
        "other-type",
        {"options.mergesfl.tau": "x", "algorithm": "fedavg"},
        [],
        None,
        "options.mergesfl.tau: expected an integer",
    ),
    (
        "other-cut",
        {"options.splitfed_v1.cut": 0, "algorithm": "fedavg"},
        [],
        None,
        "options.splitfed_v1.cut: must be in [1, ",
    ),
    (
        "other-order",
        {"options.ringsfl.order": "a,b", "algorithm": "fedavg"},
        [],
        None,
        "options.ringsfl.order: client ids like 0,2,1",
    ),
    (
        "alias-not-map",
        {"options.s2fl": 3, "algorithm": "s2fl+R"},
        [],
        None,
        "options.s2fl: must be a mapping",
    ),
    (
        "ifca-clusters",
        {"algorithm": "ifca", "options.ifca.num_clusters": 2**62},
        [],
        None,
        "options.ifca.num_clusters: must be <= data.num_clients",
    ),
    ("ovr-open-list", {}, ["rounds=["], None, "rounds: override value: invalid YAML"),
    ("ovr-quote", {}, ["train.lr='x"], None, "train.lr: override value: invalid YAML"),
    ("ovr-surrogate", {}, ["train.lr=\udcff"], None, "train.lr: override value: invalid YAML"),
    ("ovr-tag", {}, ["rounds=!!python/object:os.system 1"], None, "rounds: override value"),
    ("ovr-empty-key", {}, ["=5"], None, "override: '=5': empty name"),
    ("ovr-empty-part", {}, ["train..lr=1"], None, "override: 'train..lr=1': empty name"),
    ("ovr-section", {}, ["train=3"], None, "train: expected a mapping"),
    ("ovr-unknown", {}, ["a.b.c=1"], None, "a: unknown field"),
    ("yaml-syntax", {}, [], "rounds: [\n", "invalid YAML"),
    ("yaml-tab", {}, [], "data:\n\talpha: 0.5\n", "invalid YAML"),
    ("yaml-python-tag", {}, [], "seed: !!python/object:os.system 1\n", "invalid YAML"),
    ("yaml-bad-int", {}, [], "seed: !!int abc\n", "invalid YAML"),
    ("yaml-unhashable", {}, [], "? [1, 2]\n: 3\n", "invalid YAML"),
    ("yaml-two-docs", {}, [], "seed: 1\n---\nseed: 2\n", "invalid YAML"),
    ("yaml-undefined-alias", {}, [], "seed: *nope\n", "invalid YAML"),
    ("yaml-null-byte", {}, [], "seed: 1\x00\n", "invalid YAML"),
    ("not-utf8", {}, [], b"seed: 1\nname: \xff\xfe\n", "not UTF-8 text (byte 14)"),
    ("utf16", {}, [], "seed: 1\n".encode("utf-16"), "not UTF-8 text"),
    ("list", {}, [], "- 1\n- 2\n", "must hold a mapping"),
    ("scalar", {}, [], "42\n", "must hold a mapping"),
    ("deep", {}, [], "x: " + "[" * 500 + "]" * 500 + "\n", "nests deeper than 32 levels"),
    ("bomb", {}, [], BOMB, "expands to more than 100000 values"),
    ("huge", {}, [], "# " + "x" * 1_000_000 + "\n", "larger than 1000000 bytes"),
    (
        "yaml-duplicate-section",  # the second `train:` used to replace the first (lr lost)
        {},
        [],
        "train:\n  lr: 0.5\nrounds: 2\ntrain:\n  batch_size: 8\n",
        "invalid YAML: duplicate key 'train' at line 4, column 1",
    ),
    ("yaml-duplicate-field", {}, [], "seed: 1\nseed: 2\n", "duplicate key 'seed' at line 2"),
    ("lr_min-above-lr", {"train.lr_min": 0.5}, [], None, "train.lr_min: must be <= train.lr=0.05"),
    ("d2d-rate-tiny", {"devices.d2d_rate": 1e-300}, [], None, "devices.d2d_rate: must be >= 1"),
    (
        "shards-too-many-classes",
        {"data.partition": "shards", "data.classes_per_client": 11},
        [],
        None,
        "data.classes_per_client: must be <= the 10 classes in the training labels of digits",
    ),
]


@pytest.mark.parametrize(
    "changes,overrides,content,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_exit_2_and_no_run_dir(
    changes, overrides, content, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cfg.yaml"
    if content is None:
        path.write_text(yaml.safe_dump(tiny_config(**changes)))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    code = main(["run", str(path), *overrides])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    if content is not None:
        assert f"config: {path}" in err
    assert not (tmp_path / "runs").exists()


def _leaves(cls: type, prefix: str = "") -> list[tuple[str, typing.Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", hints[f.name]))
    return out


def _is(tp: typing.Any, kind: type) -> bool:
    return tp is kind or kind in typing.get_args(tp)


CONFIG_FLOATS = [k for k, tp in _leaves(ExperimentConfig) if _is(tp, float)]
CONFIG_INTS = [k for k, tp in _leaves(ExperimentConfig) if _is(tp, int)]
OPTION_FLOATS = [
    (alg, key)
    for alg, cls in ALGORITHMS.items()
    for key, tp in _leaves(cls.Options)
    if _is(tp, float)
]


def _check(changes: dict, field: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate(from_dict(ExperimentConfig, tiny_config(**changes)))
    assert str(err.value).startswith(f"{field}"), str(err.value)
    return str(err.value)


def test_every_config_float_field_has_a_range():
    assert sorted(CONFIG_FLOATS) == sorted(FLOAT_RANGES)


@pytest.mark.parametrize("field", CONFIG_FLOATS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300, -1e300, 10**400])
def test_config_floats_are_finite_and_in_range(field, value):
    _check({field: value}, f"{field}: must be")


@pytest.mark.parametrize("field", CONFIG_INTS)
def test_config_ints_fit_in_64_bits(field):
    _check({field: 2**63}, f"{field}: must fit in a 64-bit integer")
    _check({field: 1e300}, f"{field}: must fit in a 64-bit integer")


@pytest.mark.parametrize("alg,key", OPTION_FLOATS)
@pytest.mark.parametrize("value", [math.nan, math.inf, 1e300, -1e300])
def test_option_floats_of_non_selected_algorithms_are_finite_and_in_range(alg, key, value):
    selected = "fedavg" if alg != "fedavg" else "s2fl"
    message = _check({"algorithm": selected, f"options.{alg}.{key}": value}, f"options.{alg}.")
    if not math.isfinite(value):
        assert message.startswith(f"options.{alg}.{key}: must be a finite number")


@pytest.mark.parametrize("alg", sorted(ALGORITHMS))
def test_unknown_option_of_any_algorithm_is_refused(alg):
    selected = "fedavg" if alg != "fedavg" else "s2fl"
    _check({"algorithm": selected, f"options.{alg}.bogus": 1}, f"options.{alg}.bogus: unknown")


@pytest.mark.parametrize("section", ["", "data.", "devices.", "train.", "eval.", "output."])
def test_unknown_keys_at_every_level(section):
    _check({f"{section}bogus": 1}, f"{section}bogus: unknown field")


def test_good_values_still_pass():
    validate(from_dict(ExperimentConfig, tiny_config(**{"seed": 2**63 - 1, "data.p": 0.0})))
    validate(from_dict(ExperimentConfig, tiny_config(**{"devices.jitter": 10, "threads": None})))


def test_expanded_size_counts_aliases_exactly(monkeypatch):
    # map 1 + "a" 1 + [1, 2] 3 + "b" 1 + [*a, *a] (1 + 3 + 3) = 13 values once expanded
    text = "a: &a [1, 2]\nb: [*a, *a]\n"
    monkeypatch.setattr(yaml_limits, "MAX_YAML_VALUES", 13)
    assert load_yaml(text) == {"a": [1, 2], "b": [[1, 2], [1, 2]]}
    monkeypatch.setattr(yaml_limits, "MAX_YAML_VALUES", 12)
    with pytest.raises(ConfigError, match="^config: YAML text: expands to more than 12"):
        load_yaml(text)


def test_depth_limit_is_exact():
    depth = yaml_limits.MAX_YAML_DEPTH
    text = "[" * depth + "]" * depth
    assert load_yaml(text) == eval(text)
    with pytest.raises(ConfigError, match="nests deeper than"):
        load_yaml("[" * (depth + 1) + "]" * (depth + 1))


def test_big_input_is_refused_before_it_is_read_or_expanded(tmp_path, monkeypatch):
    path = tmp_path / "big.yaml"
    path.write_text("#" * (yaml_limits.MAX_YAML_BYTES + 1))
    monkeypatch.setattr("pathlib.Path.read_bytes", lambda self: pytest.fail("file was read"))
    with pytest.raises(ConfigError, match="larger than"):
        read_yaml_mapping(path)
    monkeypatch.setattr(yaml, "load", lambda *a, **k: pytest.fail("bomb was expanded"))
    with pytest.raises(ConfigError, match="expands to more than"):
        load_yaml(BOMB)


def test_override_keys_need_every_name():
    assert parse_override("train.lr=0.5") == (["train", "lr"], 0.5)
    for text in ["=5", ".=1", "train.=1", "train..lr=1"]:
        with pytest.raises(ConfigError, match="^override: .*empty name"):
            parse_override(text)


# ---------------------------------------------------------------- the Python API


def test_hand_built_configs_are_type_checked_like_files():
    # `rounds="3"` used to fail inside validation with a TypeError, `data={...}` with an
    # AttributeError; a section may be given as a mapping, as in a dict config
    with pytest.raises(ConfigError, match=r"^rounds: expected an integer, got '3'$"):
        as_config(ExperimentConfig(rounds="3"))
    with pytest.raises(ConfigError, match=r"^data\.alpha: expected a number, got 'x'$"):
        as_config(ExperimentConfig(data={"alpha": "x"}))
    cfg = as_config(ExperimentConfig(data={"num_clients": 12}))
    assert cfg.data == DataConfig(num_clients=12)
    with pytest.raises(ConfigError, match=r"^config: expected an ExperimentConfig, a mapping"):
        as_config(42)


def test_numpy_scalars_count_as_python_numbers(tmp_path):
    # Prepare: values as numpy computes them (a sweep over np.arange, a float32 tensor item)
    raw = tiny_config(rounds=np.int64(1), seed=np.uint8(2))
    raw["train"]["lr"] = np.float32(0.25)
    raw["options"] = {"s2fl": {"group_size": np.int64(3)}}
    hand_built = dataclasses.replace(as_config(tiny_config()), rounds=np.int64(1))
    # Execute
    cfg = as_config(raw)
    result = splitfl.run(hand_built, run_dir=tmp_path / "run")  # used to crash dumping YAML
    # Assert
    assert (cfg.rounds, cfg.seed, cfg.train.lr) == (1, 2, float(np.float32(0.25)))
    assert type(cfg.rounds) is int and type(cfg.train.lr) is float
    assert type(cfg.options["s2fl"]["group_size"]) is int
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["rounds"] == 1
    assert result.summary["rounds"] == 1


def test_a_string_is_not_a_list_of_overrides_or_algorithms():
    # a string was iterated letter by letter: "unknown 'r'", compare(...) "unknown 'f'"
    with pytest.raises(ConfigError, match=r"^overrides: expected a list of key=value strings, "):
        as_config(tiny_config(), "rounds=3")
    with pytest.raises(ConfigError, match=r"^overrides: expected a list of key=value strings"):
        as_config(tiny_config(), [("rounds", 3)])
    with pytest.raises(ConfigError, match=r"\(write \['fedavg', 's2fl'\]\)$"):
        splitfl.compare(tiny_config(), "fedavg,s2fl")
    assert as_config(tiny_config(), ("rounds=3",)).rounds == 3
