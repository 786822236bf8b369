"""One splitting mechanism for every Hugging Face transformer: cut between the layers of its
layer stack, running the model's own modules as its own ``forward`` calls them.

A transformer is a *prelude* (embeddings, the masks and position tensors its ``forward`` builds
for its layers), a *stack* (an ``nn.ModuleList`` of identical layers, called in a loop) and a
*tail* (final norm, pooling, task head). :func:`probe` runs the model once with hooks and reads
from it which ``ModuleList`` is called as the stack (the one whose calls cover most parameters),
the order of the calls (ALBERT calls one shared group L times), which modules run before the
first call and which after the last, what each call is handed and what each returns.

The blocks (:func:`split_stack`) run the model's own ``forward`` on a *skeleton* of it: a
shallow copy of the module tree in which a block's own modules take their places and the stack
is a list of :class:`Slot` placeholders, so the real ``forward`` — masks, rotary embeddings,
position ids, exactly as that model and transformers version build them — runs unmodified:

- the first block runs the forward on the real inputs; the slots record what each layer call is
  handed (arguments and keyword arguments) and stop the forward after the last call; it then
  runs the first layer on what it was handed;
- a layer block calls its layer with what the forward handed that call: recorded by the first
  block (same side of the cut) or, on the other side, by running the forward's prelude on
  placeholder inputs (``inputs_embeds`` of zeros and the padding mask that crossed) — the
  model's own mask and position code again, without its weights' values mattering;
- the last block runs the forward once more on placeholders, the last slot returning the real
  hidden states, so the model's own tail (norm, pooling on the last non-padding token, head)
  makes the logits.

What crosses a cut is the hidden states, the ``[B, T]`` padding mask (text) and, only where the
model's tail reads them (a decoder's sequence classifier finds the last non-padding token from
the ids), the token ids. The placeholder runs draw no random numbers and build no graph
(dropout in train mode draws exactly what the unsplit model draws, in the same order).

Refused, in one line naming why (:class:`Unsplittable`): no stack found; a module with weights
called between two layer calls (DeBERTa's convolution after its first layer); the hidden states
changed between two calls; layers handed tensors made from trainable weights before the stack
(DeBERTa's relative-position embeddings, in full fine-tuning): those weights would be needed on
both sides. Frozen — under LoRA, or by ``tied = "frozen"``, which freezes the parameters
behind them — they are the template's own values, which the other side's placeholder run
rebuilds exactly (DeBERTa-v2/v3 with relative attention splits).

Tied weights (a tensor in two blocks: GPT-2's output head is its input embedding, ALBERT's layer
group runs at every depth): ``tied`` = ``copy`` (default, the SplitLoRA code's: the later block
gets its own copy, which trains on its own) or ``frozen`` (one tensor, frozen).

Why hooks on the model's own ``forward`` and not a graph: ``torch.fx`` cannot trace
transformers 5's models and ``torch.export`` bakes train/eval mode into the graph; a skeleton
keeps ``train()``/``eval()``, dropout and every architecture's own mask code as they are.
This module is over 400 lines because it is one mechanism: the probe, the skeleton and the
three kinds of block read and write the same records.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

#: ``tied`` values (``hf.tied_weights``): what a tensor used by two blocks becomes.
TIED = ("copy", "frozen")


class Unsplittable(ValueError):
    """A model this mechanism cannot cut (one line naming why)."""


class HandedWeights(Unsplittable):
    """The layers are handed tensors made from trainable weights before the stack (DeBERTa's
    relative-position embeddings): ``names``, the parameters behind them."""

    def __init__(self, names: list[str]):
        super().__init__(
            "its layers are handed tensors made from trainable weights before the stack "
            f"({', '.join(names)}): those weights would be on both sides (with train.lora they "
            "are frozen base weights, and the model splits; or set hf.tied_weights: frozen)"
        )
        self.names = names


def _weights_behind(model: nn.Module, stack_path: str, tensors: list) -> list[str]:
    """The trainable parameters outside the stack that ``tensors`` were computed from."""
    inside = f"{stack_path}."
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [(n, p) for n, p in params if not n.startswith(inside)]
    total = sum(t.float().sum() for t in tensors)
    grads = torch.autograd.grad(total, [p for _, p in params], allow_unused=True)
    return [n for (n, _), g in zip(params, grads, strict=True) if g is not None]


class _Stop(Exception):
    """Raised by the last slot: the rest of the forward is not needed."""


@dataclass
class Call:
    """One call of a stack layer as the probe saw it."""

    entry: int  # which entry of the stack ModuleList
    keyword: bool  # the hidden states passed as ``hidden_states=`` (else the first argument)
    output: tuple | None  # the returned tuple (None: a tensor), other items as the probe saw


@dataclass
class Plan:
    """What :func:`probe` read from the model."""

    stack: str  # the stack's module path
    calls: list[Call]
    prelude: list[str]  # module paths owned by the first block
    tail: list[str]  # module paths owned by the last block
    inputs: str  # "text" ([B, 2, T] ids and mask) or "pixels"
    embed_dim: int = 0  # the width of ``inputs_embeds`` (text)
    carry_ids: bool = False  # the tail reads the token ids
    needs_kwargs: bool = True  # the layers are handed tensors built per batch
    static: list[tuple[tuple, dict]] = field(default_factory=list)  # the probe's call inputs
    accepts_embeds: bool = True


def _is_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def _flat_tensors(v: Any) -> Iterator[torch.Tensor]:
    if _is_tensor(v):
        yield v
    elif isinstance(v, tuple | list):
        for item in v:
            yield from _flat_tensors(item)
    elif isinstance(v, dict):
        for item in v.values():
            yield from _flat_tensors(item)


def _hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(call: tuple[tuple, dict], hidden: torch.Tensor) -> tuple[tuple, dict]:
    args, kwargs = call
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _fake_output(call: Call, hidden: torch.Tensor) -> Any:
    """What the layer returns, in the probe's structure, with ``hidden`` as its states."""
    if call.output is None:
        return hidden
    return tuple(hidden if i == 0 or _is_tensor(v) else v for i, v in enumerate(call.output))


