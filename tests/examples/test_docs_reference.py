"""The docs' reference pages are generated from the code (``docs/gen_reference.py``): each is
regenerated in a fresh interpreter and must equal the committed page; the README lists every
registered algorithm and links only to files that exist; a run writes no file the
run-directory reference lacks. What the registries hold is read in a fresh interpreter: other
tests of this process register their own algorithms and datasets."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fresh(*argv: str) -> subprocess.CompletedProcess:
    """``python *argv`` in a fresh interpreter on this checkout's splitfl, from the root."""
    import splitfl

    src = str(Path(splitfl.__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
        cwd=ROOT,
        timeout=300,
    )


def test_the_reference_pages_are_current():
    out = _fresh(str(ROOT / "docs" / "gen_reference.py"), "--check")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_readme_names_every_registered_algorithm_and_its_links_exist():
    out = _fresh(
        "-c",
        "import json; from splitfl.algorithms import ALGORITHMS as A; print(json.dumps(list(A)))",
    )
    algorithms = json.loads(out.stdout)
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 15_000, "the README is the front door: at most 15 KB"
    missing = [name for name in algorithms if f"`{name}`" not in readme]
    assert not missing, f"README.md's algorithm list lacks {missing}"
    for target in re.findall(r"\]\(([^)#\s]+)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_a_run_writes_only_files_the_run_directory_reference_lists(tmp_path):
    import splitfl
    from splitfl.rundir.files import RUN_FILES

    result = splitfl.run(
        str(ROOT / "configs" / "quickstart.yaml"),
        [
            "rounds=1",
            "data.num_clients=10",
            "train.clients_per_round=2",
            "output.plots=true",
            "algorithm=splitfed_v1",
            f"output.out_dir={tmp_path}",
        ],
        progress=False,
    )
    written = {p.name + ("/" if p.is_dir() else "") for p in Path(result.run_dir).iterdir()}
    assert written <= set(RUN_FILES), f"not in RUN_FILES: {written - set(RUN_FILES)}"
    assert json.loads((Path(result.run_dir) / "summary.json").read_text())
