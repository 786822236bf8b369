"""Privacy of split training: RingSFL's eavesdropper leakage probability (Eq. 8, Fig. 5) and a
Deep-Leakage-from-Gradients attack on FedAvg vs RingSFL uploads (§4.2.5, Eq. 9, Fig. 15–16)."""

from splitfl.privacy.attack import DLGResult, cosine_similarity, dlg_attack, infer_label
from splitfl.privacy.experiment import AttackConfig, load_attack_config, run_attack
from splitfl.privacy.leakage import leakage_curve, leakage_probability, plot_leakage_curve
from splitfl.privacy.observe import (
    gradient_from_update,
    observe_fedavg,
    observe_ringsfl,
    true_gradient,
)
from splitfl.privacy.results import plot_attack, write_results

__all__ = [
    "AttackConfig",
    "DLGResult",
    "cosine_similarity",
    "dlg_attack",
    "gradient_from_update",
    "infer_label",
    "leakage_curve",
    "leakage_probability",
    "load_attack_config",
    "observe_fedavg",
    "observe_ringsfl",
    "plot_attack",
    "plot_leakage_curve",
    "run_attack",
    "true_gradient",
    "write_results",
]
