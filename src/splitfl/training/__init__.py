"""The training recipe: losses (``train.loss``), optimisers (``train.optimizer``) and
evaluation metrics (``eval.metrics``). Imports only torch: executors, algorithms, models and
device processes share it."""

from splitfl.training.losses import FLOAT_TARGET_LOSSES, LOSSES, loss_fn, target_problem
from splitfl.training.optim import OPTIMIZERS, make_optimizer
from splitfl.training.scores import METRICS, metric_problem, row_key, score

__all__ = [
    "FLOAT_TARGET_LOSSES",
    "LOSSES",
    "METRICS",
    "OPTIMIZERS",
    "loss_fn",
    "make_optimizer",
    "metric_problem",
    "row_key",
    "score",
    "target_problem",
]
