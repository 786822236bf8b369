"""docs/tutorials/own-model-and-data.md's example, run as a user runs it: copied outside the
source tree, through the CLI and the Python API; and a user's ``nn.Sequential`` trained on each
data container splitfl reads (image folder, npz, CSV, Hugging Face on disk, torch Datasets from
an import path), with transforms, from a project folder outside the tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

import splitfl

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_model_and_data"


def _env() -> dict[str, str]:
    """The test process's environment without its PYTHONPATH additions (the example must
    find its module by itself)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SPLITFL_CACHE_DIR"] = os.environ.get("SPLITFL_CACHE_DIR", "")
    return env


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd`` as a user types it; fails the test on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_the_example_runs_from_a_copy_outside_the_tree(tmp_path):
    project = tmp_path / "elsewhere" / "own_model_and_data"
    shutil.copytree(EXAMPLE, project)
    with ThreadPoolExecutor(2) as pool:  # the two routes at once (separate output folders)
        cli_args = ("-m", "splitfl", "run", "config.yaml", "rounds=2", "output.out_dir=cli")
        cli = pool.submit(_python, *cli_args, cwd=project)
        api_route = pool.submit(_python, "run.py", str(tmp_path / "api"), "rounds=2", cwd=project)
        cli.result()
        api = api_route.result()
    (run_dir,) = (project / "cli").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["test_macro_f1"] is not None for r in rows)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"] == "my_project:small_cnn" and config["imports"] == ["my_project"]
    assert "accuracy" in api.stdout
    (api_dir,) = (tmp_path / "api").iterdir()
    api_rows = [json.loads(x) for x in (api_dir / "metrics.jsonl").read_text().splitlines()]
    # the same experiment by both routes: the same numbers
    assert [r["test_acc"] for r in api_rows] == [r["test_acc"] for r in rows]
    assert [r["train_loss"] for r in api_rows] == [r["train_loss"] for r in rows]


ANY_MODEL = EXAMPLE.parent / "any_model"


def test_the_any_model_example_runs_from_a_copy_outside_the_tree(tmp_path):
    """docs/tutorials/own-model-and-data.md, "Your own model": an ordinary ``nn.Module`` ResNet
    cut by module name, and a token-id model whose cut carries two tensors, through the CLI as a
    user types it; the ResNet's weights load back into the user's own class."""
    project = tmp_path / "elsewhere" / "any_model"
    shutil.copytree(ANY_MODEL, project)
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(
                _python,
                "-m",
                "splitfl",
                "run",
                f"{name}.yaml",
                "rounds=2",
                f"output.out_dir={name}",
                cwd=project,
            )
            for name in ("resnet", "text")
        ]
        for run in runs:
            run.result()
    (resnet_dir,) = (project / "resnet").iterdir()
    (text_dir,) = (project / "text").iterdir()
    text_facts = json.loads((text_dir / "data.json").read_text())
    assert text_facts["input_dtype"] == "int64" and text_facts["cut_points"][0] == "embed"
    loaded = _python("load_back.py", str(resnet_dir), cwd=project)
    assert "into ResNet; cut points ['layer1', 'layer2', 'layer3']; output (1, 10)" in (
        loaded.stdout
    )


USER_MODULE = textwrap.dedent(
    """
    import numpy as np
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset


    def conv(input_shape, num_classes):
        c, h, w = input_shape
        return nn.Sequential(
            nn.Sequential(nn.Conv2d(c, 8, 3, padding=1), nn.ReLU()),
            nn.Sequential(nn.Flatten(), nn.Linear(8 * h * w, 32), nn.ReLU()),
            nn.Linear(32, num_classes),
        )


    def mlp(input_shape, num_classes):
        return nn.Sequential(
            nn.Sequential(nn.Linear(input_shape[0], 32), nn.ReLU()),
            nn.Linear(32, num_classes),
        )


    def tensors(root=None):
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(120, 3, 8, 8, generator=gen)
        y = torch.arange(120) % 4
        return TensorDataset(x[:96], y[:96]), TensorDataset(x[96:], y[96:])
    """
)


