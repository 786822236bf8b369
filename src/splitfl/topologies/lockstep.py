"""S²FL's lock-step groups on the clock (``options.s2fl.lockstep_barrier: true``, a
sensitivity beyond Eq. (1); the star family's ``Star(barrier=True)``): a member's reported time
split into phases, and each member's finish behind its group's per-iteration barrier."""

from __future__ import annotations

from splitfl.core.plan import ClientTask
from splitfl.data.partition import batch_sizes
from splitfl.system.cost import ClientCost

#: Phases of a lock-step member: (model download time, per-iteration times, model upload time).
Phases = tuple[float, list[float], float]


def lockstep_finish(members: dict[int, Phases]) -> dict[int, float]:
    """Finish time of each member of one lock-step group (S²FL Alg. 2 lines 11-23).

    Iteration k of the group ends at ``E_k = max over members with a k-th step of
    (start_k + t_ik)`` with ``start_1`` = the member's model download time and ``start_k =
    E_{k-1}`` (gradients of the group step return); a member finishes at ``E_{s_i}`` plus its
    model upload time (download + upload if it has no step).
    """
    finish = {c: pre + post for c, (pre, its, post) in members.items() if not its}
    end = 0.0
    for k in range(max((len(its) for _, its, _ in members.values()), default=0)):
        active = [(pre, its[k]) for pre, its, _ in members.values() if len(its) > k]
        end = max((pre if k == 0 else end) + t for pre, t in active)
        finish.update({c: end + post for c, (_, its, post) in members.items() if len(its) == k + 1})
    return finish


def member_phases(
    task: ClientTask,
    cost: ClientCost,
    samples: int,
    data_size: int,
    measured: float,
    drop_last: bool | str = False,
) -> Phases:
    """Split a member's reported time into download, per-iteration work and upload.

    Transfer time is divided between model download, model upload and per-sample features in
    proportion to bytes; per-sample work (features, device and server compute) is spread over
    the iterations in proportion to their batch sizes. ``measured`` (the clock's time for the
    member, incl. jitter) rescales the phases so they add up to it.
    """
    traffic, total = cost.traffic, cost.traffic.total
    pre = cost.comm_time * traffic.model_down / total if total > 0 else 0.0
    post = cost.comm_time * traffic.model_up / total if total > 0 else 0.0
    work = cost.time - pre - post
    scale = measured / cost.time if cost.time > 0 else 1.0
    sizes = batch_sizes(data_size, task.batch_size, task.steps, drop_last)
    its = [scale * work * b / max(samples, 1) for b in sizes]
    return scale * pre, its, scale * post
