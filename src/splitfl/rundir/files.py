"""The files of a run directory (``splitfl run``, and every trial of a sweep or algorithm
of a comparison): what each holds and when it is written. Every file a reader or a resume
relies on is written to a temporary name and renamed (:mod:`splitfl.core.atomic`), so a kill
leaves the old file or the new one, never half of one. Every random stream is derived from
``(seed, purpose, round)``, so a resumed run reproduces an uninterrupted one exactly (tested).
``tests/examples/test_docs_reference.py`` checks that a run writes no file missing here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunFile:
    """One entry of :data:`RUN_FILES`: when the file is written and what it holds."""

    when: str
    what: str


#: Every file (or folder, with a trailing ``/``) a run directory may hold.
RUN_FILES: dict[str, RunFile] = {
    "config.yaml": RunFile("always", "the resolved config"),
    "data.json": RunFile(
        "always",
        "dataset, per-sample input shape and dtype, number of classes and, for an image "
        "folder, their names in label order; the model's cut points",
    ),
    "clients.json": RunFile(
        "always", "per-client label histogram, sample count and device profile"
    ),
    "metrics.jsonl": RunFile(
        "a row per round",
        "simulated time, wall time, test accuracy/loss, train loss, ``samples`` trained (the "
        "round's work: compare algorithms per 1,000 samples, not only per round), bytes per "
        "link — model down/up, activations up, gradients down, labels up — average waiting "
        "time, energy (total and per participant, ``energy_j_by_client``), and each "
        "participant's cut point, group and time",
    ),
    "summary.json": RunFile(
        "at the end",
        "the run's status and final figures; ``ok`` only for a finished run with its model "
        "(``missing_rounds``, ``incomplete: k of n rounds``, ``interrupted at round k``, "
        "``stopped at round k: <error>``)",
    ),
    "accuracy.png": RunFile(
        "after ``summary.json``, by a background process (``output.plots``; "
        "``RunResult.wait_plots()`` waits for it, ``splitfl run`` too unless "
        "``--no-wait-plots``)",
        "accuracy vs round and vs simulated time",
    ),
    "loss.png": RunFile(
        "with ``accuracy.png`` (``output.plots``)", "training and test loss vs round"
    ),
    "checkpoints/": RunFile(
        "every ``output.checkpoint_every`` rounds",
        "``checkpoints/last.pt``: the state a ``--resume`` continues from, with the metric "
        "rows up to its round, a fingerprint of the data and the run's identity",
    ),
    "model.pt": RunFile(
        "at the end, before ``summary.json``",
        "the final weights under your model's own parameter names: a model with its own "
        "``forward`` or an ``nn.Sequential`` loads them with ``load_state_dict(strict=True)``; "
        "zoo models keep their ``blocks.<i>.`` names",
    ),
    "version.json": RunFile(
        "by each process that starts or resumes the run",
        "splitfl's version; the git commit and whether tracked files were modified when "
        "splitfl runs from a checkout; torch and Python versions",
    ),
    "tensorboard/": RunFile("with ``output.tracking: [tensorboard]``", "TensorBoard events"),
    "error.json": RunFile("for a failed sweep trial", "its error"),
    "devices.json": RunFile(
        "with ``data.source: devices``",
        "which device provided which clients, as announced, and per round which device "
        "trained which client (``rounds``)",
    ),
    "audit.log": RunFile(
        "networked runs",
        "a line per refusal, throttled pair, join, reconnection and dropped link (UTC time, "
        "peer address, reason), bounded and rotated to ``audit.log.1`` at 4 MiB",
    ),
    ".splitfl.lock": RunFile(
        "while a process works in the directory",
        "the lock (``fcntl.flock``); removed when the process is done, dies with it",
    ),
}
