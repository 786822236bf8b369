"""The Hugging Face architecture table (issue 48): for every tiny architecture of
``tests/hf_catalog.py`` (random weights, built from ``AutoConfig.for_model``), what the one
splitting mechanism (:mod:`splitfl.models.hf_stack`) gives: its cut points, whether device ∘
server equals the model bit for bit in float64 (eval and train mode, with padding; eager and
SDPA attention), whether one round of SplitFed V1 and of S²FL trains, whether the full
fine-tuning ``model.pt`` loads strictly into the folder's Auto class, whether the LoRA export
(peft's ``adapter/`` and the merged model) loads back; then the refused models with the line
they are refused with. Prints a Markdown table (``--json`` also writes the rows).

    python benchmarks/hf_architectures.py > /tmp/table.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"


def _equal(name: str) -> str:
    """``yes`` when every (attention, mode) case is bit-equal, else the largest difference."""
    from test_hf_architectures import _compare

    worst, notes = 0.0, []
    for attn in ("eager", "sdpa"):
        dtype = torch.float32 if (name, attn) == ("modernbert", "eager") else torch.float64
        if dtype == torch.float32:
            notes.append("eager in float32")
        worst = max(worst, *_compare(name, attn, dtype).values())
    text = "yes" if worst == 0.0 else f"no ({worst:.1e})"
    return f"{text} ({', '.join(notes)})" if notes else text


def _trains(name: str, tmp: Path) -> tuple[str, str]:
    """(SplitFed V1 and S²FL each train a round, ``model.pt`` strict into the Auto class)."""
    from test_hf_architectures import round_config

    import hf_catalog as catalog
    import splitfl
    from splitfl.config import ConfigError

    folder = catalog.save(name, tmp / "model", classes=2)
    done = []
    for algorithm in ("splitfed_v1", "s2fl"):
        try:
            splitfl.run(round_config(name, folder, algorithm, tmp), run_dir=tmp / algorithm)
            done.append(algorithm.replace("splitfed_v1", "SFL-V1").replace("s2fl", "S²FL"))
        except ConfigError as err:
            done.append(f"S²FL refused: {str(err).split(': ', 1)[1].split(';')[0]}")
    state = torch.load(tmp / "splitfed_v1" / "model.pt", weights_only=True)
    try:
        catalog.build(name, classes=2).load_state_dict(state, strict=True)
        loads = "yes"
    except RuntimeError:
        loads = "no: one copy of the shared layer per depth (tied_weights: frozen loads)"
    return ", ".join(done), loads


def _lora_loads(name: str, tmp: Path) -> str:
    """The LoRA export of the split model: ``PeftModel.from_pretrained(base, adapter)`` and
    the merged state strict into the base class, computing the same logits."""
    from peft import PeftModel

    import hf_catalog as catalog
    from splitfl.config import LoraConfig
    from splitfl.models.base import user_state_dict
    from splitfl.models.hf import hf_block_model
    from splitfl.models.hf_export import exported_state

    folder = catalog.save(name, tmp / "lora-model", classes=2)
    try:
        model = hf_block_model(f"hf:{folder}", 2, LoraConfig(2, 4.0, 0.0, None))
    except ValueError:  # peft has no default target modules: the layers' linear modules
        model = hf_block_model(f"hf:{folder}", 2, LoraConfig(2, 4.0, 0.0, _layer_linears(name)))
    with torch.no_grad():  # adapters that change the output (B starts at zero)
        for key, p in model.named_parameters():
            if "lora_B" in key:
                p.normal_(0, 0.1)
    (tmp / "run").mkdir()
    merged_state = exported_state(model, user_state_dict(model, model.state_dict()), tmp / "run")
    if not (tmp / "run" / "adapter").exists():
        return "no adapter (shared layer under tied_weights: copy)"
    auto = catalog.auto_class(catalog.ARCHITECTURES[name][1])
    adapted = PeftModel.from_pretrained(auto.from_pretrained(folder), tmp / "run" / "adapter")
    merged = auto.from_pretrained(folder)
    merged.load_state_dict(merged_state, strict=True)
    x = catalog.inputs(name)
    with torch.no_grad():
        a = catalog.original_logits(adapted.eval(), x)
        b = catalog.original_logits(merged.eval(), x)
    return "yes" if torch.allclose(a, b, atol=1e-4) else f"no ({(a - b).abs().max():.1e})"


def _layer_linears(name: str) -> list[str]:
    """The names of the ``nn.Linear`` modules inside the layer stack of row ``name``."""
    import hf_catalog as catalog
    from splitfl.models.hf_stack import find_stack

    model = catalog.build(name, classes=2)
    stack = find_stack(model)
    return sorted(
        {
            path.rsplit(".", 1)[-1]
            for path, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and path.startswith(f"{stack}.")
        }
    )


def _refused(tmp: Path) -> list[dict]:
    """The refused models and the one line each is refused with."""
    import transformers as tf

    import hf_catalog as catalog
    import splitfl
    from splitfl.config import ConfigError
    from splitfl.models.hf import probe_inputs
    from splitfl.models.hf_stack import Unsplittable, split_stack

    rows = []
    for model_type, (architecture, overrides) in catalog.REFUSED.items():
        config = tf.AutoConfig.for_model(model_type, **overrides)
        config.architectures = [architecture]
        config.save_pretrained(tmp / model_type)
        try:
            splitfl.validate({"model": f"hf-config:{tmp / model_type}"})
            reason = "accepted (unexpected)"
        except ConfigError as err:
            reason = str(err).split(": ", 2)[2]
        rows.append({"family": model_type, "task": architecture, "refused": reason})
    config = catalog.build_config("deberta-v2")
    config.relative_attention, config.pos_att_type = True, ["p2c", "c2p"]
    model = tf.AutoModelForSequenceClassification.from_config(config)
    try:
        split_stack(model, probe_inputs(model, "text"), "text")
    except Unsplittable as err:
        family = "deberta-v2 (relative_attention, full fine-tuning)"
        rows.append({"family": family, "task": "cls", "refused": err})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--only", nargs="*", help="rows of hf_catalog.ARCHITECTURES")
    args = p.parse_args()
    sys.path.insert(0, str(TESTS))
    warnings.filterwarnings("ignore")
    import transformers as tf

    import hf_catalog as catalog
    from splitfl.models.hf import hf_block_model

    rows = []
    for name in args.only or sorted(catalog.ARCHITECTURES):
        model_type, task, _ = catalog.ARCHITECTURES[name]
        with tempfile.TemporaryDirectory() as tmp:
            folder = catalog.save(name, Path(tmp) / "m", classes=2)
            cuts = hf_block_model(f"hf-config:{folder}", 2).cut_points
            trains, loads = _trains(name, Path(tmp) / "t")
            (Path(tmp) / "l").mkdir()
            try:
                lora = _lora_loads(name, Path(tmp) / "l")
            except Exception as err:  # a row of the table, not a crash of the script
                lora = f"no: {type(err).__name__}: {str(err).splitlines()[0][:80]}"
        rows.append(
            {
                "family": model_type,
                "task": task,
                "cut points": f"{cuts[0]}..{cuts[-1]}",
                "equal float64 train/eval, eager/SDPA": _equal(name),
                "trains a round": trains,
                "model.pt loads strictly": loads,
                "LoRA adapter loads": lora,
            }
        )
        print(f"{name}: done", file=sys.stderr)
    refused = _refused(Path(tempfile.mkdtemp()))
    print(f"transformers {tf.__version__}, torch {torch.__version__}\n")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print("\n| refused | task class | why (the one line) |\n|---|---|---|")
    for r in refused:
        print(f"| {r['family']} | {r['task']} | {r['refused']} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "refused": refused}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
