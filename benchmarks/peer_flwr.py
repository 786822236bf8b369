"""Flower's simulation as a peer runner (``bench_peers.py``), run by
``benchmarks/.venvs/flwr``'s python: ``python peer_flwr.py DATA``.

``flwr.simulation.run_simulation`` with the Ray backend (its default client resources, two
CPUs a client: one actor on a 2-core machine), 100 supernodes, a ``ServerApp`` with the FedAvg
strategy (its |D_i|-weighted average of the returned weights) and centralised evaluation
(``evaluate_fn``) on the test set every round, a ``ClientApp`` whose ``NumPyClient`` trains
with SGD. The strategy samples 10 supernodes a round as usual and tells each which of the
workload's clients to train (``FitIns`` config): the same clients and mini-batches as the
other runners, whichever supernode runs them.
"""

from __future__ import annotations

import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context, FitIns, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.simulation import run_simulation
from peer_workload import (
    LR,
    NUM_CLIENTS,
    PER_ROUND,
    ROUNDS,
    Report,
    build_model,
    read_workload,
    save_final,
)
from plain_loop import evaluate

_WORKLOAD: dict[str, object] = {}


def _workload(folder: str):  # noqa: ANN202
    """The workload, read once per process (the Ray actor's and the server's)."""
    if folder not in _WORKLOAD:
        _WORKLOAD[folder] = read_workload(Path(folder))
    return _WORKLOAD[folder]


def _load(model: torch.nn.Module, arrays) -> None:  # noqa: ANN001
    keys = list(model.state_dict())
    model.load_state_dict(
        {k: torch.from_numpy(np.asarray(a)) for k, a in zip(keys, arrays, strict=True)}
    )


def _arrays(model: torch.nn.Module) -> list[np.ndarray]:
    return [v.detach().numpy().copy() for v in model.state_dict().values()]


class Client(NumPyClient):
    """Trains the workload's client named in the config on its round's mini-batches."""

    def __init__(self):
        self.model = build_model()

    def fit(self, parameters, config):  # noqa: ANN001, ANN201
        w = _workload(str(config["data"]))
        r, c = int(config["round"]), int(config["client"])
        _load(self.model, parameters)
        self.model.train()
        opt = torch.optim.SGD(self.model.parameters(), lr=LR)
        for idx in w.batches(r, c):
            opt.zero_grad()
            F.cross_entropy(self.model(w.x[idx]), w.y[idx]).backward()
            opt.step()
        return _arrays(self.model), len(w.parts[c]), {}


def client_fn(context: Context):  # noqa: ANN201
    torch.set_num_threads(1)
    return Client().to_client()


class Scheduled(FedAvg):
    """FedAvg whose sampled supernodes train the workload's clients of the round."""

    def __init__(self, folder: str, chosen: list[list[int]], **kwargs):
        super().__init__(**kwargs)
        self.folder, self.chosen = folder, chosen

    def configure_fit(self, server_round, parameters, client_manager):  # noqa: ANN001, ANN201
        proxies = client_manager.sample(num_clients=PER_ROUND, min_num_clients=PER_ROUND)
        clients = self.chosen[server_round - 1]
        return [
            (p, FitIns(parameters, {"round": server_round - 1, "client": c, "data": self.folder}))
            for p, c in zip(proxies, clients, strict=True)
        ]


def main(folder: Path) -> None:
    """Run Flower's simulation on the workload and report its rounds."""
    torch.set_num_threads(1)
    report = Report("Flower simulation", version("flwr"), round_cpu_s=None)
    w = _workload(str(folder))
    model = build_model()
    final: dict[str, torch.Tensor] = {}

    def evaluate_fn(server_round: int, arrays, config):  # noqa: ANN001, ANN202
        _load(model, arrays)
        acc, loss = evaluate(model, w.x_test, w.y_test)
        if server_round == 0:  # the initial model: round 1 starts now
            report.rounds_begin()
        else:
            report.round_end(acc)
            final.update({k: v.clone() for k, v in model.state_dict().items()})
        return loss, {"accuracy": acc}

    strategy = Scheduled(
        str(folder),
        w.chosen,
        fraction_fit=PER_ROUND / NUM_CLIENTS,
        fraction_evaluate=0.0,
        min_fit_clients=PER_ROUND,
        min_available_clients=NUM_CLIENTS,
        evaluate_fn=evaluate_fn,
        initial_parameters=ndarrays_to_parameters(_arrays(model)),
    )
    config = ServerConfig(num_rounds=ROUNDS)
    server_app = ServerApp(
        server_fn=lambda ctx: ServerAppComponents(strategy=strategy, config=config)
    )
    run_simulation(server_app, ClientApp(client_fn=client_fn), num_supernodes=NUM_CLIENTS)
    end = time.time()
    save_final(final)
    report.write(end)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