def _images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    return gen.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), np.arange(n) % 4


def _image_folder(root: Path) -> None:
    from PIL import Image

    for split, n in (("train", 96), ("test", 24)):
        images, labels = _images(n, n)
        for i, (img, label) in enumerate(zip(images, labels, strict=True)):
            folder = root / split / f"class_{label}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(folder / f"{i}.png")


def _npz(root: Path) -> None:
    root.mkdir(parents=True)
    for split, n in (("train", 96), ("test", 24)):
        images, labels = _images(n, n)
        np.savez(root / f"{split}.npz", x=images.transpose(0, 3, 1, 2), y=labels.astype(np.int32))


def _csv(root: Path) -> None:
    root.mkdir(parents=True)
    gen = np.random.default_rng(1)
    for split, n in (("train", 96), ("test", 24)):
        x = gen.normal(size=(n, 5))
        lines = ["f0,f1,f2,f3,f4,label"]
        lines += [",".join(f"{v:.4f}" for v in row) + f",{i % 3}" for i, row in enumerate(x)]
        (root / f"{split}.csv").write_text("\n".join(lines) + "\n")


def _hf(root: Path) -> None:
    datasets = pytest.importorskip("datasets")  # the `test` extra installs it
    splits = {}
    for split, n in (("train", 96), ("test", 24)):
        images, labels = _images(n, n)
        splits[split] = datasets.Dataset.from_dict(
            {"pixels": images.transpose(0, 3, 1, 2).astype(np.float32) / 255, "label": labels}
        )
    datasets.DatasetDict(splits).save_to_disk(str(root))


CROP_FLIP = [{"random_crop": 2}, "hflip", {"normalize": {"mean": [0.5] * 3, "std": [0.25] * 3}}]
CONTAINERS = {
    "image_folder": (_image_folder, {"format": "image_folder"}, "conv", CROP_FLIP),
    "npz": (_npz, {"format": "npz"}, "conv", CROP_FLIP),
    "csv": (_csv, {"format": "csv"}, "mlp", [{"normalize": {"mean": 0.0, "std": 2.0}}]),
    "hf": (_hf, {"format": "hf", "label_column": "label"}, "conv", CROP_FLIP),
    "torch_dataset": (None, {"dataset": "user_models:tensors"}, "conv", CROP_FLIP),
}


@pytest.mark.parametrize("container", sorted(CONTAINERS))
def test_a_user_sequential_trains_on_every_container_with_transforms(container, tmp_path):
    make, data, model, transforms = CONTAINERS[container]
    project = tmp_path / "project"
    project.mkdir()
    (project / "user_models.py").write_text(USER_MODULE)
    if make is not None:
        make(project / "data")
        data = {"dataset": f"my_{container}", "root": str(project / "data"), **data}
    config = {
        "imports": ["user_models"],
        "algorithm": "splitfed_v1",
        "model": f"user_models:{model}",
        "rounds": 2,
        "seed": 1,
        "data": {
            **data,
            "partition": "iid",
            "num_clients": 4,
            "min_samples": 4,
            "transforms": transforms,
        },
        "train": {"clients_per_round": 2, "batch_size": 8, "lr": 0.05},
        "output": {"progress": False, "out_dir": str(tmp_path / "runs")},
    }
    path = project / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = splitfl.run(path)
    assert result.summary["status"] == "ok"
    assert len(result.metrics) == 2 and all(r["test_acc"] is not None for r in result.metrics)
    assert all(np.isfinite(r["train_loss"]) for r in result.metrics)
    again = splitfl.run(path, run_dir=tmp_path / "again")  # seeded: transforms included
    assert [r["train_loss"] for r in again.metrics] == [r["train_loss"] for r in result.metrics]
