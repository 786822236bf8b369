"""The training recipe: losses (``train.loss``), optimisers (``train.optimizer``), the
server-side optimiser on the aggregate (``train.server_optimizer``) and evaluation metrics
(``eval.metrics``). Imports only torch: executors, algorithms, models and
device processes share it."""

from splitfl.training.losses import FLOAT_TARGET_LOSSES, LOSSES, loss_fn, target_problem
from splitfl.training.optim import OPTIMIZERS, import_optimizers, make_optimizer
from splitfl.training.scores import METRICS, metric_problem, row_key, score
from splitfl.training.server_optim import (
    SERVER_OPTIMIZERS,
    restrict_state,
    server_step,
)

__all__ = [
    "FLOAT_TARGET_LOSSES",
    "LOSSES",
    "METRICS",
    "OPTIMIZERS",
    "SERVER_OPTIMIZERS",
    "loss_fn",
    "import_optimizers",
    "make_optimizer",
    "metric_problem",
    "restrict_state",
    "row_key",
    "score",
    "server_step",
    "target_problem",
]
