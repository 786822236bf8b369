"""What ``train.lora.target_modules`` may name: a typo there is one line listing the names.

peft wraps the modules whose name is a target or ends with ``.<target>``
(``peft.tuners.tuners_utils.check_target_module_exists``); when none matches it raises
``NoMatchingPeftModuleError`` from deep inside ``get_peft_model``. :func:`target_problem`
words that as one line with the model's module names (the last component of each leaf
module's path, e.g. ``query``, ``value``, ``dense`` for BERT-like models).
"""

from __future__ import annotations

from torch import nn

from splitfl.models.hf import load_hf_model

#: Most module names a message lists.
SHOWN = 40


def is_target_error(err: BaseException) -> bool:
    """Whether ``err`` is peft's refusal of target modules that match nothing."""
    name = type(err).__name__
    return name == "NoMatchingPeftModuleError" or (
        isinstance(err, ValueError) and "target modules" in str(err).lower()
    )


def module_names(model: nn.Module) -> list[str]:
    """The distinct last components of ``model``'s leaf modules' paths, sorted."""
    leaves = (n for n, m in model.named_modules() if n and not any(True for _ in m.children()))
    return sorted({n.rpartition(".")[2] for n in leaves})


def target_problem(spec: str, num_classes: int, targets: list[str] | None) -> str:
    """One line: ``targets`` match no module of ``spec``, and the names that would."""
    model, _ = load_hf_model(spec, num_classes)
    names = module_names(model)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    shown = ", ".join(names[:SHOWN]) + more
    wanted = targets if targets is not None else "peft's default for this model type"
    return f"{wanted} match no module of {spec}; its modules are named: {shown}"