def _layer_output(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


# ---------------------------------------------------------------------------------------- probe


def _holders(model: nn.Module) -> dict[str, nn.Module]:
    """Modules with tensors of their own (parameters or buffers), by path."""
    return {
        p: m for p, m in model.named_modules(remove_duplicate=False) if m._parameters or m._buffers
    }


def find_stack(model: nn.Module) -> str:
    """The path of the ``nn.ModuleList`` of same-class modules holding most parameters."""
    best, size = None, 0
    for path, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) == 0:
            continue
        if len({type(c) for c in m}) != 1 or isinstance(m[0], nn.ModuleList | nn.Linear):
            continue
        n = sum(p.numel() for p in m.parameters())
        if n > size:
            best, size = path, n
    if best is None:
        raise Unsplittable("no layer stack (an nn.ModuleList of identical layers) found")
    return best


def probe(model: nn.Module, inputs: dict, kind: str) -> Plan:
    """Run ``model`` once on ``inputs`` with hooks and read its :class:`Plan`."""
    stack_path = find_stack(model)
    stack = model.get_submodule(stack_path)
    events: list[tuple[str, Any]] = []  # ("call", i) / ("module", path)
    seen: list[tuple[int, tuple, dict, Any]] = []
    handles = []
    for i, layer in enumerate(stack):

        def pre(_m, args, kwargs, i=i):
            events.append(("call", i))
            seen.append([i, args, kwargs, None])

        def post(_m, _args, _kwargs, out):
            seen[-1][3] = out

        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.register_forward_hook(post, with_kwargs=True))
    inside = f"{stack_path}."
    holders = _holders(model)
    for path, m in model.named_modules(remove_duplicate=False):
        if not path or path == stack_path or path.startswith(inside):
            continue
        event = ("mod" if path in holders else "free", path)
        handles.append(m.register_forward_pre_hook(lambda *_, e=event: events.append(e)))
    modes = [(m, m.training) for m in model.modules()]
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():  # see what needs grad
            model.eval()(**inputs)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes:
            m.training = mode
    if not seen:
        raise Unsplittable(f"its forward never calls its layer stack {stack_path}")
    return _plan(model, stack_path, events, seen, kind)


