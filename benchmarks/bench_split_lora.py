"""Split LoRA fine-tuning of GPT-2 small in tokens per second: splitfl (one client, SplitFed V1
cut after block 3, ``train.lora``) against a plain PyTorch + peft loop doing the same steps on
the same batches (issue 33's benchmark; the goal is at most 1.2× the plain loop's time).

GPT-2 small's architecture (12 layers, 768 wide, 50,257 tokens) with random weights; LoRA
r = 8 on ``c_attn``; SGD; random token ids, ``--batch`` × 64 tokens per step, ``--steps``
steps a round. splitfl's time is the round's wall time (``metrics.jsonl``: the difference of
consecutive ``wall_time`` values, so the first round's setup is left out), evaluation on two
test samples included; the plain loop times the same steps after one warm-up step.

    python benchmarks/bench_split_lora.py --steps 8 --rounds 3 --json benchmarks/results/x.json
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

VOCAB = 50_257
SEED = 0
TOKENS = 64  # tokens per sample


def token_data(n_train: int = 64, tokens: int = TOKENS) -> DatasetBundle:
    """Random token ids ``[N, 2, T]`` (mask all ones) and their next-token targets."""
    gen = torch.Generator().manual_seed(SEED)

    def split(n: int) -> ArrayDataset:
        ids = torch.randint(0, VOCAB, (n, tokens), generator=gen)
        return ArrayDataset(torch.stack([ids, torch.ones_like(ids)], 1), ids.clone())

    return DatasetBundle("tokens", split(n_train), split(2), VOCAB, (2, tokens))


def gpt2_small(folder: Path) -> Path:
    from transformers import GPT2Config

    GPT2Config(architectures=["GPT2LMHeadModel"]).save_pretrained(folder)
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
            "loss": "causal_lm",
            "lora": {"r": 8, "alpha": 16, "target_modules": ["c_attn"]},
        },
        "eval": {"metrics": ["loss"], "batch_size": 2},
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
    from transformers import AutoConfig, GPT2LMHeadModel

    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(AutoConfig.from_pretrained(folder))
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], task_type="CAUSAL_LM")
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
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).parent))
    with tempfile.TemporaryDirectory() as tmp:
        folder = gpt2_small(Path(tmp) / "gpt2")
        ours = splitfl_round_times(folder, args)
        plain = plain_round_times(folder, args)
    tokens = args.steps * args.batch * TOKENS
    result = {
        "tokens_per_round": tokens,
        "splitfl_s": ours,
        "plain_s": plain,
        "splitfl_tokens_per_s": tokens / statistics.median(ours),
        "plain_tokens_per_s": tokens / statistics.median(plain),
        "ratio": statistics.median(ours) / statistics.median(plain),
        "torch": torch.__version__,
        "threads": args.threads,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
