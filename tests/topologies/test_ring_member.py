"""RingSFL's ring member (``topologies/ring/member.py::RingMember``, Alg. 2 cut at segments):
whatever order the hops arrive in, a BatchUpdate step leaves every member's model exactly as
:func:`ring_batch_update` (one autograd graph, batches in task order) leaves it."""

import copy

import pytest
import torch

from splitfl.core.topology import RingSpec
from splitfl.models import build_model
from splitfl.topologies.ring.member import RingMember, ring_batch_update

# lengths 3:1:1 over cnn_digits' 5 blocks: block 2 of u_0's model is crossed by all three
# batches (three gradients to add: float addition is not associative)
ORDER, LENGTHS = [0, 1, 2], {0: 3, 1: 1, 2: 1}


def _members_step(models, ring, batches, backward_order, lr):
    """One BatchUpdate step over messages in this process: every batch forward around the
    ring in task order, then the gradients back, batch by batch in ``backward_order``."""
    members = {c: RingMember(c, models[c], ring) for c in ring.order}
    for m in members.values():
        m.begin_step()
    grads = {}
    for start, (x, y) in batches.items():
        h = x
        for hop, (client, _lo, _hi) in enumerate(ring.segments(start)):
            h = members[client].forward(start, hop, h)
        grads[start], _ = members[start].loss(h, y)
    for start in backward_order:
        g = grads[start]
        for hop in reversed(range(len(ring.order))):
            g = members[ring.member(start, hop)].backward(start, hop, g)
    for m in members.values():
        m.end_step(list(batches), lr)


@pytest.mark.parametrize("backward_order", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
def test_member_step_equals_the_reference_bit_for_bit_in_any_arrival_order(backward_order):
    torch.manual_seed(3)
    model = build_model("cnn_digits", (1, 8, 8), 10)
    batches = {c: (torch.randn(6, 1, 8, 8), torch.randint(0, 10, (6,))) for c in ORDER}
    weights = {c: 1 / 3 for c in ORDER}
    ring = RingSpec(ORDER, LENGTHS, weights, dynamic_lr=True)
    assert max(ring.overlap_counts(model.num_blocks)[0]) == 3
    reference = {c: copy.deepcopy(model) for c in ORDER}
    ring_batch_update(reference, ORDER, LENGTHS, batches, weights, 0.1, dynamic_lr=True)
    members = {c: copy.deepcopy(model) for c in ORDER}
    _members_step(members, ring, batches, backward_order, 0.1)
    for c in ORDER:
        want, got = reference[c].state_dict(), members[c].state_dict()
        assert want.keys() == got.keys() and len(want) > 0
        for k in want:
            assert torch.equal(want[k], got[k]), (c, k, backward_order)
