"""pfl-research as a peer runner (``bench_peers.py``), run by ``benchmarks/.venvs/pfl``'s
python: ``python peer_pfl.py DATA``.

FedAvg with pfl's ``SimulatedBackend`` (one process), ``PyTorchModel``, a local SGD optimiser
per user (lr 0.05, batch 16, one epoch), ``WeightByDatapoints`` (the |D_i|-weighted average
of the model differences), a central SGD optimiser with lr 1 (the average difference is
added to the model) and pfl's ``CentralEvaluationCallback`` on the test set every round
(``evaluation_frequency`` past the last round: no per-user metrics before and after local
training, which the other runners do not compute; the metrics are printed as pfl does). The
user sampler returns the workload's clients in order; each user's dataset holds its samples
in the round's shuffled order (pfl batches a user's data in order).
"""

from __future__ import annotations

import sys
import time
import types
from importlib.metadata import version
from pathlib import Path

import torch
import torch.nn.functional as F
from peer_workload import LR, PER_ROUND, ROUNDS, Report, build_model, read_workload, save_final
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.callback.central_evaluation import CentralEvaluationCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel


def _loss(self, x, y):  # noqa: ANN001, ANN202
    self.train()
    return F.cross_entropy(self(x), y)


@torch.no_grad()
def _metrics(self, x, y, eval=True):  # noqa: ANN001, ANN202, A002
    self.eval() if eval else self.train()
    logits = self(x)
    correct = (logits.argmax(1) == y).sum().item()
    loss = F.cross_entropy(logits, y, reduction="sum").item()
    return {"accuracy": Weighted(correct, len(y)), "loss": Weighted(loss, len(y))}


class Timing(TrainingProcessCallback):
    """Each round's end time and central test accuracy into the report."""

    def __init__(self, report: Report):
        self.report = report

    def on_train_begin(self, *, model) -> Metrics:  # noqa: ANN001
        self.report.rounds_begin()
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):  # noqa: ANN001, ANN201
        acc = [v for k, v in aggregate_metrics if str(k) == "Central val | accuracy"]
        self.report.round_end(float(acc[0].overall_value))
        return False, Metrics()


def main(folder: Path) -> None:
    """Set up pfl on the workload, run the rounds, report."""
    torch.set_num_threads(1)
    report = Report("pfl-research", version("pfl"))
    w = read_workload(folder)
    users = iter([c for cs in w.chosen for c in cs])
    calls = [0]

    def make_dataset(user: int) -> Dataset:
        r, calls[0] = calls[0] // PER_ROUND, calls[0] + 1
        order = torch.cat(w.batches(r, user))
        return Dataset(raw_data=[w.x[order], w.y[order]], user_id=str(user))

    net = build_model()
    net.loss, net.metrics = types.MethodType(_loss, net), types.MethodType(_metrics, net)
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    backend = SimulatedBackend(
        training_data=FederatedDataset(make_dataset, lambda: next(users)),
        val_data=None,
        postprocessors=[WeightByDatapoints()],
    )
    test = Dataset(raw_data=[w.x_test, w.y_test], eval_kwargs={"eval": True})
    callbacks = [
        CentralEvaluationCallback(test, NNEvalHyperParams(local_batch_size=None)),
        Timing(report),
    ]
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=ROUNDS,
            # no per-user metrics before and after local training (work the other runners
            # do not do); the central evaluation callback still runs every round
            evaluation_frequency=ROUNDS + 1,
            train_cohort_size=PER_ROUND,
            val_cohort_size=None,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=LR, local_num_epochs=1, local_batch_size=16
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=callbacks,
    )
    end = time.time()
    save_final(net.state_dict())
    report.write(end)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