def _plan(model, stack_path, events, seen, kind) -> Plan:
    """The :class:`Plan` from the probe's events and recorded calls."""
    first = next(k for k, e in enumerate(events) if e[0] == "call")
    last = max(k for k, e in enumerate(events) if e[0] == "call")
    between = [e[1] for e in events[first:last] if e[0] == "mod"]
    if between:
        raise Unsplittable(f"module {between[0]} with weights runs between two of its layers")
    before = {e[1] for e in events[:first] if e[0] != "call"}
    after = {e[1] for e in events[last:] if e[0] != "call"}
    for (_, _, _, out), (_, args, kwargs, _) in zip(seen, seen[1:], strict=False):
        if _layer_output(out) is not _hidden_of(args, kwargs):
            raise Unsplittable("its forward changes the hidden states between two layers")
    calls = [
        Call(i, not args, out if isinstance(out, tuple) else None) for i, args, kwargs, out in seen
    ]
    tensors = [
        t
        for _, args, kwargs, _ in seen
        for t in _flat_tensors((args[1:] if args else (), {**kwargs, "hidden_states": None}))
    ]
    handed = [t for t in tensors if t.requires_grad]
    if handed:
        raise HandedWeights(_weights_behind(model, stack_path, handed))
    prelude, tail = _owners(model, stack_path, before, after)
    static = [(args, kwargs) for _, args, kwargs, _ in seen]
    params = inspect.signature(model.forward).parameters
    plan = Plan(stack_path, calls, prelude, tail, kind, static=static)
    plan.needs_kwargs = kind == "text" or bool(tensors)
    plan.accepts_embeds = "inputs_embeds" in params
    if kind == "text":
        plan.embed_dim = model.get_input_embeddings().embedding_dim
        plan.carry_ids = _tail_reads_ids(model)
    return plan


def _tail_reads_ids(model: nn.Module) -> bool:
    """A sequence classifier that pools the last non-padding token finds it from the ids."""
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        return False
    return "pad_token_id" in source


def _owners(model, stack_path, before, after) -> tuple[list[str], list[str]]:
    """The largest subtrees whose modules all run before the stack (prelude) or not before it
    (tail: after it, or never). Modules without weights are owned too: their ``training``
    flag (dropout) is the block's."""
    inside = f"{stack_path}."
    holders = [
        p
        for p, _ in model.named_modules(remove_duplicate=False)
        if p and not p.startswith(inside) and p != stack_path
    ]
    phase = {p: ("pre" if p in before else "post") for p in holders}
    both = (before & after) - {""}
    prelude: list[str] = []
    tail: list[str] = []

    def visit(path: str) -> None:
        if path in both:  # a module the forward calls before and after the stack: tied
            prelude.append(path)
            tail.append(path)
            return
        under = [p for p in holders if p == path or p.startswith(f"{path}.") or not path]
        kinds = {phase[p] for p in under}
        holds_stack = not path or stack_path == path or stack_path.startswith(f"{path}.")
        if not holds_stack and kinds and len(kinds) == 1 and not (set(under) & both):
            (prelude if kinds == {"pre"} else tail).append(path)
            return
        module = model.get_submodule(path) if path else model
        if module._parameters or module._buffers:
            raise Unsplittable(f"module {path or 'the model'} holds weights on both sides")
        for name, _ in module.named_children():
            child = f"{path}.{name}" if path else name
            if child != stack_path:
                visit(child)

    visit("")
    return prelude, tail


