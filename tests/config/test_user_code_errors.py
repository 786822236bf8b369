"""User code through the extension API fails in one line (issue 35.12/13).

Every case runs ``splitfl run`` in-process (``splitfl.cli.main.main``): a dataset builder
that raises or returns nothing usable, a Dataset whose items disagree with each other or
with their ``targets``, a model whose outputs training cannot use or whose cut leaves a side
without parameters, a module that exits or registers a non-``Algorithm``, container files
that are empty, inconsistent or truncated. Each must exit 2 with exactly one ``error:``
line naming the module, callable, file or item, and write nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from splitfl.cli.main import main
from splitfl.core.usercode import user_code
from splitfl.data.formats import ContainerOptions, load_container
from splitfl.data.formats.arrays import as_labels
from splitfl.testing import config_for

MODULE = "badcode35"
HERE = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A folder with the broken module (``user_code_cases.py`` as ``badcode35``), modules
    that misbehave on import, the container files and a config naming the module."""
    root = tmp_path_factory.mktemp("user-code")
    shutil.copy(HERE / "user_code_cases.py", root / f"{MODULE}.py")
    (root / "exit35.py").write_text("import os\nos._exit(0)\n")
    (root / "sysexit35.py").write_text("import sys\nsys.exit(0)\n")
    (root / "notalg35.py").write_text(
        textwrap.dedent(
            """
            import splitfl

            class NotAnAlgorithm:
                name = "not_an_algorithm"

            splitfl.register_algorithm(NotAnAlgorithm)
            """
        )
    )
    _files(root)
    config = config_for("splitfed_v1", rounds=1, model=f"{MODULE}:m_ok")
    config["data"].update(dataset=f"{MODULE}:ds_ok", num_clients=4, min_samples=1)
    config["train"]["clients_per_round"] = 4
    config["import_dirs"] = [str(root)]
    (root / "config.json").write_text(json.dumps(config))
    return root


