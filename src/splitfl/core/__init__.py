"""The ground floor: what every other package stands on (torch, numpy and the standard
library only; no module here imports splitfl outside ``core/``).

- ``plan``: the round contract between algorithms and executors (``RoundPlan``,
  ``ClientTask``, ``ClientUpdate``, ``RoundResult``); nothing at run time (a type annotation
  of the cost model only).
- ``activations``: what crosses a cut, one tensor or a tuple of them.
- ``seeding``: every random stream from ``(seed, purpose, round)``.
- ``atomic``: files written to a temporary name and renamed; OS errors naming their path.
- ``usercode``: user code run inside splitfl; its exceptions and exits become one line.
- ``framing``: the one message format between processes (strict-JSON header, raw tensors).
- ``allocator``: glibc malloc settings for long-running processes.
- ``benching``: clients left out for doubling periods after failing a round.
"""