# -------------------------------------------------------------------------------------- skeleton


def _shallow(m: nn.Module, training: bool) -> nn.Module:
    clone = copy.copy(m)
    clone._modules = dict(m._modules)
    clone.training = training
    return clone


def skeleton(root: nn.Module, overrides: dict[str, nn.Module], training: bool) -> nn.Module:
    """A shallow copy of ``root``'s module tree with ``overrides`` (path -> module) in place;
    every other module is ``root``'s own. The copied nodes are in ``training`` mode (the
    block's), as the model's forward reads ``self.training`` of its own modules too."""
    clones = {"": _shallow(root, training)}
    for path, module in overrides.items():
        parts = path.split(".")
        node, at = clones[""], ""
        for name in parts[:-1]:
            at = f"{at}.{name}" if at else name
            if at not in clones:
                clones[at] = _shallow(node._modules[name], training)
                node._modules[name] = clones[at]
            node = clones[at]
        node._modules[parts[-1]] = module
    return clones[""]


class Slot(nn.Module):
    """A stack entry in a skeleton: hands each call to its :class:`Run`; other attributes
    (``attention_type``, ...) are the real layer's."""

    def __init__(self, layer: nn.Module, run: Run):
        super().__init__()
        self.__dict__["_layer"], self.__dict__["_run"] = layer, run

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_layer"], name)

    def forward(self, *args, **kwargs):
        return self.__dict__["_run"].step(args, kwargs)


class Run:
    """What a skeleton's slots do on one forward: record each call's inputs and stop after
    the last (``capture``), or return the real hidden states from the last (``tail``)."""

    def __init__(self, calls: list[Call]):
        self.calls = calls
        self.mode, self.seen, self.hidden, self.on_first = "capture", [], None, None

    def step(self, args: tuple, kwargs: dict):
        j = len(self.seen)
        self.seen.append((args, kwargs))
        given = _hidden_of(args, kwargs)
        if self.mode == "tail":
            if j == 0 and self.on_first is not None:
                self.on_first()
            last = j == len(self.calls) - 1
            return _fake_output(self.calls[j], self.hidden if last else given)
        if j == len(self.calls) - 1:
            raise _Stop
        return _fake_output(self.calls[j], given)


class Shell:
    """A model's template (its own module tree, shared by every copy of its blocks: a deep copy
    of a block leaves it alone) and :class:`Plan`, and the per-batch layer inputs last recorded
    (one slot, keyed by the padding mask that crossed)."""

    def __init__(self, model: nn.Module, plan: Plan, tied: str):
        self.model, self.plan, self.tied = model, plan, tied
        self._last: tuple[Any, tuple, list] | None = None

    def __deepcopy__(self, memo):
        return self

    def skeleton(self, owned: dict[str, nn.Module], run: Run, training: bool) -> nn.Module:
        stack = self.model.get_submodule(self.plan.stack)
        slots = nn.ModuleList(Slot(layer, run) for layer in stack)
        return skeleton(self.model, {**owned, self.plan.stack: slots}, training)

    def remember(self, key: torch.Tensor | None, hidden: torch.Tensor, calls: list) -> None:
        ref = weakref.ref(key) if key is not None else None
        self._last = (ref, (hidden.dtype, hidden.device), calls)

    def recalled(self, key: torch.Tensor | None, hidden: torch.Tensor) -> list | None:
        last = self._last
        if last is None or key is None or last[1] != (hidden.dtype, hidden.device):
            return None
        return last[2] if last[0] is not None and last[0]() is key else None

    def placeholders(self, hidden: torch.Tensor, carried: tuple, for_tail: bool) -> dict:
        """Inputs for a forward whose embeddings' values do not matter: zeros of the
        embeddings' width (or the image's shape) and the padding mask that crossed."""
        plan, b = self.plan, hidden.shape[0]
        if plan.inputs == "pixels":
            cfg = self.model.config
            size = cfg.image_size if isinstance(cfg.image_size, int) else cfg.image_size[0]
            return {"pixel_values": hidden.new_zeros(b, cfg.num_channels, size, size)}
        mask = carried[0]
        out: dict[str, torch.Tensor] = {"attention_mask": mask}
        if plan.carry_ids and for_tail:
            out["input_ids"] = carried[1]
        elif plan.accepts_embeds:
            out["inputs_embeds"] = hidden.new_zeros(*mask.shape, plan.embed_dim)
        else:
            out["input_ids"] = torch.zeros_like(mask)
        return out

    def layer_inputs(self, hidden: torch.Tensor, carried: tuple, training: bool) -> list:
        """Every layer call's inputs for this batch: recalled, or recorded by running the
        forward's prelude on placeholders (no gradient, no random numbers drawn)."""
        if not self.plan.needs_kwargs:
            return self.plan.static
        key = carried[0] if carried else None
        calls = self.recalled(key, hidden)
        if calls is None:
            run = Run(self.plan.calls)
            with torch.no_grad(), _rng_kept(hidden.device):
                _forward(
                    self.skeleton({}, run, training), self.placeholders(hidden, carried, False)
                )
            calls = run.seen
            self.remember(key, hidden, calls)
        return calls


