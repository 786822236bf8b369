"""The config schema: frozen dataclasses, one per section, and :class:`ConfigError`.

Over 400 lines because the schema is one piece: each section's dataclass carries its fields'
documentation (the generated reference, ``docs/reference/config.md``, is read from it); the
``network`` section lives in :mod:`splitfl.config.network`, its checks in ``checks.py`` and
``ranges.py``; the ``privacy`` section in :mod:`splitfl.config.privacy`, with its checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from splitfl.config.network import NetworkConfig
from splitfl.config.privacy import PrivacyConfig


class ConfigError(ValueError):
    """A config value is invalid. ``str(err)`` is one line: ``<field>: <what is allowed>``."""

    def __init__(self, field_path: str, message: str):
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path


@dataclass(frozen=True)
class DataConfig:
    """Dataset and partition. ``alpha`` is the Dirichlet concentration (S²FL's ``a``,
    MergeSFL's ``δ``); ``p = 1/δ`` may be given instead (``p = 0`` means IID).
    ``dirichlet_cap`` stops dealing to clients that hold ``N/num_clients`` samples already
    (NIID-Bench/FedMR rule; needed for small alpha with many small clients).
    ``verify`` compares standard files (MNIST, Fashion-MNIST, CIFAR-10/100) holding the canonical
    number of samples with their published MD5s: ``warn`` (one line naming the file), ``strict``
    (an error) or ``off``. ``train_samples`` (``executor: timing`` only): partition a
    class-balanced label vector of that many training samples instead of the dataset's labels,
    and read none of its files (e.g. 50000 for CIFAR-10 at paper scale); null reads the
    dataset.
    Data the user brings (``splitfl.data.formats``): ``format`` (null, ``image_folder``,
    ``npz``, ``npy``, ``csv``, ``hf``, ``parquet``, ``text``) reads that container under
    ``root``, and ``dataset`` then names the data; ``label_column`` (CSV, Hugging Face,
    text); ``image_size`` ``[H, W]`` resizes images (null: all must have the first image's
    size); ``lazy``: read inputs when a batch needs them (true), all at load (false), or
    null = lazy above 1 GiB.
    ``transforms``: ``random_crop: P``, ``hflip``, ``normalize: {mean, std}``
    (``splitfl.data.transforms``). ``partition: folders``: each ``root/clients/<id>`` is
    one client. A relative ``root`` is looked for as ``imports:`` are: in the current
    directory, then in the config file's folder (there, it is recorded as that absolute path).
    """

    dataset: str = "digits"
    root: str | None = None
    partition: str = "dirichlet"
    alpha: float | None = 0.5
    p: float | None = None
    dirichlet_cap: bool = False
    classes_per_client: int = 2
    num_clients: int = 20
    min_samples: int = 10
    verify: str = "warn"
    train_samples: int | None = None
    #: Where the clients' training data is: ``partition`` (one dataset, the seeded partition
    #: above; simulation and ``splitfl launch``) or ``devices`` (``executor: networked``: each
    #: device trains on its own files, ``splitfl device --data``, and announces its clients'
    #: sample counts and label histograms at join; the server reads only a test set).
    source: str = "partition"
    #: ``source: devices``: the server's test set in ``format`` (npz when null): a file (an
    #: .npz with ``x``, ``y``, optionally ``num_classes``) or a folder holding the container's
    #: test split, see ``splitfl.data.local.load_test``; null = the test split of ``dataset``.
    test_path: str | None = None
    format: str | None = None
    label_column: str = "label"
    #: What the labels are: ``classes`` (integer labels or class names) or ``values``
    #: (numbers read as float32 targets: regression, multi-hot); null = ``values`` under
    #: ``train.loss`` mse/bce_logits, else ``classes`` (resolved before the run starts).
    targets: str | None = None
    image_size: list[int] | None = None
    lazy: bool | None = None
    transforms: list[Any] = field(default_factory=list)
    #: ``format: text`` (``splitfl.data.formats.text``): the text column, or the two columns
    #: of a pair (e.g. ``[question, sentence]``); the tokenizer's folder (null: the folder of
    #: ``model: hf:``/``hf-config:``); tokens per sample after truncation and padding.
    text_columns: list[str] | None = None
    tokenizer: str | None = None
    max_length: int = 128
    #: ``format: text`` targets: ``label`` (``label_column``, classification) or
    #: ``next_token`` (the text's own tokens, padding ignored: ``train.loss: causal_lm``).
    text_target: str = "label"


@dataclass(frozen=True)
class DevicesConfig:
    """Device population: a preset, its High:Mid:Low composition, seeded time jitter.

    ``variation``: σ of per-client log-normal factors on FLOPS and on link rates, redrawn every
    ``variation_period`` rounds (time-varying devices; 0 = static profiles).
    ``contention``: participants' concurrent transfers share the server's link (and a top
    worker's D2D radio), see ``splitfl.system.cost``; ``false`` = S²FL Eq. (1) exactly; null
    (default) = the preset's paper model (``splitfl.system.devices.PAPER_CONTENTION``: off for
    ``s2fl_table1``, ``homogeneous``, ``ringsfl_testbed``; on for ``jetson80``), resolved when
    the run is prepared.
    ``d2d_rate``: device-to-device rate in B/s for every device (null = the preset's).
    """

    preset: str = "s2fl_table1"
    composition: str = "uniform"
    jitter: float = 0.0
    label_bytes: int = 0
    variation: float = 0.0
    variation_period: int = 1
    contention: bool | None = None
    d2d_rate: float | None = None
    #: Fixed time per message exchange between a device and the server (one per mini-batch,
    #: one per model transfer), on top of bytes / rate: serialisation, protocol and per-message
    #: latency, which S²FL Eq. 1 leaves out. 0 (the default) is Eq. 1 exactly;
    #: ``benchmarks/clock_validation.py`` measures it for a deployment.
    exchange_latency_s: float = 0.0
    #: The server's link rate in B/s, each direction (its ingress and egress, shared by the
    #: participants with ``contention``); null = the preset's (``jetson80``: 200 Mb/s, see
    #: ``splitfl.system.jetson``). Setting it gives any preset a shared server link.
    server_rate: float | None = None
    #: Round-to-round correlation ρ (0..1) of each device's bandwidth where the preset redraws
    #: it every round (``jetson80``: AR(1), see ``splitfl.system.jetson``); null = the
    #: preset's (0.9, an assumption); 0 = independent redraws.
    bandwidth_correlation: float | None = None
    #: Every device's FLOP/s multiplied by this (not the server's), in every round: 1 = the
    #: preset's. A sensitivity for presets whose absolute speeds no paper prints (``jetson80``:
    #: MergeSFL Table II gives peak figures only; ``ringsfl_testbed``: CPU names only), and
    #: what ``benchmarks/papers/mergesfl/calibrate_speeds.py`` fits (issue 50 item 1).
    flops_scale: float = 1.0


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (``train.lora``, via ``peft``) on a Hugging Face model (``model: hf:``):
    rank ``r``, scale ``alpha`` / ``r``, dropout on the adapters' input, the modules they wrap
    (null: peft's default for the model type, e.g. the attention's query and value). The base
    weights freeze; the adapters and a new task head train, and only they are counted as
    model traffic (a device holds the base weights itself)."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] | None = None


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """``train.server_optimizer``: a server-side optimiser step on every round's aggregate,
    for every algorithm that aggregates into one global model
    (:mod:`splitfl.training.server_optim`).
    ``name``: ``none`` (default: the aggregate is the next global model, as before),
    ``fedavgm`` (Hsu et al. 2019: ``momentum`` β), ``fedadam``, ``fedyogi``, ``fedadagrad``
    (Reddi et al. 2021, Algorithm 2: ``beta1``, ``beta2``, ``tau``). ``lr`` is the server
    learning rate η (null: Flower's default per variant — fedavgm 1.0, fedadam 0.1,
    fedyogi 0.01, fedadagrad 0.1). The state (m, v) is kept across rounds and checkpointed."""

    name: str = "none"
    lr: float | None = None
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3


@dataclass(frozen=True)
class DefenceConfig:
    """``train.defence``: privacy defences applied on the device, to what it sends the server
    (:mod:`splitfl.roles.defences`). Every value at its default is off (the run is the same,
    bit for bit, as without the section).

    ``nopeek`` is the weight α of the distance-correlation term ``α·DCor(X, Z)`` between a
    mini-batch's inputs and the smashed data it sends, added to the device's loss (NoPeek,
    Vepakomma et al., "NoPeek: Information leakage reduction to share activations in
    distributed deep learning", ICDMW 2020, §3; 0: off). ``noise_std`` is the standard
    deviation σ of Gaussian noise added to each smashed-data element before it leaves the
    device (0: off), after each sample's smashed data is clipped to L2 norm ``noise_clip``
    (null: no clipping, and then no privacy accounting: the sensitivity is unbounded); with a
    clip, :func:`splitfl.roles.defences.gaussian_epsilon` gives the (ε, δ) of the Gaussian
    mechanism (Mironov, "Rényi differential privacy", CSF 2017, Props. 3 and 7).

    ``dp_noise`` is DP-SGD's noise multiplier σ on the device part's training (Abadi et al.,
    "Deep Learning with Differential Privacy", CCS 2016, Alg. 1, with Opacus: each sample's
    gradient clipped to L2 norm ``dp_clip``, noise ``N(0, σ²·dp_clip²)`` on their sum;
    0: off); the metrics report each client's ε for ``δ = dp_delta`` from Opacus's RDP
    accountant (:mod:`splitfl.roles.dp_sgd`). ``label_noise`` protects the labels of a
    U-shaped run (the device holds them) by perturbing the cut-layer gradients the device
    sends the server (Li et al., "Label Leakage and Protection in Two-party Split Learning",
    ICLR 2022, §4): ``max_norm`` (each sample's gradient scaled by ``1 + N(0, σ_i²)`` so its
    expected norm is the batch's largest) or ``marvell`` (class-dependent Gaussian noise
    minimising the symmetrised KL between the classes' gradient distributions under the
    power budget ``P = marvell_s·‖ḡ₁ − ḡ₀‖²``); ``label_positive`` is the class against the
    rest (:mod:`splitfl.roles.label_defences`)."""

    nopeek: float = 0.0
    noise_std: float = 0.0
    noise_clip: float | None = None
    dp_noise: float = 0.0
    dp_clip: float = 1.0
    dp_delta: float = 1e-5
    label_noise: str = "none"
    marvell_s: float = 1.0
    label_positive: int = 1


@dataclass(frozen=True)
class TrainConfig:
    """Local training. ``local_steps`` (if set) replaces ``local_epochs`` by a fixed number of
    iterations per round. Defaults follow S²FL §5 (batch 128, SGD lr 0.01). The learning rate
    of round h is ``max(lr_min, lr * lr_decay**h)`` (MergeSFL §V-A: 0.993 per round).

    The recipe (:mod:`splitfl.training`): ``loss`` is ``cross_entropy`` (int class labels),
    ``mse`` (regression, float targets) or ``bce_logits`` (multi-label, float multi-hot
    targets ``[N, C]``); ``optimizer`` is ``sgd`` (``momentum``, ``weight_decay``), ``adam``
    or ``adamw`` (``beta1``, ``beta2``, ``eps``: torch's defaults; ``weight_decay`` is Adam's
    L2 term or AdamW's decoupled decay). Optimiser state lives for one local round (built
    afresh every round)."""

    clients_per_round: int = 10
    batch_size: int = 128
    lr: float = 0.01
    lr_decay: float = 1.0
    lr_min: float = 0.0
    momentum: float = 0.0
    weight_decay: float = 0.0
    local_epochs: int = 1
    local_steps: int | None = None
    loss: str = "cross_entropy"
    optimizer: str = "sgd"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    #: Explosion check (a divergence that never reaches NaN/inf): stop with exit code 3 when
    #: the round's training loss exceeds ``explode_factor`` × the initial model's test loss
    #: for ``explode_rounds`` rounds in a row, or exceeds it once and stays above
    #: ``explode_recovery`` × that loss for the ``explode_rounds`` rounds after (blew up and
    #: stayed broken). The papers are silent; careful defaults that the shipped configs stay
    #: far below, even with lr=1 (their training loss never exceeds the initial loss much,
    #: and a model that recovers from a spike retrains from about the initial loss); 0 or
    #: null disables (``explode_recovery``: the second test only).
    explode_factor: float | None = 100.0
    explode_rounds: int | None = 3
    explode_recovery: float | None = 10.0
    #: How the clients' copies of a layer are combined (every algorithm that averages; see
    #: ``splitfl.aggregation.robust``): ``mean`` (the papers' weighted average), ``clip_mean``
    #: (each update's distance from the global model clipped to ``clip_norm``; null = the
    #: round's median update norm), ``median`` or ``trimmed_mean`` (coordinate-wise,
    #: dropping ``trim_fraction`` of the clients at each end), ``centered_clip`` (Karimireddy
    #: et al. ICML 2021: each model's distance from the coordinate-wise median clipped to
    #: ``clip_norm``, null = the median such distance, then averaged around that centre).
    aggregation: str = "mean"
    clip_norm: float | None = None
    trim_fraction: float = 0.1
    #: LoRA fine-tuning of a Hugging Face model (null: full fine-tuning), see LoraConfig.
    lora: LoraConfig | None = None
    #: A server-side optimiser on the aggregated update (default none), see
    #: ServerOptimizerConfig.
    server_optimizer: ServerOptimizerConfig = field(default_factory=ServerOptimizerConfig)
    #: Stop at a communication budget (MiB = 2**20 bytes of ``traffic_total_cum``; null: no
    #: budget): the run ends after the first round whose cumulative traffic reaches it, as
    #: FSL-SAGE's ``comm_threshold_mb`` (repo ``src/algos/__init__.py``: ``if alg.comm_load /
    #: (1024**2) >= cfg.comm_threshold_mb: break``), for every algorithm; ``summary.json``'s
    #: status says so (``comm budget reached: ...``) and the run counts as finished.
    comm_budget_mb: float | None = None
    #: The last mini-batch of an epoch when a client's samples do not divide by the batch
    #: size (:func:`splitfl.data.partition.epoch_batch_sizes`): ``false`` keeps it (PyTorch
    #: ``DataLoader``'s default, ``drop_last=False``), ``true`` drops it (``drop_last=True``:
    #: "drop the last incomplete batch, if the dataset size is not divisible by the batch
    #: size", torch.utils.data docs), ``single`` drops it only when it holds one sample, and
    #: ``auto`` (default) is ``single`` for a model with BatchNorm layers and ``false``
    #: otherwise, resolved before the run starts (``config.yaml`` records which). Why: in
    #: training mode BatchNorm normalises by the batch's own statistics, which one sample does
    #: not have (``torch.nn.functional.batch_norm`` raises "Expected more than 1 value per
    #: channel when training" where a channel holds one value, and a one-sample batch pulls
    #: the running statistics towards a single sample elsewhere); dropping one sample per
    #: epoch costs little, dropping every incomplete batch (timm's training loader) costs up
    #: to a batch per client per epoch, much of a small federated client's data. A client
    #: with fewer samples than a batch keeps its one batch whatever the setting.
    drop_last: bool | str = "auto"
    #: Privacy defences on the device (default all off), see DefenceConfig.
    defence: DefenceConfig = field(default_factory=DefenceConfig)


@dataclass(frozen=True)
class EvalConfig:
    """Test-set evaluation every ``every`` rounds. ``metrics`` (recorded per round as
    ``test_acc``, ``test_loss``, ``test_<name>``; the test loss always): ``accuracy``,
    ``top<k>`` (e.g. ``top5``) and ``macro_f1`` for classification, ``macro_f1`` for
    ``train.loss: bce_logits``, ``mse`` for ``train.loss: mse``, ``loss`` alone for the loss
    only (:mod:`splitfl.training.scores`). ``target_accuracy`` needs ``accuracy``.

    ``on``: who evaluates the global model — ``server`` (default: the test set, above),
    ``clients`` (federated evaluation: every client scores it on its own held-out split,
    ``client_holdout`` of its partition, never trained on; recorded as ``clients_acc``,
    ``clients_loss``, ``clients_<name>``, each the sample-weighted mean of the clients'
    values) or ``both``. ``client_holdout`` is read only when ``on`` includes clients."""

    every: int = 1
    batch_size: int = 1000
    target_accuracy: float | None = None
    metrics: list[str] = field(default_factory=lambda: ["accuracy"])
    on: str = "server"
    client_holdout: float = 0.1
    #: A finished run whose final test accuracy is below ``collapse_share`` × its best (a
    #: best of at least ``collapse_from``: a run that trained) has the status
    #: ``degraded (test accuracy collapsed: ...)``, never ``ok`` (issue 51 item 1: colluders
    #: wrecked runs that said ``ok (...)``; ``splitfl.metrics.summary.run_warnings``).
    #: splitfl's choice (no paper defines a collapse): losing half of the best accuracy is
    #: a broken run, not the round-to-round noise of non-IID training; 0.3 is three times
    #: chance on the ten-class datasets the papers use, so a run that never left chance is
    #: not called collapsed. ``collapse_share`` 0 = never.
    collapse_share: float = 0.5
    collapse_from: float = 0.3
    #: A finished run in which the server rejected client updates (``dropped_reasons`` other
    #: than absent devices) and whose final test accuracy is at most chance (1 / classes) +
    #: ``chance_margin`` × (1 − chance) has the status ``degraded (test accuracy at chance:
    #: ...)``: wrecked from its first round, it never reached ``collapse_from`` (issue 51:
    #: 9.2 % in every round with status ``ok``). A run with nothing rejected is not judged
    #: (one round, a hard task: slow, not attacked). splitfl's choice: 0.05 of the way from
    #: chance to 100 % (14.5 % on ten classes; the issue's wrecked run sat at 9.2 %, its
    #: honest control at 66.9 % after one round). 0 = at or below chance only.
    #: ``splitfl.metrics.summary.at_chance``.
    chance_margin: float = 0.05


#: Optional per-round metric loggers for ``output.tracking`` and the package each needs.
TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}


@dataclass(frozen=True)
class OutputConfig:
    """Where and how a run is written. ``tracking`` lists optional loggers that receive each
    round's metrics row (``tensorboard``, ``mlflow``; extras of the same names); the run
    directory stays the source of truth. ``plots`` draws ``accuracy.png`` and ``loss.png`` when
    a run ends, after ``summary.json``, in a background process that imports matplotlib while
    the rounds run (the result does not wait for it; ``RunResult.wait_plots()`` does, and so
    does the command line unless ``--no-wait-plots``); about 0.6 s of CPU a run: sweeps of
    many short runs, and the test suite, may turn it off; ``splitfl report`` draws the same
    curves later from the metrics."""

    out_dir: str = "runs"
    name: str | None = None
    checkpoint_every: int = 10
    progress: bool = True
    plots: bool = True
    tracking: list[str] = field(default_factory=list)


#: ``clock`` values: what the algorithms observe — the cost model's simulated times, or (with
#: ``executor: networked``) the times measured on the devices.
CLOCKS = ("simulated", "measured")
#: ``train.aggregation`` values (``splitfl.aggregation.robust``).
AGGREGATIONS = ("mean", "clip_mean", "median", "trimmed_mean", "centered_clip")
#: ``network.untrusted_aggregation`` values: ``train.aggregation``'s and ``fltrust``, which
#: needs the networked server's own step on its held samples (``splitfl.aggregation.robust``).
UNTRUSTED_AGGREGATIONS = (*AGGREGATIONS, "fltrust")
#: ``train.drop_last`` values (TrainConfig.drop_last); ``auto`` is resolved to one of the
#: others before a run (:func:`splitfl.experiment.context.build_context`).
DROP_LAST = (False, True, "single", "auto")
#: ``eval.on`` values: who evaluates the global model (the server's test set, the clients'
#: held-out splits, both).
EVAL_ON = ("server", "clients", "both")
#: ``parallel.backend`` values: worker processes on this machine, or Ray actors.
PARALLEL_BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class ParallelConfig:
    """``executor: parallel``: the independent units of a round (its groups) are dealt to
    ``workers`` persistent workers — processes on this machine (``local``) or Ray actors
    (``ray``: a local instance, the sweep trial's, or the cluster at ``address``), each asking
    for ``threads`` CPUs and ``gpus_per_worker`` GPUs — that keep the data partitions they were
    sent. A worker that dies or does not start or answer within ``timeout_s`` is replaced by a
    fresh one and its units are trained again (the same result); a unit lost more than
    ``max_retries`` times (or a worker that fails to start that often) stops the run."""

    workers: int = 2
    backend: str = "local"
    gpus_per_worker: float = 0.0
    address: str | None = None
    threads: int = 1
    timeout_s: float = 600.0
    max_retries: int = 2


@dataclass(frozen=True)
class SplitConfig:
    """Where an ``nn.Module`` model (one with its own ``forward``, split by
    :mod:`splitfl.models.graph`) may be cut, by module path: ``cut_points`` the candidate cuts
    in forward order (``layer2`` = after module ``layer2``, the last layer on the device;
    ``after:X``, ``before:X``; null = after every top-level child where the graph allows a
    split) and ``cut`` the default cut of fixed-split algorithms (null = the last candidate).
    Block-list models (the zoo, ``nn.Sequential``) declare their own cut points."""

    cut_points: list[str] | None = None
    cut: str | None = None


#: ``hf.attn_implementation`` values: transformers' attention implementations.
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
#: ``hf.tied_weights`` values (:mod:`splitfl.models.hf_stack`).
TIED_WEIGHTS = ("copy", "frozen")


@dataclass(frozen=True)
class HfConfig:
    """How a Hugging Face model (``model: hf:``/``hf-config:``) is built and split.

    ``attn_implementation``: ``sdpa`` (default: ``torch.nn.functional.scaled_dot_product_attention``
    where the model supports it, eager where it does not, e.g. DeBERTa-v2) or ``eager``
    (transformers' reference matmul-softmax attention). ``tied_weights``: a tensor the split
    puts on both sides of a cut (GPT-2's and Gemma's output head is their input embedding;
    ALBERT's one layer group runs at every depth): ``copy`` (default, what the SplitLoRA code
    does, FDU-INC/Split_LoRA ``examples/NLG/src/splitmodel.py``: the server holds its own copy
    of the embedding as its head, which trains on its own in full fine-tuning and stays
    frozen, so equal, under LoRA) or ``frozen`` (one tensor, frozen on both sides: the model
    stays tied, but that tensor does not train; DeBERTa's relative-position embeddings, which
    every layer is handed, are then frozen too, so it splits in full fine-tuning)."""

    attn_implementation: str = "sdpa"
    tied_weights: str = "copy"


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment. ``options`` maps an algorithm name to its options (see ``splitfl list``).

    ``executor`` picks the training engine (``sequential`` reference loop or ``vectorized``
    batched clients), ``device`` where it trains (``cpu``, ``cuda``, ``cuda:N`` or ``auto``),
    ``precision`` ``fp32`` or ``bf16`` autocast, ``channels_last`` the image memory layout.
    ``threads`` sets torch's intra-op threads and the BLAS libraries' threads during the run
    (default 1: per-client mini-batches of small models run fastest single-threaded, busy-waiting
    thread pools collapse when several processes share a few cores, and scipy's optimisers give
    the same digits in a shell and in a Ray worker; null keeps the libraries' defaults, better
    for big models on CPU). ``executor`` defaults to ``sequential``, chosen from the CPU
    measurement of issue 54 (``benchmarks/results/executors-cpu-k10-50-100-2026-12-02.json``,
    repeat 1): ``vectorized`` with vmap ran the quickstart CNN 1.26×/2.29×/2.15× faster at
    10/50/100 clients a round but ResNet-8 0.79×/0.33×/0.36× as fast with up to 4.3× the memory,
    so the reference engine is the default that is never far slower and never larger.
    """

    algorithm: str = "s2fl"
    model: str = "cnn_digits"
    rounds: int = 30
    seed: int = 0
    executor: str = "sequential"
    device: str = "cpu"
    precision: str = "fp32"
    channels_last: bool = False
    threads: int | None = 1
    clock: str = "simulated"
    data: DataConfig = field(default_factory=DataConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    hf: HfConfig = field(default_factory=HfConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Python modules imported before the config is checked (they register models, datasets
    #: and algorithms), found on PYTHONPATH, in the current directory and in the config
    #: file's directory; also in Ray workers, device processes and on resume
    #: (:mod:`splitfl.extensions`).
    imports: list[str] = field(default_factory=list)
    #: Where those modules (and ``model:``/``data.dataset:`` import paths) were found:
    #: filled in when the run starts (null), so a resumed run or a launched device finds them.
    import_dirs: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> ExperimentConfig:
        return dataclasses.replace(self, **changes)
