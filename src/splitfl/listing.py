"""What is registered: the Python twin of ``splitfl list`` (``splitfl.catalog()``).

Named ``listing``, not ``catalog``: a module ``splitfl.catalog`` would replace the public
function ``splitfl.catalog`` as soon as it was imported.
"""

from __future__ import annotations

from splitfl.algorithms import ALGORITHMS, ALIASES
from splitfl.data.base import DATASETS, dataset_names
from splitfl.experiment.runtimes import RUNTIMES
from splitfl.extensions import load_plugins
from splitfl.models.registry import MODELS, model_names
from splitfl.proxies import PROXIES
from splitfl.system.devices import COMPOSITIONS, PRESETS


def timing_note(cls) -> str:
    """`` [executor timing: ...]`` for an algorithm whose control reads training signals:
    what stands in for them without training, or that ``executor: timing`` refuses it."""
    if not cls.training_signals:
        return ""
    use = f"stand-in: {cls.timing_stand_in}" if cls.timing_stand_in else "refused"
    return f" [executor timing: {cls.training_signals}; {use}]"


def parallel_note(cls) -> str:
    """`` [parallel: units]`` when ``executor: parallel`` deals a round's groups to its workers,
    else `` [parallel: coupled: why]`` (the round runs in the driver, as sequential)."""
    return (
        f" [parallel: coupled: {cls.coupled_round}]" if cls.coupled_round else " [parallel: units]"
    )


def catalog() -> dict[str, dict[str, str]]:
    """``{"algorithms"|"models"|"datasets"|"device_presets"|"compositions"|"executors":
    {name: description}}``; a proxy baseline's description starts with ``[proxy: reason]``
    (:mod:`splitfl.proxies`). Installed plugins (``splitfl.plugins``) are loaded first."""
    load_plugins()
    algorithms = {
        name: (f"[proxy: {PROXIES[name]}] " if name in PROXIES else "")
        + cls.paper
        + f" [topology: {cls.topology.__name__}]"
        + timing_note(cls)
        + parallel_note(cls)
        for name, cls in sorted(ALGORITHMS.items())
    }
    for name, (base, preset) in sorted(ALIASES.items()):
        algorithms[name] = f"alias of {base} with {preset or 'defaults'}"
    presets = {
        name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in sorted(PRESETS.items())
    }
    return {
        "algorithms": algorithms,
        "models": {name: MODELS[name].description for name in model_names()},
        "datasets": {name: DATASETS[name].description for name in dataset_names()},
        "device_presets": presets,
        "compositions": {name: ":".join(map(str, w)) for name, w in COMPOSITIONS.items()},
        "executors": {name: runtime.description for name, runtime in RUNTIMES.items()},
    }