def _forward(model: nn.Module, inputs: dict) -> Any:
    try:
        return model(**inputs)
    except _Stop:
        return None


@contextlib.contextmanager
def _rng_kept(device: torch.device):
    """Random numbers drawn inside are given back (CPU, and ``device``'s generator)."""
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        yield


def _rng_state(device: torch.device):
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(device: torch.device, state) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _escape(path: str) -> str:
    return path.replace(".", "__")


# ---------------------------------------------------------------------------------------- blocks


class Front(nn.Module):
    """Block 0: the prelude (the model's own forward up to its first layer, on the real
    inputs), then the first layer call."""

    def __init__(self, shell: Shell, owned: dict[str, nn.Module], layer: nn.Module):
        super().__init__()
        self.shell = shell
        self.owned = nn.ModuleDict({_escape(p): m for p, m in owned.items()})
        self.layer = layer

    def forward(self, x: torch.Tensor):
        shell, plan = self.shell, self.shell.plan
        if plan.inputs == "pixels":
            inputs, carried = {"pixel_values": x}, ()
        else:
            ids, mask = x[:, 0], x[:, 1]
            inputs = {"input_ids": ids, "attention_mask": mask}
            carried = (mask, ids) if plan.carry_ids else (mask,)
        run = Run(plan.calls)
        owned = {p.replace("__", "."): m for p, m in self.owned.items()}
        _forward(shell.skeleton(owned, run, self.training), inputs)
        hidden = _hidden_of(*run.seen[0])
        if plan.needs_kwargs:
            shell.remember(carried[0] if carried else None, hidden, run.seen)
        args, kwargs = _with_hidden(run.seen[0], hidden)
        out = _layer_output(self.layer(*args, **kwargs))
        return (out, *carried) if carried else out


class Layer(nn.Module):
    """Layer call ``j`` on what the model's forward hands it."""

    def __init__(self, shell: Shell, j: int, layer: nn.Module):
        super().__init__()
        self.shell, self.j, self.layer = shell, j, layer

    def forward(self, hidden: torch.Tensor, *carried: torch.Tensor):
        calls = self.shell.layer_inputs(hidden, carried, self.training)
        args, kwargs = _with_hidden(calls[self.j], hidden)
        out = _layer_output(self.layer(*args, **kwargs))
        return (out, *carried) if carried else out


