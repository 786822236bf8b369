"""The papers' time/traffic setups at their model sizes, for ``timing_tables.py``.

Each :class:`Setup` is one paper claim's workload: a base config (``executor: timing``,
``data.train_samples`` = the paper's training-set size, so no image is read), the algorithms
compared, variants (heterogeneity settings, D2D rates) and the figures the paper prints.
Every value that the paper states is cited; the rest says where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MBPS = 1e6 / 8  # bytes/s per Mb/s

#: The variant of IMAGE-100 at the size MergeSFL's printed model sizes imply (issue 50 item 4).
IMAGE100_144 = {"data.dataset": "image100_144"}
#: LocFedMix-SL as the MergeSFL and ParallelSFL papers describe the baseline they ran: the PS
#: "sends the corresponding gradients back to the workers in sequence" (MergeSFL §II-B); the
#: local loss alone is a row of its own (``LOCFEDMIX_LOCAL``; issue 50 item 2).
LOCFEDMIX_CITED = {"device_update": "local+server"}
LOCFEDMIX_LOCAL = {
    "locfedmix_sl (local loss only)": (
        "locfedmix_sl",
        {"options.locfedmix_sl.device_update": "local"},
    )
}


@dataclass
class Setup:
    name: str
    title: str
    base: dict[str, Any]
    algorithms: list[str]
    #: variant label -> dotted overrides
    variants: dict[str, dict[str, Any]] = field(default_factory=lambda: {"": {}})
    #: the algorithm the paper's ratios are taken against (ours / theirs)
    reference: str = ""
    #: rounds at the start that are not steady state (S²FL's warm-up over every device)
    warmup: int = 0
    #: more rows: label -> (algorithm, dotted overrides), e.g. an option the paper leaves open
    extra: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _timing(**fields: Any) -> dict[str, Any]:
    """Common fields of a timing run (no progress bar, no intermediate checkpoints)."""
    return {
        "executor": "timing",
        "seed": 0,
        "output": {"progress": False, "checkpoint_every": 10**6},
        **fields,
    }


def _jetson_alexnet(options: dict[str, Any]) -> dict[str, Any]:
    """MergeSFL §V-A / ParallelSFL §5.1 (shared testbed): AlexNet on CIFAR-10 (50,000), 80
    Jetson workers, IID, batch 64, lr 0.1 × 0.993 per round (floor 0.005, the authors' code),
    30 local iterations, 10 workers per round for the baselines; 60 rounds = three of the
    testbed's 20-round mode periods (the papers train 250)."""
    return _jetson("alexnet", "cifar10", 50_000, options, rounds=60, local_steps=30)


def _jetson(
    model: str, dataset: str, samples: int, options: dict[str, Any], rounds: int, **train: Any
) -> dict[str, Any]:
    """A timing run on the jetson80 testbed: 80 workers, IID, batch 64, lr 0.1 × 0.993 per
    round (floor 0.005), 10 workers per round for the baselines; ``train`` overrides."""
    return _timing(
        model=model,
        rounds=rounds,
        data={
            "dataset": dataset,
            "train_samples": samples,
            "partition": "iid",
            "num_clients": 80,
            "min_samples": 10,
        },
        devices={"preset": "jetson80"},
        train={
            "clients_per_round": 10,
            "batch_size": 64,
            "lr": 0.1,
            "lr_decay": 0.993,
            "lr_min": 0.005,
            **train,
        },
        options=options,
    )


#: S²FL §5.1 / Table 3: VGG-16 on CIFAR-10 (50,000 training images), 100 devices, 10 per
#: round, batch 128, lr 0.01, Table 1 devices (server 5e10 FLOPS, 1e7 B/s). The Dirichlet
#: cap N/n and ≥ 10 samples per client follow the authors' FedMR code (public facts).
S2FL = Setup(
    name="s2fl-table3",
    title="S²FL Table 3: VGG-16, CIFAR-10, 100 devices (10 per round)",
    base=_timing(
        model="vgg16_cifar",
        rounds=50,
        data={
            "dataset": "cifar10",
            "train_samples": 50_000,
            "partition": "dirichlet",
            "alpha": 0.5,
            "dirichlet_cap": True,
            "num_clients": 100,
            "min_samples": 10,
        },
        devices={"preset": "s2fl_table1"},
        train={"clients_per_round": 10, "batch_size": 128, "lr": 0.01, "local_epochs": 1},
    ),
    algorithms=["fedavg", "splitfed_v1", "s2fl"],
    variants={
        "a=0.1": {"data.alpha": 0.1},
        "a=0.5": {"data.alpha": 0.5},
        "a=1.0": {"data.alpha": 1.0},
        "IID": {"data.partition": "iid"},
        # issue 50 item 9: §5.1's server rate 1e7 B/s shared by the round's transfers (a
        # reading: Eq. (1) charges each device its own R)
        "a=0.5, server 1e7 B/s shared": {"data.alpha": 0.5, "devices.contention": True},
    },
    reference="s2fl",
    warmup=3,
    extra={
        "s2fl (warm-up: selected only)": ("s2fl", {"options.s2fl.warmup_all_devices": False}),
        # issue 50 item 3: every device's warm-up update aggregated (the default: timed only)
        "s2fl (warmup_training: aggregate)": (
            "s2fl",
            {"options.s2fl.warmup_training": "aggregate"},
        ),
        # a sensitivity: Eq. (1) has no per-iteration group barrier (issue 32 item 3)
        "s2fl (lock-step barrier)": ("s2fl", {"options.s2fl.lockstep_barrier": True}),
        # a sensitivity: Table 1's devices are static; the S²FL configs used 0.3 until issue 32
        "s2fl (devices.variation 0.3, period 5)": (
            "s2fl",
            {"devices.variation": 0.3, "devices.variation_period": 5},
        ),
    },
    notes=[
        "VGG-16 = `vgg16_cifar` (the S²FL authors' FedMR VGG-16-BN: 16 blocks, 134.6 MB, cuts "
        "4/7/10; SFL = cut 10 = Wc3); the paper prints no size (Fig. 3 only).",
        "Rounds 1-3 are S²FL's warm-up (every device on cut r, `warmup_all_devices: true`, "
        "the default; the last row warms up only the round's 10 devices); per-round means are "
        "over the rounds after the warm-up for every algorithm, the warm-up is listed apart.",
        "Traffic in MB = 10^6 bytes, up and down, every link.",
    ],
)

#: Table 3: (time s, traffic MB) to the target accuracy, per heterogeneity setting.
S2FL_TABLE3 = {
    "a=0.1": {
        "40%": {"fedavg": (21299, 29936), "splitfed_v1": (13763, 12224), "s2fl": (8471, 11372)},
        "50%": {"fedavg": (41436, 61083), "splitfed_v1": (35294, 32999), "s2fl": (19471, 27599)},
    },
    "a=0.5": {
        "50%": {"fedavg": (8162, 19655), "splitfed_v1": (7612, 11958), "s2fl": (2338, 5142)},
        "60%": {"fedavg": (21320, 51104), "splitfed_v1": (16022, 25300), "s2fl": (4524, 9826)},
    },
    "a=1.0": {
        "55%": {"fedavg": (10498, 24191), "splitfed_v1": (9329, 14378), "s2fl": (2908, 6381)},
        "60%": {"fedavg": (15162, 34472), "splitfed_v1": (10058, 15423), "s2fl": (3921, 8512)},
    },
    "IID": {
        "60%": {"fedavg": (10614, 26913), "splitfed_v1": (8963, 15423), "s2fl": (2952, 6823)},
        "65%": {"fedavg": (16020, 40520), "splitfed_v1": (13422, 23047), "s2fl": (3967, 9151)},
    },
}

#: MergeSFL §V-A: AlexNet (8 layers, 136 MB) on CIFAR-10, 80 Jetson workers, split after the
#: 5th layer, τ = 30, lr 0.1 × 0.993 per round; batch D = 64 and 10 workers per round for the
#: baselines from the authors' code (public facts); IID data (Fig. 6(c), Fig. 8(c)). 60 rounds
#: = three of the testbed's 20-round mode periods (the paper trains 250).
MERGESFL = Setup(
    name="mergesfl-alexnet",
    title="MergeSFL Fig. 6(c)/8(c): AlexNet, CIFAR-10, 80 Jetson workers, IID",
    base=_jetson_alexnet(
        {
            "mergesfl": {"tau": 30, "cut": 5},
            "locfedmix_sl": {"tau": 30, "cut": 5, **LOCFEDMIX_CITED},
        },
    ),
    algorithms=["mergesfl", "pyramidfl", "locfedmix_sl", "fedavg"],
    reference="mergesfl",
    extra=LOCFEDMIX_LOCAL,
    notes=[
        "PyramidFL selects by training loss: under `executor: timing` every loss is 1.0 "
        "(utility ∝ |D_i|, `splitfl list`).",
    ],
)
#: Fig. 6(c) completion-time reduction (to the common target, IID) and Fig. 8(c) average
#: waiting-time reduction of MergeSFL against each baseline.
MERGESFL_CLAIMS = {
    "pyramidfl": {"time_reduction": 0.39, "waiting_reduction": 0.73},
    "locfedmix_sl": {"time_reduction": 0.54, "waiting_reduction": 0.84},
    "fedavg": {"time_reduction": 0.69, "waiting_reduction": 0.86},
}

#: ParallelSFL §5.1: AlexNet on CIFAR-10, 80 Jetson workers, batch 64, lr 0.1 × 0.993, split
#: after the 5th layer; τ = 30 (splitfl's default, the paper gives none for AlexNet); the
#: baselines select 10 workers per round (as the repository's ParallelSFL configs); 60 rounds
#: as MergeSFL's setup.
PARALLELSFL = Setup(
    name="parallelsfl-alexnet",
    title="ParallelSFL Fig. 4(b)/6(b)/7(b)/9: AlexNet, CIFAR-10, 80 Jetson workers, IID",
    base=_jetson_alexnet(
        {
            "parallelsfl": {"tau": 30, "cut": 5},
            "adasfl": {"tau": 30, "cut": 5},
            "locfedmix_sl": {"tau": 30, "cut": 5, **LOCFEDMIX_CITED},
            # the cluster choice does not change time or traffic; fewer samples, faster
            "ifca": {"estimate_samples": 2},
        },
    ),
    algorithms=[
        "parallelsfl",
        "parallelsfl-WC",
        "parallelsfl-R",
        "adasfl",
        "adasampling",
        "locfedmix_sl",
        "ifca",
    ],
    reference="parallelsfl",
    extra=LOCFEDMIX_LOCAL,
    notes=[
        "AdaSampling samples by gradient norms: under `executor: timing` G_i = 1 for every "
        "client, q_i ∝ p_i/√t_i (`splitfl list`). IFCA's cluster choice (by the untrained "
        "models' losses) does not change its time or traffic.",
    ],
)
#: Fig. 4(b) speed-up to the target (IID), Fig. 7(b) waiting-time reduction, Fig. 6(b)
#: traffic saved to 81 % (MB), Fig. 9 ablations (speed-up over WC; WC's time reduction vs R).
PARALLELSFL_CLAIMS = {
    "adasfl": {"speedup": 1.36, "traffic_saved_mb": 3012},
    "adasampling": {"speedup": 1.65, "waiting_reduction": 0.53, "traffic_saved_mb": 20018},
    "locfedmix_sl": {"speedup": 2.18, "waiting_reduction": 0.67, "traffic_saved_mb": 9116},
    "ifca": {"speedup": 2.87, "waiting_reduction": 0.62, "traffic_saved_mb": 17564},
    "parallelsfl-WC": {"speedup": 1.56},
}

#: RingSFL §4.1.1/§4.2.3–4.2.4: ResNet-18 on CIFAR-10 (50,000), 5 clients (2 PCs, 3 Raspberry
#: Pis), IID, batch 64, 2 local epochs, lengths 4:3:1:1:1, client-server links 135 Mb/s, D2D
#: 135/40/15/10/5 Mb/s (Fig. 11–12). Vanilla SL's round = E·B updates in all (§4.1.3).
RINGSFL = Setup(
    name="ringsfl-resnet18",
    title="RingSFL Fig. 12-13: ResNet-18, CIFAR-10, 5 clients (2 PCs, 3 Raspberry Pis)",
    base=_timing(
        model="resnet18",
        rounds=2,
        data={
            "dataset": "cifar10",
            "train_samples": 50_000,
            "partition": "iid",
            "num_clients": 5,
            "min_samples": 10,
        },
        devices={"preset": "ringsfl_testbed"},
        train={"clients_per_round": 5, "batch_size": 64, "lr": 0.1, "local_epochs": 2},
        options={
            "ringsfl": {"prop_lens": "4:3:1:1:1"},
            "vanilla_sl": {"round_steps": "shared", "cut": 2},
        },
    ),
    algorithms=["ringsfl", "fedavg", "splitfed_ringsfl", "vanilla_sl"],
    variants={f"D2D {m} Mb/s": {"devices.d2d_rate": m * MBPS} for m in (135, 40, 15, 10, 5)},
    reference="ringsfl",
    notes=[
        "The D2D rate changes only the ring's hops: FedAvg, SplitFed and vanilla SL use the "
        "135 Mb/s client-server links in every variant.",
        "SplitFed = `splitfed_ringsfl` (the RingSFL authors' SplitFed: one shared server "
        "model, gradients scaled 1/N); it and vanilla SL split after block 2 of 10 (the "
        "authors' code, `ShenJinglong/StalRingSFL`: splitfed cut 2; public facts).",
    ],
)
#: Fig. 11–13 statements: RingSFL converges faster than vanilla FL at D2D ≥ 10 Mb/s and
#: slower at ≤ 5 Mb/s (Fig. 12: time per round); Fig. 13: 61.6 % less time per round than
#: vanilla FL at 135 Mb/s; SplitFed and vanilla SL take less time per round than RingSFL.
RINGSFL_CLAIMS = {"fl_time_reduction": 0.616, "crossover_mbps": (5, 10)}


def _jetson_workload(model: str, dataset: str, samples: int, cut: int, tau: int, **train):
    """The jetson80 testbed on another of the papers' workloads: the paper's split layer and τ
    for every split algorithm; 40 rounds (two 20-round mode periods)."""
    split = {"tau": tau, "cut": cut}
    names = ("mergesfl", "locfedmix_sl", "parallelsfl", "adasfl")
    options = {name: dict(split) for name in names} | {"ifca": {"estimate_samples": 2}}
    options["locfedmix_sl"] |= LOCFEDMIX_CITED
    return _jetson(model, dataset, samples, options, rounds=40, local_steps=tau, **train)


def _mergesfl_workload(model: str, dataset: str, samples: int, cut: int, tau: int) -> dict:
    """Overrides of ``MERGESFL_MORE``'s base for another workload (lr decay 0.993)."""
    split = {
        f"options.{a}.{k}": v
        for a in ("mergesfl", "locfedmix_sl")
        for k, v in (("cut", cut), ("tau", tau))
    }
    return {
        "model": model,
        "data.dataset": dataset,
        "data.train_samples": samples,
        "train.lr_decay": 0.993,
        "train.local_steps": tau,
        **split,
    }


_MERGESFL_BASELINES = ["mergesfl", "pyramidfl", "locfedmix_sl", "fedavg"]
_PARALLELSFL_BASELINES = ["parallelsfl", "adasfl", "adasampling", "locfedmix_sl", "ifca"]
_IMAGE100_NOTE = (
    "IMAGE-100 = `image100`: shape only (3×64×64, 100 classes, MergeSFL §V-A); 128,117 "
    "training samples = 100/1,000 of ImageNet's 1,281,167 (an estimate: neither paper gives "
    'the size). `vgg16_image100` at 64×64 is 161 MB (153.8 MiB); the papers print "about '
    '321MB" for their VGG16, bottom model "about 56MB" and features "3MB" at batch 64: '
    "the sizes at 3×144×144 (`image100_144`, the authors' code: 321.8 MiB, 56.2 MiB, 3.3 MB), "
    "the variant the paper's 1.74–4.14× is judged on (issue 50 item 4)."
)

#: Issue 32 item 9: the papers' other workloads, timed per round (their to-target figures need
#: training). MergeSFL §V-A: CNN-H/HAR (7,352 training samples; split at the 3rd layer, τ = 10,
#: lr decay 0.98), CNN-S/Speech (85,511; 4th layer, τ = 30), VGG-16/IMAGE-100 (13th layer,
#: τ = 40). "we separately split the CNN-H, CNN-S, AlexNet, and VGG16 at the 3rd, 4th, 5th,
#: and 13th layer" (the released code splits CNN-H after its 2nd and CNN-S after its 3rd).
MERGESFL_MORE = Setup(
    name="mergesfl-more",
    title="MergeSFL Fig. 6/8 (a), (b), (d): CNN-H/HAR, CNN-S/Speech, VGG-16/IMAGE-100",
    base=_jetson_workload("cnn_h", "har", 7352, 3, 10, lr_decay=0.98),
    algorithms=_MERGESFL_BASELINES,
    variants={
        "CNN-H / HAR": {},
        "CNN-S / Speech": _mergesfl_workload("cnn_s", "speech_commands", 85_511, 4, 30),
        "VGG-16 / IMAGE-100": _mergesfl_workload("vgg16_image100", "image100", 128_117, 13, 40),
        "VGG-16 / IMAGE-100 at 144×144": {
            **_mergesfl_workload("vgg16_image100", "image100", 128_117, 13, 40),
            **IMAGE100_144,
        },
    },
    reference="mergesfl",
    notes=[_IMAGE100_NOTE, "Speech Commands = `speech_commands` shape (1×16000, 35 classes)."],
)

_PARALLELSFL_VGG = {
    "model": "vgg16_image100",
    "data.dataset": "image100",
    "data.train_samples": 128_117,
    **{f"options.{a}.cut": 13 for a in ("parallelsfl", "adasfl", "locfedmix_sl")},
}

#: ParallelSFL §5.1: CNN/Speech (split at the 4th layer) and VGG16/IMAGE-100 (13th); τ = 30
#: (splitfl's default: the paper gives none); "we separately split the CNN, AlexNet, VGG16, and
#: RoBERTa at the 4th, 5th, 13th, and 3rd layer". RoBERTa/QNLI follows issue 33.
PARALLELSFL_MORE = Setup(
    name="parallelsfl-more",
    title="ParallelSFL Fig. 4/6/7 (a), (c): CNN/Speech, VGG-16/IMAGE-100",
    base=_jetson_workload("cnn_s", "speech_commands", 85_511, 4, 30),
    algorithms=_PARALLELSFL_BASELINES,
    variants={
        "CNN / Speech": {},
        "VGG-16 / IMAGE-100": _PARALLELSFL_VGG,
        "VGG-16 / IMAGE-100 at 144×144": {**_PARALLELSFL_VGG, **IMAGE100_144},
    },
    reference="parallelsfl",
    notes=[_IMAGE100_NOTE],
)

#: ParallelSFL §5.1/§5.2: RoBERTa on QNLI (104,743 training pairs), "split at the 3rd layer",
#: batch 16, lr 0.001 without decay; τ = 30 (the paper gives none); 10 timing rounds (the paper
#: trains 100). The model is `roberta-base`'s architecture with random weights
#: (`papers/parallelsfl/roberta-base/config.json`, 124.6M parameters: the paper's "501 MB");
#: pairs of 128 tokens (`qnli_tokens`: the paper gives no length).
PARALLELSFL_ROBERTA = Setup(
    name="parallelsfl-roberta",
    title="ParallelSFL Fig. 4(d)/5(d): RoBERTa, QNLI, 80 Jetson workers, IID",
    base=_jetson(
        "hf-config:" + str(Path(__file__).resolve().parent / "parallelsfl" / "roberta-base"),
        "qnli_tokens",
        104_743,
        {
            "parallelsfl": {"tau": 30, "cut": 3},
            "adasfl": {"tau": 30, "cut": 3},
            "locfedmix_sl": {"tau": 30, "cut": 3, **LOCFEDMIX_CITED},
            "ifca": {"estimate_samples": 2},
        },
        rounds=10,
        batch_size=16,
        lr=0.001,
        lr_decay=1.0,
        lr_min=0.0,
        local_steps=30,
    ),
    algorithms=_PARALLELSFL_BASELINES,
    reference="parallelsfl",
    notes=[
        "Fig. 5(d) (non-IID): ParallelSFL reaches 90.11 % in 11,445 s; AdaSFL, AdaSampling, "
        "LocFedMix-SL and IFCA take 14,293, 17,306, 23,403 and 30,724 s to reach their (lower) "
        "accuracies. One download of the 501 MB model takes 134 s at 30 Mb/s and 4,008 s at "
        "1 Mb/s, the testbed's link range.",
    ],
)

#: S²FL §5.3 Fig. 5-7 (training curves on CIFAR-10/VGG-16): devices per round x = 5, 10, 15,
#: 20 (IID); compositions conf 1 = 5:3:2 and conf 2 = 2:3:5 (IID); client-set size |C| = 20,
#: 50, 100, 150 at sampling rate 0.1 (a = 0.5). 20 rounds after S²FL's 3 warm-up rounds.
S2FL_FIGURES = Setup(
    name="s2fl-fig5-7",
    title="S²FL Fig. 5-7: devices per round, device composition, client-set size (VGG-16)",
    base={**S2FL.base, "rounds": 23},
    algorithms=["fedavg", "splitfed_v1", "s2fl"],
    variants={
        **{
            f"Fig. 5: x = {x}": {"data.partition": "iid", "train.clients_per_round": x}
            for x in (5, 10, 15, 20)
        },
        "Fig. 6: conf 1 (5:3:2)": {"data.partition": "iid", "devices.composition": "5:3:2"},
        "Fig. 6: conf 2 (2:3:5)": {"data.partition": "iid", "devices.composition": "2:3:5"},
        **{
            f"Fig. 7: |C| = {n}": {
                "data.alpha": 0.5,
                "data.num_clients": n,
                "train.clients_per_round": max(1, n // 10),
            }
            for n in (20, 50, 100, 150)
        },
    },
    reference="s2fl",
    warmup=3,
)

#: Issue 32 items 1, 2 and 6: the jetson80 clock's modelling choices that no paper prints,
#: one at a time against the preset's defaults (PS link 200 Mb/s shared, bandwidth AR(1)
#: ρ = 0.9; ``splitfl.system.jetson``), and MergeSFL's two readings of Eq. (10). 40 rounds
#: (two mode periods) of the MergeSFL/ParallelSFL AlexNet setup.
JETSON_SENSITIVITY = Setup(
    name="jetson-sensitivity",
    title="jetson80 sensitivity: PS link, bandwidth correlation, MergeSFL's Eq. (10) reading",
    base={
        **_jetson_alexnet(
            {
                "mergesfl": {"tau": 30, "cut": 5},
                "locfedmix_sl": {"tau": 30, "cut": 5, **LOCFEDMIX_CITED},
                "parallelsfl": {"tau": 30, "cut": 5},
                "adasfl": {"tau": 30, "cut": 5},
            }
        ),
        "rounds": 40,
    },
    algorithms=["mergesfl", "locfedmix_sl", "parallelsfl", "adasfl"],
    variants={
        "defaults (PS 200 Mb/s, ρ = 0.9)": {},
        "PS 50 Mb/s": {"devices.server_rate": 50 * MBPS},
        "PS 100 Mb/s": {"devices.server_rate": 100 * MBPS},
        "PS 400 Mb/s": {"devices.server_rate": 400 * MBPS},
        "PS 1000 Mb/s": {"devices.server_rate": 1000 * MBPS},
        "PS link not shared": {"devices.contention": False},
        "ρ = 0 (independent redraws)": {"devices.bandwidth_correlation": 0.0},
        "ρ = 0.5": {"devices.bandwidth_correlation": 0.5},
        "ρ = 1 (held for the run)": {"devices.bandwidth_correlation": 1.0},
        # issue 50 item 1: the workers' absolute speeds (MergeSFL Table II prints peaks only)
        "device FLOP/s ×0.25": {"devices.flops_scale": 0.25},
        "device FLOP/s ×4": {"devices.flops_scale": 4.0},
    },
    extra={
        **LOCFEDMIX_LOCAL,
        "mergesfl (budget time on the shared link)": (
            "mergesfl",
            {"options.mergesfl.budget_time": "shared"},
        ),
        "mergesfl (KL-only GA)": ("mergesfl", {"options.mergesfl.fill_budget": False}),
    },
    reference="mergesfl",
)

SETUPS = {
    s.name: s
    for s in (
        S2FL,
        MERGESFL,
        PARALLELSFL,
        RINGSFL,
        JETSON_SENSITIVITY,
        MERGESFL_MORE,
        PARALLELSFL_MORE,
        S2FL_FIGURES,
        PARALLELSFL_ROBERTA,
    )
}
