"""Layering: the direction of imports between packages, and a new algorithm as one file."""

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import splitfl
from conftest import tiny_config
from splitfl.algorithms import ALGORITHMS, Algorithm, register_algorithm
from splitfl.cli.main import build_parser
from splitfl.core.plan import RoundPlan

SRC = Path(splitfl.__file__).parent

#: Function-level imports allowed (plugin registration, and annotations under
#: TYPE_CHECKING): (module, imported module).
ALLOWED_LATE = {
    ("models/registry.py", "splitfl.models.zoo"),
    ("data/base.py", "splitfl.data.loaders"),
}


def _imports(path: Path) -> list[tuple[str, bool, bool]]:
    """(imported splitfl module, inside a function, under TYPE_CHECKING) for every import."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, bool, bool]] = []

    def visit(node, in_func: bool, in_tc: bool) -> None:
        for child in ast.iter_child_nodes(node):
            func = in_func or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            tc = in_tc or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                out.extend((a.name, in_func, in_tc) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.append((child.module, in_func, in_tc))
            visit(child, func, tc)

    visit(tree, False, False)
    return [(m, f, t) for m, f, t in out if m == "splitfl" or m.startswith("splitfl.")]


def _modules(package: str) -> dict[str, list[tuple[str, bool, bool]]]:
    root = SRC / package
    paths = [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))
    return {str(p.relative_to(SRC)): _imports(p) for p in paths}


def _offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path} imports {mod}"
        for path, imports in _modules(package).items()
        for mod, _, _ in imports
        if any(mod == f or mod.startswith(f + ".") for f in forbidden)
    ]


def test_algorithms_import_neither_executors_nor_experiment():
    forbidden = ("splitfl.executors", "splitfl.experiment", "splitfl.net")
    assert _offenders("algorithms", forbidden) == []


def test_executors_import_no_algorithm_and_no_experiment():
    forbidden = ("splitfl.algorithms", "splitfl.experiment", "splitfl.net")
    assert _offenders("executors", forbidden) == []


def test_algorithms_read_only_the_federation_view():
    """What an algorithm reads of its run context (every ``ctx.<name>`` in algorithms/) is a
    member of the typed view it is given (``FederationView``), and the run context has them."""
    import re

    from splitfl.algorithms.view import VIEW_MEMBERS
    from splitfl.experiment.runner import as_config, prepare

    read = set()
    for path in (SRC / "algorithms").rglob("*.py"):
        read |= set(re.findall(r"\bctx\.([a-z_]+)", path.read_text()))
    assert read and read - VIEW_MEMBERS == set()
    ctx = prepare(as_config(tiny_config(algorithm="fedavg"))).ctx
    assert [m for m in sorted(VIEW_MEMBERS) if not hasattr(ctx, m)] == []


def test_roles_import_no_topology_runtime_algorithm_or_experiment():
    """roles/ (what every pattern shares) knows no pattern, no runtime and no algorithm."""
    forbidden = (
        "splitfl.topologies",
        "splitfl.algorithms",
        "splitfl.executors",
        "splitfl.net",
        "splitfl.experiment",
    )
    assert _offenders("roles", forbidden) == []


def test_topologies_import_no_algorithm_runtime_or_experiment():
    """topologies/ (one room per pattern) sits below the algorithms that plan it and the
    runtimes that run it."""
    forbidden = ("splitfl.algorithms", "splitfl.executors", "splitfl.net", "splitfl.experiment")
    assert _offenders("topologies", forbidden) == []


def test_every_payload_has_a_family_and_every_algorithm_names_a_registered_payload():
    from splitfl.core.topology import PAYLOADS, DeviceUpdate
    from splitfl.topologies import FAMILIES

    patterns = [p for p in PAYLOADS if not issubclass(p, DeviceUpdate)]
    assert [p.__name__ for p in patterns if p not in FAMILIES] == []
    assert {
        n: c.topology.__name__ for n, c in ALGORITHMS.items() if c.topology not in FAMILIES
    } == {}


def test_a_family_that_leaves_part_of_the_contract_undefined_cannot_be_built():
    from splitfl.core.topology import Star
    from splitfl.topologies.base import Family
    from splitfl.topologies.split import SplitFamily

    class NoSchedule(SplitFamily):
        payload = Star

    class NoPrice(Family):
        payload = Star

        def units(self, model, plan):
            return []

        def run_unit(self, unit, env):
            return [], None

        def untrained(self, plan, global_state, num_blocks, samples_of):
            return None

    for cls, missing in ((NoSchedule, "schedule"), (NoPrice, "price")):
        with pytest.raises(TypeError, match=missing):
            cls()


def test_no_runtime_branches_on_a_topology_payload():
    """Runtimes dispatch on the family or through a payload-keyed door (the vectorised
    executor's ``BATCHED_TWINS``, the networked server's ``NETWORKED_ROUNDS`` /
    ``NETWORKED_GROUPS``), never by testing a payload's type: ``isinstance(….topology, X)``
    appears in runtimes only in the parallel channel's refusal of a ring plan on the wire
    (a ring is never dealt; a setup plan has no tasks to ask its family with)."""
    import re

    allowed = {"executors/channel.py": 2}
    found = {}
    for pkg in ("executors", "net"):
        for path in sorted((SRC / pkg).rglob("*.py")):
            n = len(re.findall(r"isinstance\([\w.]*topology\b", path.read_text()))
            if n:
                found[str(path.relative_to(SRC))] = n
    assert found == allowed


def test_network_layer_imports_no_algorithm_and_no_experiment():
    forbidden = ("splitfl.algorithms", "splitfl.experiment", "splitfl.metrics", "splitfl.sweeps")
    assert _offenders("net", forbidden) == []


#: The device side's imports of the server side (module, imported module): a ParallelSFL top
#: worker runs its cluster's server part on its device with the server's fleet
#: (``RemoteFleet``, ``TimedServer``, ``Meter``), and a RingSFL member measures itself with
#: the server's ``Meter``.
DEVICE_USES_SERVER = {
    "net/device/clusters.py imports splitfl.net.server.remote_fleet",
    "net/device/ring.py imports splitfl.net.server.remote_fleet",
}


def test_net_transport_is_the_floor_and_trust_sits_on_it():
    """net/transport/ (both ends of a link) imports nothing of the other net/ subpackages;
    net/trust/ (run by whoever receives a tensor) imports only net/transport/."""
    others = ("splitfl.net.trust", "splitfl.net.server", "splitfl.net.device")
    assert _offenders("net/transport", others) == []
    assert _offenders("net/trust", ("splitfl.net.server", "splitfl.net.device")) == []


def test_net_device_side_imports_no_server_side_but_the_fleet():
    """net/device/ (the device process) imports nothing of net/server/ (the server process)
    but the fleet a top worker drives its cluster with (listed above)."""
    assert set(_offenders("net/device", ("splitfl.net.server",))) <= DEVICE_USES_SERVER


def test_device_process_needs_no_plotting_sweeps_or_experiment():
    """``splitfl device`` imports no matplotlib, Ray, tqdm or the experiment layer, and of the
    server side only its fleet (a top worker's)."""
    code = (
        "import sys\n"
        "for m in ('matplotlib', 'ray', 'tqdm'): sys.modules[m] = None\n"
        "from splitfl.cli.entry import main\n"
        "import splitfl.net.device.cli\n"
        "bad = [m for m in sys.modules if m.startswith(('splitfl.experiment', "
        "'splitfl.algorithms', 'splitfl.metrics', 'splitfl.sweeps'))]\n"
        "assert not bad, bad\n"
        "server = {m for m in sys.modules if m.startswith('splitfl.net.server')}\n"
        "assert server <= {'splitfl.net.server', 'splitfl.net.server.remote_fleet'}, server\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_config_and_plan_are_leaves():
    registries = (
        "splitfl.algorithms",
        "splitfl.data",
        "splitfl.models",
        "splitfl.executors",
        "splitfl.experiment",
        "splitfl.system",
        "splitfl.sweeps",
    )
    assert _offenders("config", registries) == []
    # the round contract: the topology payloads at run time (core/topology.py, itself a
    # leaf) and a type annotation of the cost model, nothing else
    plan_uses = [m for m, _, tc in _imports(SRC / "core" / "plan.py") if not tc]
    assert plan_uses == ["splitfl.core.topology"]
    assert _imports(SRC / "core" / "topology.py") == []
    # the message format of the network wire and the parallel executor's channel: torch only
    assert _imports(SRC / "core" / "framing.py") == []
    # the allocator settings every long-running process applies: the standard library only
    assert _imports(SRC / "core" / "allocator.py") == []


#: Imports from core/ of splitfl outside core/, allowed under TYPE_CHECKING only: (module,
#: imported module).
CORE_TYPE_ONLY = {("core/plan.py", "splitfl.system.cost")}


def test_core_is_the_ground_floor():
    """core/ imports nothing of splitfl outside core/ (but annotations, listed above)."""
    outside = {
        (path, mod, tc)
        for path, imports in _modules("core").items()
        for mod, _, tc in imports
        if not (mod == "splitfl.core" or mod.startswith("splitfl.core."))
    }
    assert {(p, m) for p, m, tc in outside if not tc} == set()
    assert {(p, m) for p, m, tc in outside if tc} <= CORE_TYPE_ONLY


def test_aggregation_imports_no_runtime_and_no_algorithm():
    forbidden = ("splitfl.executors", "splitfl.net", "splitfl.experiment", "splitfl.algorithms")
    assert _offenders("aggregation", forbidden) == []


def test_no_function_level_imports_but_plugin_registration():
    late = {
        (path, mod)
        for package in ("",)
        for path, imports in _modules(package).items()
        for mod, in_func, tc in imports
        if in_func and not tc
    }
    assert late <= ALLOWED_LATE, sorted(late - ALLOWED_LATE)


@dataclass(frozen=True)
class _ToyOptions:
    pass


class _WholeModelAverage(Algorithm):
    """A toy algorithm defined only here: every client trains the whole model (FedAvg)."""

    name = "toy_whole_model"
    paper = "test only"
    Options = _ToyOptions

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        full = self.ctx.num_blocks
        return RoundPlan(
            tasks=[self.make_task(c, full, i, round_idx) for i, c in enumerate(clients)]
        )


@pytest.fixture
def toy_registered():
    register_algorithm(_WholeModelAverage)
    yield _WholeModelAverage.name
    del ALGORITHMS[_WholeModelAverage.name]


def test_a_registered_toy_algorithm_runs_and_equals_fedavg(tmp_path, toy_registered):
    toy = splitfl.run(tiny_config(algorithm=toy_registered, rounds=2), run_dir=tmp_path / "t")
    fed = splitfl.run(tiny_config(algorithm="fedavg", rounds=2), run_dir=tmp_path / "f")
    a = torch.load(toy.run_dir / "model.pt", weights_only=True)
    b = torch.load(fed.run_dir / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["round_time"] for r in toy.metrics] == [r["round_time"] for r in fed.metrics]


def test_registering_a_taken_name_is_refused():
    class Clash(_WholeModelAverage):
        name = "fedavg"

    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(Clash)


@pytest.mark.parametrize("flag", ["--backend", "--executor"])
def test_sweep_backend_flag_and_its_deprecated_alias(flag):
    args = build_parser().parse_args(["sweep", "s.yaml", flag, "local"])
    assert args.backend == "local"
    assert build_parser().parse_args(["sweep", "s.yaml"]).backend == "ray"


def test_tests_mirror_the_packages():
    """``tests/<folder>/`` is a package of ``src/splitfl`` (or ``conformance``, ``examples``),
    and a test imports another test module only from its own folder (shared code lives in
    the root's helpers)."""
    import re

    tests = Path(__file__).parent
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= packages | {"conformance", "examples"}
    assert not list(tests.glob("test_*.py")) or {p.name for p in tests.glob("test_*.py")} == {
        "test_architecture.py",
        "test_kernels.py",
    }
    for path in tests.rglob("test_*.py"):
        for module in re.findall(r"^\s*from (test_\w+) import", path.read_text(), re.M):
            assert (path.parent / f"{module}.py").exists(), f"{path.name} imports {module}"
