"""The CPU kernels the tests run on (issue 46).

Equal results from two code paths hold only up to rounding, and the rounding depends on the
kernels the CPU gets: ATen's vectorised loops (``ATEN_CPU_CAPABILITY``), MKL's BLAS
(``MKL_ENABLE_INSTRUCTIONS``) and oneDNN's convolutions (``DNNL_MAX_CPU_ISA``). CI runs the
numerics tests a second time on the baseline kernels (``.ci/run``, :data:`BASELINE`), so a
test that passes only on one instruction set fails there. These tests keep that pass honest:
the settings take effect, and they really change the roundings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

#: The CPU's baseline kernels: what ``.ci/run``'s second numerics pass sets.
BASELINE = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "DNNL_MAX_CPU_ISA": "SSE41",
}

_PROBE = """
import json, torch
torch.manual_seed(0)
a, b = torch.randn(257, 513), torch.randn(513, 129)
print(json.dumps({
    "capability": torch.backends.cpu.get_cpu_capability(),
    "row_sums": a.sum(1).tolist(),
    "matmul": (a @ b).flatten()[:64].tolist(),
}))
"""


def _probe(env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in BASELINE}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def test_this_process_runs_the_aten_kernels_it_was_asked_for():
    """In CI's baseline pass this process itself runs the DEFAULT kernels (a misspelt or
    ignored variable would rerun the detected ones and prove nothing)."""
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    got = torch.backends.cpu.get_cpu_capability()
    assert asked is None or got == asked.upper(), (asked, got)


def test_baseline_kernels_are_forced_and_round_differently_where_the_cpu_has_simd():
    """The baseline settings give ATen's DEFAULT capability; on a CPU with vector units the
    float32 row sums and the matrix product are not the same bits as the detected kernels'
    (AVX-512 and AVX2 both differ from DEFAULT here), which is what makes the pass a test."""
    detected, baseline = _probe({}), _probe(BASELINE)
    assert baseline["capability"] == "DEFAULT"
    if detected["capability"] != "DEFAULT":
        assert (detected["row_sums"], detected["matmul"]) != (
            baseline["row_sums"],
            baseline["matmul"],
        )
    # the same numbers up to float32 rounding all the same
    for key in ("row_sums", "matmul"):
        torch.testing.assert_close(
            torch.tensor(detected[key]), torch.tensor(baseline[key]), rtol=1e-4, atol=1e-4
        )


def test_ci_runs_the_numerics_pass_on_exactly_these_baseline_settings():
    """``.ci/run`` spells :data:`BASELINE` out in shell; the two stay one list."""
    script = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    line = next(s for s in script.splitlines() if s.startswith("ATEN_CPU_CAPABILITY="))
    assert line.removesuffix(" \\").split() == [f"{k}={v}" for k, v in BASELINE.items()]
