"""Client-side (federated) evaluation, ``eval.on: clients | both``.

Flower's federated evaluation: every client scores the global model on its own held-out
validation split (``eval.client_holdout`` of its partition, never trained on:
:func:`~splitfl.data.clients.holdout_split`), and the server aggregates the clients' values
weighted by their numbers of samples,

    clients_<metric> = Σ_i n_i · metric_i / Σ_i n_i,

Flower's ``weighted_average`` over ``(num_examples, metrics)``. For a metric that is a mean
over samples (the loss, accuracy, top-k, mse) this is the metric on the union of the
held-out samples; ``macro_f1`` and ``perplexity`` are the weighted means of the clients'
own values. Every client evaluates in every evaluated round (Flower's ``fraction_evaluate``
default 1.0); the simulated clock and traffic do not charge it (as the server's test-set
evaluation, it is measurement, not training).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from splitfl.executors import evaluate
from splitfl.experiment.context import RunContext
from splitfl.training import row_key


def client_key(name: str) -> str:
    """The metrics-row key of metric ``name`` scored by the clients: ``clients_acc``,
    ``clients_loss``, ``clients_<name>`` (as ``test_acc``, ``test_loss``, ``test_<name>``)."""
    return "clients_" + row_key(name).removeprefix("test_")


def client_keys(metrics: list[str]) -> list[str]:
    """Every ``clients_*`` key a row holds with ``eval.metrics`` ``metrics``."""
    return [client_key("loss"), *(client_key(m) for m in metrics if m != "loss")]


def weighted_mean(values: list[dict[str, float | None]], counts: list[int]) -> dict:
    """Σ n_i v_i / Σ n_i per metric; None where any client's value is None (not finite)."""
    total = sum(counts)
    out: dict[str, float | None] = {}
    for name in values[0]:
        column = [v[name] for v in values]
        if any(v is None for v in column):
            out[name] = None
        else:
            out[name] = sum(n * v for n, v in zip(counts, column, strict=True)) / total
    return out


def evaluate_clients(
    ctx: RunContext, eval_model: Any, state: dict[str, torch.Tensor]
) -> dict[str, float | None]:
    """The global ``state`` scored by every client on its held-out samples, aggregated by
    sample count (:func:`weighted_mean`); keys as :func:`client_key`."""
    eval_model.load_state_dict(state)
    config, train = ctx.config, ctx.bundle.train
    values, counts = [], []
    for held in ctx.holdout_indices or []:
        if len(held) == 0:
            continue
        idx = torch.as_tensor(np.asarray(held), dtype=torch.long)
        x, y = train.x[idx], train.y[idx]
        values.append(
            evaluate(
                eval_model, x, y, config.eval.batch_size, config.train.loss, config.eval.metrics
            )
        )
        counts.append(len(held))
    merged = weighted_mean(values, counts) if values else {}
    return {client_key(name): value for name, value in merged.items()}