def _files(root: Path) -> None:
    """Container data: npz (an empty training split; clients of two sample shapes; uint8
    training beside float 0-255 test inputs), CSV with a fractional label, a lazy image
    folder with a truncated PNG (its pixels complete, its end chunk missing)."""
    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 8, 8)).astype(np.float32)
    y = np.arange(64) % 4
    for name in ("empty", "clients/clients", "uint8", "csv", "png"):
        (root / name).mkdir(parents=True)
    np.savez(root / "empty/train.npz", x=x[:0], y=y[:0])
    for folder in ("empty", "clients", "uint8"):
        scale = 255 if folder == "uint8" else 1
        np.savez(root / folder / "test.npz", x=x[:16] * scale, y=y[:16])
    for c in range(4):
        xs = x[c * 16 : (c + 1) * 16] if c != 2 else rng.random((16, 1, 8, 9))
        np.savez(root / f"clients/clients/{c}.npz", x=xs, y=y[c * 16 : (c + 1) * 16])
    np.savez(root / "uint8/train.npz", x=(x * 255).astype(np.uint8), y=y)
    for split, n in (("train", 64), ("test", 16)):
        rows = [f"{1.7 if i == 5 else i % 4},{rng.random()},{rng.random()}" for i in range(n)]
        (root / f"csv/{split}.csv").write_text("label,a,b\n" + "\n".join(rows) + "\n")
        for k in range(2):
            folder = root / "png" / split / f"c{k}"
            folder.mkdir(parents=True)
            for i in range(n // 2):
                pixels = (rng.random((8, 8)) * 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    png = root / "png/train/c1/3.png"
    png.write_bytes(png.read_bytes()[:-12])  # the IEND chunk: Pillow still decodes it


def _data(folder: str, fmt: str, says: str, *more: str) -> tuple:
    args = [f"data.format={fmt}", f"data.root={{root}}/{folder}", "data.dataset=mine", *more]
    return (f"{fmt} {folder}", args, says)


def _ds(fn: str, says: str, *more: str) -> tuple:
    return (fn, [f"data.dataset={MODULE}:{fn}", *more], f"{MODULE}:{fn}: {says}")


def _model(fn: str, says: str, *more: str) -> tuple:
    return (f"{fn} {' '.join(more)}".strip(), [f"model={MODULE}:{fn}", *more], says)


def _imports(module: str, says: str) -> tuple:
    return (module, ["--import", module], f"cannot import {module!r}: {says}")


#: (case, arguments after the config, what the one line must say)
CASES = [
    # dataset builders that raise, exit or return nothing usable
    _ds("ds_keyerror", f"KeyError: 'missing' ({MODULE}.py line"),
    _ds("ds_attr", "AttributeError: 'NoneType' object has no attribute 'shape'"),
    _ds("ds_index", "IndexError: list index out of range"),
    _ds("ds_zero", "ZeroDivisionError: division by zero"),
    _ds("ds_assert", "AssertionError: bad data"),
    _ds("ds_value", "ValueError: cannot parse"),
    _ds("ds_exit", "it called sys.exit(0)"),
    _ds("ds_none", "expected a DatasetBundle, a (train, test) pair"),
    # items of a torch Dataset
    _ds("ds_shapes", "train item 1 has inputs of shape [1, 8, 8]; the dataset's are [1, 8, 9]"),
    _ds(
        "ds_shapes_lazy",
        "train item 63 has inputs of shape [1, 8, 8]; the dataset's are [1, 8, 9]",
        "data.lazy=true",
    ),
    _ds("ds_names", "train item 0 has label 'cat' (str)"),
    _ds("ds_onehot", "train labels must be 64 integers, got int64 [64, 4]"),
    _ds("ds_none_label", "train item 0 has label None (NoneType)"),
    _ds("ds_huge_label", "the object its callable returned: 1099511627777 classes"),
    _ds("ds_long", "train item 64 of 80: IndexError: 64"),
    _ds("ds_long_lazy", "train item 79 of 80: IndexError: 79", "data.lazy=true"),
    _ds("ds_float_label", "train labels must be 64 integers, got float64 [64] (float targets"),
    _ds("ds_string_label", "train item 0 has label '0' (str)"),
    _ds("ds_targets_disagree", "train item 63 has label 3 but the dataset's targets attribute"),
    # models
    _model(
        "m_builder_error",
        f"model: {MODULE}:m_builder_error does not fit {MODULE}:ds_ok inputs (1, 8, 8): "
        f"KeyError: 'x' ({MODULE}.py line",
    ),
    _model(
        "m_forward_error",
        f"model: {MODULE}:m_forward_error does not fit {MODULE}:ds_ok inputs (1, 8, 8): "
        "KeyError: 'oops'",
    ),
    _model("m_int64", "m_int64 gives int64 outputs; expected float32"),
    _model("m_float64", "m_float64 gives float64 outputs; expected float32"),
    _model("m_float16", "m_float16 gives float16 outputs; expected float32"),
    _model("m_nan", "m_nan gives NaN or infinite outputs for the first 2 training samples"),
    _model("m_fixed_batch", "m_fixed_batch gives outputs [2, 6] for a batch of 3"),
    _model("m_no_parameters", "m_no_parameters has no trainable parameters"),
    _model("m_flatten_first", "m_flatten_first: no cut point leaves trainable parameters"),
    _model("m_relu_first", "m_relu_first: no cut point leaves trainable parameters"),
    _model("m_cuts_empty", "m_cuts_empty: no cut points"),
    _model("m_cuts_string", "m_cuts_string: cut points must be block indices (integers), got '1'"),
    _model("m_cuts_floats", "m_cuts_floats: cut points must be block indices (integers)"),
    _model("m_net", "split.cut_points: module paths, at least one", "split.cut_points=[]"),
    _model("m_net", "m_net: cut 'flat' leaves its device part without trainable", "split.cut=flat"),
    # modules named in imports
    _imports("notalg35", "TypeError: register_algorithm takes a subclass of splitfl.Algorithm"),
    _imports("exit35", "it called os._exit(0)"),
    _imports("sysexit35", "it called sys.exit(0)"),
    # container files
    _data("empty", "npz", "empty/train.npz: holds no samples"),
    _data(
        "clients",
        "npz",
        "clients/clients/2.npz: inputs have sample shape [1, 8, 9], 0.npz's [1, 8, 8]",
        "data.partition=folders",
    ),
    _data("uint8", "npz", "uint8/test.npz: inputs are float32 but train.npz's are uint8"),
    _data("csv", "csv", "csv/train.csv: label '1.7' is not a whole number"),
    _data("png", "image_folder", "png/train/c1/3.png: is truncated", "data.lazy=true"),
]


@pytest.mark.parametrize("case,args,says", CASES, ids=[c[0] for c in CASES])
def test_user_code_fails_in_one_line_and_writes_nothing(case, args, says, project, capsys):
    out = project / "runs" / case.replace(" ", "_")
    args = [a.replace("{root}", str(project)) for a in args]
    code = main(["run", str(project / "config.json"), f"output.out_dir={out}", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert says in err[0], err[0]
    assert not out.exists() or not any(out.iterdir())


def test_the_cases_config_itself_runs(project, tmp_path, capsys):
    """The base config is sound: each case fails by its own change only."""
    assert main(["run", str(project / "config.json"), "--out", str(tmp_path / "ok")]) == 0


def test_a_lazy_dataset_that_declares_its_shape_checks_items_when_read(project, tmp_path, capsys):
    """A Dataset declaring ``input_shape`` is read only when a batch needs an item (nothing
    at load): an item of another shape stops the run in one line naming it (exit 2), the
    checkpoint before it kept."""
    run_dir = tmp_path / "run"
    args = [f"data.dataset={MODULE}:ds_shapes_declared", "data.lazy=true", "--out", str(run_dir)]
    code = main(["run", str(project / "config.json"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "train item 37 has inputs of shape [1, 8, 9]; the dataset's are [1, 8, 8]" in err[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"].startswith("stopped at round 0: "), summary["status"]
    assert (run_dir / "checkpoints" / "last.pt").exists()


def test_a_model_without_a_usable_cut_still_trains_whole(project, tmp_path, capsys):
    """A bare Flatten first leaves no cut with parameters on both sides: FedAvg, which
    trains the whole model, runs it (the split algorithms refuse it, above)."""
    args = [f"model={MODULE}:m_flatten_first", "algorithm=fedavg", "--out", str(tmp_path / "r")]
    assert main(["run", str(project / "config.json"), *args]) == 0


def test_whole_number_labels_are_classes_in_every_container(tmp_path):
    """CSV labels ``3.0`` are class 3 (as ``3`` is, and as a whole-number float label of a
    torch Dataset): not the class *name* "3.0", whose sorted order would put "10.0" before
    "2.0". A float label column of an array or table container reads the same way."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("test", 12)):
        rows = [f"{i % 12}.0,{rng.random()}" for i in range(n)]
        (tmp_path / f"{split}.csv").write_text("label,a\n" + "\n".join(rows) + "\n")
    bundle = load_container("csv", tmp_path, "mine", ContainerOptions())
    assert bundle.num_classes == 12
    assert bundle.train.y.tolist() == [i % 12 for i in range(48)]
    labels = as_labels(np.array([3.0, 0.0, 11.0]), "mine", tmp_path / "t.parquet", 3)
    assert labels.dtype == np.int64 and labels.tolist() == [3, 0, 11]


def test_a_child_forked_inside_user_code_exits_as_it_meant_to():
    """``os._exit`` is refused in this process only: a child that user code forks (as
    multiprocessing does) ends with its own status; afterwards ``os._exit`` is itself."""
    real = os._exit
    with user_code("fork", ValueError):
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7 and os._exit is real
