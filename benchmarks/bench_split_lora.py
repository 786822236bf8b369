"""Split LoRA fine-tuning in tokens per second: splitfl (one client, SplitFed V1 cut after
block 3, ``train.lora``) against a plain PyTorch + peft loop doing the same steps on the same
batches (issues 33 and 48; the goal is at most 1.2× the plain loop's time).

``--arch``: ``gpt2`` (GPT-2 small: 12 layers, 768 wide, 50,257 tokens; LoRA on ``c_attn``;
causal LM), ``llama`` (a Llama-architecture decoder: 8 layers, 512 wide, 8 heads, 32,000
tokens; LoRA on ``q_proj``/``v_proj``; causal LM) or ``bert`` (BERT-base's shape: 12 layers,
768 wide, 30,522 tokens; LoRA on ``query``/``value``; 2-class sequence classification). Random
weights; LoRA r = 8; SGD; random token ids, ``--batch`` × 64 tokens per step, ``--steps`` steps
a round; ``--attn`` ``sdpa`` or ``eager`` for both loops. splitfl's time is the round's wall
time (``metrics.jsonl``: the difference of consecutive ``wall_time`` values, so the first
round's setup is left out); splitfl evaluates only after the last round (``eval.every`` =
``--rounds``: a round's ``wall_time`` is taken before its evaluation), as the plain loop does
not evaluate; the plain loop times the same steps after one warm-up step.

    python benchmarks/bench_split_lora.py --arch llama --attn sdpa --steps 4 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import splitfl
from splitfl.data.base import ArrayDataset, DatasetBundle

SEED = 0
TOKENS = 64  # tokens per sample
#: --arch -> (model type, config fields, LoRA target modules, task)
ARCHS = {
    "gpt2": ("gpt2", {"architectures": ["GPT2LMHeadModel"]}, ["c_attn"], "causal_lm"),
    "llama": (
        "llama",
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 512,
            "intermediate_size": 1376,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "vocab_size": 32_000,
        },
        ["q_proj", "v_proj"],
        "causal_lm",
    ),
    "bert": (
        "bert",
        {"architectures": ["BertForSequenceClassification"]},
        ["query", "value"],
        "cls",
    ),
}
ARCH = "gpt2"  # set by main (the dataset callable reads it)


def token_data(n_train: int = 64, tokens: int = TOKENS) -> DatasetBundle:
    """Random token ids ``[N, 2, T]`` (mask all ones) and their next-token targets (causal
    LM) or a label in {0, 1} (classification)."""
    from transformers import AutoConfig

    model_type, fields, _, task = ARCHS[ARCH]
    vocab = AutoConfig.for_model(model_type, **fields).vocab_size
    gen = torch.Generator().manual_seed(SEED)

    def split(n: int) -> ArrayDataset:
        ids = torch.randint(0, vocab, (n, tokens), generator=gen)
        y = ids.clone() if task == "causal_lm" else ids[:, 0] % 2
        return ArrayDataset(torch.stack([ids, torch.ones_like(ids)], 1), y)

    return DatasetBundle(
        "tokens", split(n_train), split(2), vocab if task == "causal_lm" else 2, (2, tokens)
    )


def model_folder(folder: Path, arch: str) -> Path:
    from transformers import AutoConfig

    model_type, fields, _, _ = ARCHS[arch]
    AutoConfig.for_model(model_type, **fields).save_pretrained(folder)
    return folder


def splitfl_round_times(folder: Path, args) -> list[float]:
    cfg = {
        "model": f"hf-config:{folder}",
        "algorithm": "splitfed_v1",
        "rounds": args.rounds,
        "seed": SEED,
        "threads": args.threads,
        "data": {
            "dataset": "bench_split_lora:token_data",
            "num_clients": 1,
            "min_samples": 1,
            "partition": "iid",
        },
        "train": {
            "clients_per_round": 1,
            "batch_size": args.batch,
            "lr": 0.01,
            "local_steps": args.steps,
            "loss": "causal_lm" if ARCHS[args.arch][3] == "causal_lm" else "cross_entropy",
            "lora": {"r": 8, "alpha": 16, "target_modules": ARCHS[args.arch][2]},
        },
        "hf": {"attn_implementation": args.attn},
        "eval": {"metrics": ["loss"], "batch_size": 2, "every": args.rounds},
        "options": {"splitfed_v1": {"cut": 3}},
        "output": {"progress": False, "checkpoint_every": 10**6},
        "import_dirs": [str(Path(__file__).parent)],
    }
    with tempfile.TemporaryDirectory() as tmp:
        rows = splitfl.run(cfg, run_dir=Path(tmp) / "run", progress=False).metrics
    walls = [r["wall_time"] for r in rows]
    return [b - a for a, b in zip(walls, walls[1:], strict=False)]


def plain_round_times(folder: Path, args) -> list[float]:
    import peft
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    _, _, targets, task = ARCHS[args.arch]
    causal = task == "causal_lm"
    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    torch.manual_seed(SEED)
    config = AutoConfig.from_pretrained(folder)
    config.use_cache = False
    model = auto.from_config(config, attn_implementation=args.attn)
    kind = "CAUSAL_LM" if causal else "SEQ_CLS"
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type=kind)
    model = peft.get_peft_model(model, lora).train()
    train = token_data().train
    x, y = train.x, train.y
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)

    def step(i: int) -> None:
        rows = slice((i * args.batch) % len(x), (i * args.batch) % len(x) + args.batch)
        out = model(input_ids=x[rows, 0], attention_mask=x[rows, 1], labels=y[rows])
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    step(0)  # warm-up
    times = []
    for _ in range(args.rounds - 1):
        t0 = time.perf_counter()
        for i in range(args.steps):
            step(i)
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--arch", choices=sorted(ARCHS), default="gpt2")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_split_lora  # the module splitfl imports the dataset from (not __main__)

    global ARCH
    ARCH = bench_split_lora.ARCH = args.arch
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(Path(tmp) / args.arch, args.arch)
        plain = plain_round_times(folder, args)
        print(f"plain: {plain}", file=sys.stderr)
        ours = splitfl_round_times(folder, args)
    tokens = args.steps * args.batch * TOKENS
    result = {
        "tokens_per_round": tokens,
        "splitfl_s": ours,
        "plain_s": plain,
        "splitfl_tokens_per_s": tokens / statistics.median(ours),
        "plain_tokens_per_s": tokens / statistics.median(plain),
        "ratio": statistics.median(ours) / statistics.median(plain),
        # the fastest round of each: less disturbed by other work on a shared machine
        "ratio_fastest": min(ours) / min(plain),
        "arch": args.arch,
        "attn": args.attn,
        "torch": torch.__version__,
        "threads": args.threads,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
