"""``privacy:`` — what the run records for privacy evaluation (its own module of the schema:
:mod:`splitfl.config.schema` re-exports it; its checks are
:func:`splitfl.config.checks.check_privacy`)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Most clients, rounds and mini-batches ``privacy.record`` may name (each recorded batch is
#: a tensor file's worth of smashed data: the bound keeps a typo from filling the disk).
MAX_RECORDED = 1000


@dataclass(frozen=True)
class RecordConfig:
    """``privacy.record``: the server side keeps what it receives at the cut during training
    (:mod:`splitfl.roles.cut_record`; attacked by ``splitfl privacy reconstruct|labels RUN_DIR
    --recorded``). For each client in ``clients`` (client ids, from 0; null, the default:
    every client the round selects) and each round in ``rounds`` (1-based, as
    ``metrics.jsonl``'s ``round``), the first ``batches`` mini-batches that client's server
    receives: the smashed data as they arrived (after the device's
    ``train.defence``), and in U-shaped runs (labels on the device) the cut-layer gradients
    of the head the device sends back; with them the sample indices of each batch (for the
    evaluator: the attacks do not read them), the device part the server sent at the round's
    start, and the round, client, cut and step. Written to ``RUN_DIR/cut_record/``. The
    threat model is the honest-but-curious server of docs/explanation/privacy-threat-models.md
    (whose attacks, UnSplit of Erdogan et al., WPES 2022, and Li et al.'s label inference,
    ICLR 2022, read these tensors). ``batches`` defaults to 1: the one mini-batch of a round
    that the device part the server holds computed (later ones come from the device's moved
    part)."""

    clients: list[int] | None = None
    rounds: list[int] = field(default_factory=lambda: [1])
    batches: int = 1


@dataclass(frozen=True)
class PrivacyConfig:
    """``privacy``: ``record`` (null: nothing is recorded, the default) — see
    :class:`RecordConfig`."""

    record: RecordConfig | None = None
