"""Privacy of split training: RingSFL's eavesdropper leakage probability (Eq. 8, Fig. 5), a
Deep-Leakage-from-Gradients attack on FedAvg vs RingSFL uploads (§4.2.5, Eq. 9, Fig. 15–16),
and an honest-but-curious server's attacks on what crosses the cut: UnSplit and the inverse
network on smashed data (:mod:`~splitfl.privacy.reconstruct`), label inference on cut-layer
gradients (:mod:`~splitfl.privacy.labels`), scored by :mod:`~splitfl.privacy.metrics`,
on a finished run's final model or on the tensors it recorded during training
(``privacy.record``: :func:`read_record`, :func:`attack_recorded`); a malicious server's
feature-space hijacking (FSHA, :mod:`~splitfl.privacy.fsha`, run by
:mod:`~splitfl.privacy.fsha_run`) and the client's SplitGuard score
(:mod:`~splitfl.privacy.splitguard`)."""

from splitfl.privacy.attack import DLGResult, cosine_similarity, dlg_attack, infer_label
from splitfl.privacy.experiment import AttackConfig, load_attack_config, run_attack
from splitfl.privacy.fsha_run import FshaConfig, run_fsha
from splitfl.privacy.labels import direction_scores, label_leak_auc, norm_scores
from splitfl.privacy.leakage import leakage_curve, leakage_probability, plot_leakage_curve
from splitfl.privacy.metrics import mse, psnr, reconstruction_scores, roc_auc, ssim
from splitfl.privacy.observe import (
    gradient_from_update,
    observe_fedavg,
    observe_ringsfl,
    true_gradient,
)
from splitfl.privacy.on_run import RunAttack, attack_recorded, attack_run
from splitfl.privacy.reconstruct import (
    Reconstruction,
    invert,
    train_inverse_network,
    unsplit_attack,
)
from splitfl.privacy.results import plot_attack, write_results
from splitfl.privacy.sweep import dcs, evaluate_sweep, load_sweep
from splitfl.roles.cut_record import RecordedBatch, read_record

__all__ = [
    "AttackConfig",
    "DLGResult",
    "FshaConfig",
    "Reconstruction",
    "RecordedBatch",
    "RunAttack",
    "attack_recorded",
    "attack_run",
    "cosine_similarity",
    "dcs",
    "direction_scores",
    "dlg_attack",
    "evaluate_sweep",
    "gradient_from_update",
    "infer_label",
    "invert",
    "label_leak_auc",
    "leakage_curve",
    "leakage_probability",
    "load_attack_config",
    "load_sweep",
    "mse",
    "norm_scores",
    "observe_fedavg",
    "observe_ringsfl",
    "plot_attack",
    "plot_leakage_curve",
    "psnr",
    "read_record",
    "reconstruction_scores",
    "roc_auc",
    "run_attack",
    "run_fsha",
    "ssim",
    "train_inverse_network",
    "true_gradient",
    "unsplit_attack",
    "write_results",
]
