"""The same experiment from Python:

python examples/own_model_and_data/run.py [OUT_DIR] [key=value ...]
"""

import sys
from pathlib import Path

import splitfl

here = Path(__file__).resolve().parent
out = sys.argv[1] if len(sys.argv) > 1 else "runs"
result = splitfl.run(here / "config.yaml", [f"output.out_dir={out}", *sys.argv[2:]])
print(f"{result.run_dir}: accuracy {result.summary['final_acc']:.3f}")
