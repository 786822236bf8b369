"""Privacy of split training: RingSFL's eavesdropper leakage probability (Eq. 8, Fig. 5) and a
Deep-Leakage-from-Gradients attack on FedAvg vs RingSFL uploads (§4.2.5, Eq. 9, Fig. 15–16)."""

from splitfl.privacy.dlg import (
    AttackConfig,
    DLGResult,
    cosine_similarity,
    dlg_attack,
    gradient_from_update,
    infer_label,
    load_attack_config,
    observe_fedavg,
    observe_ringsfl,
    plot_attack,
    run_attack,
    true_gradient,
    write_results,
)
from splitfl.privacy.leakage import leakage_curve, leakage_probability, plot_leakage_curve

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