class Tail(nn.Module):
    """The last block: the model's own forward after its last layer (norm, pooling, head),
    on the hidden states that crossed; returns the logits."""

    def __init__(self, shell: Shell, owned: dict[str, nn.Module]):
        super().__init__()
        self.shell = shell
        self.owned = nn.ModuleDict({_escape(p): m for p, m in owned.items()})

    def forward(self, hidden: torch.Tensor, *carried: torch.Tensor) -> torch.Tensor:
        shell = self.shell
        run = Run(shell.plan.calls)
        run.mode, run.hidden = "tail", hidden
        grad, state = torch.is_grad_enabled(), _rng_state(hidden.device)

        def resume() -> None:  # the placeholder prelude drew nothing and built no graph
            _set_rng_state(hidden.device, state)
            torch.set_grad_enabled(grad)

        run.on_first = resume
        owned = {p.replace("__", "."): m for p, m in self.owned.items()}
        try:
            torch.set_grad_enabled(False)
            model = shell.skeleton(owned, run, self.training)
            out = model(**shell.placeholders(hidden, carried, True))
        finally:
            torch.set_grad_enabled(grad)
        return out.logits if hasattr(out, "logits") else out[0]


# ----------------------------------------------------------------------------------------- split


def split_stack(model: nn.Module, inputs: dict, kind: str, tied: str = "copy") -> list:
    """``model`` as ``[prelude + layer call 0, call 1, ..., call n-1, tail]`` blocks (module
    docstring), with the user's own name of every tensor in ``blocks.user_names``-ready form:
    returns ``(blocks, names)``, names mapping a block-relative key prefix to the model's."""
    try:
        plan = probe(model, inputs, kind)
    except HandedWeights as err:
        if tied != "frozen":
            raise
        for name in err.names:  # frozen on both sides: each side's copy has their values
            model.get_parameter(name).requires_grad_(False)
        plan = probe(model, inputs, kind)
    shell = Shell(model, plan, tied)
    stack = model.get_submodule(plan.stack)
    layers: list[nn.Module] = []
    used: set[int] = set()
    for call in plan.calls:
        layer = stack[call.entry]
        if call.entry in used:  # one layer run at several depths (ALBERT): tied
            layer = _tied_module(layer, tied)
        used.add(call.entry)
        layers.append(layer)
    prelude = {p: model.get_submodule(p) for p in plan.prelude}
    tail = {p: model.get_submodule(p) for p in plan.tail}
    for p in set(plan.prelude) & set(plan.tail):
        tail[p] = _tied_module(tail[p], tied)
    blocks = [Front(shell, prelude, layers[0])]
    blocks += [Layer(shell, j, layers[j]) for j in range(1, len(layers))]
    blocks.append(Tail(shell, tail))
    _untie_parameters(blocks, tied)
    prefixes = {0: {"layer.": f"{plan.stack}.{plan.calls[0].entry}."}}
    for j in range(1, len(layers)):
        prefixes[j] = {"layer.": f"{plan.stack}.{plan.calls[j].entry}."}
    for i, owned in ((0, prelude), (len(blocks) - 1, tail)):
        prefixes.setdefault(i, {}).update({f"owned.{_escape(p)}.": f"{p}." for p in owned})
    return blocks, prefixes, plan


def _tied_module(module: nn.Module, tied: str) -> nn.Module:
    """A second user of ``module``'s weights: its own copy, or the module itself frozen."""
    if tied == "copy":
        return copy.deepcopy(module)
    module.requires_grad_(False)
    return module


def _untie_parameters(blocks: list[nn.Module], tied: str) -> None:
    """A parameter held by two blocks (GPT-2's head is its input embedding): the later block
    gets its own copy (``copy``), or the one tensor is frozen (``frozen``)."""
    owner: dict[int, int] = {}
    for i, block in enumerate(blocks):
        for module in block.modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                first = owner.setdefault(id(p), i)
                if first == i:
                    continue
                if tied == "copy":
                    module._parameters[name] = nn.Parameter(p.detach().clone(), p.requires_grad)
                else:
                    p.requires_grad_(False)
