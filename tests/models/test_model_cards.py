"""The clock's model cards (issue 32 item 10): every paper preset's and paper algorithm's
default is the paper's model, decision by decision; every decision names its source; the
card is printed by ``splitfl validate`` and ``docs/model-cards.md`` is current."""

from pathlib import Path

import pytest

from splitfl.cli.main import main
from splitfl.experiment.model_card import (
    BASELINE_ALGORITHMS,
    PAPER_ALGORITHMS,
    PRESET_CARDS,
    cards_markdown,
    model_card,
)
from splitfl.experiment.runner import as_config
from splitfl.system.devices import PRESETS

ROOT = Path(__file__).resolve().parents[2]

#: What each paper prints, written out here (not read from the code under test): field or
#: decision name -> the paper's model.
PAPER = {
    "s2fl_table1": {
        "devices.contention": False,
        "device FLOP/s and rates (High/Mid/Low)": ((2e10, 1e10, 5e9), (5e6, 2e6, 1e6)),
        "server FLOP/s": 5e10,
        "devices.server_rate": 1e7,
        "devices.flops_scale": 1.0,
        "devices.jitter": 0.0,
        "devices.exchange_latency_s": 0.0,
        "devices.variation": 0.0,
    },
    "jetson80": {
        "devices.flops_scale": 1.0,
        "worker bandwidth range (Mb/s)": (1.0, 30.0),
        "compute modes' spread (fastest / slowest FLOP/s)": 100.0,
        "rounds between random mode changes": 20,
        "devices.jitter": 0.0,
        "devices.exchange_latency_s": 0.0,
        "devices.variation": 0.0,
    },
    "ringsfl_testbed": {
        "client-server rate (Mb/s)": 135.0,
        "devices.d2d_rate": 135.0,
        "devices.flops_scale": 1.0,
        "PC / Raspberry Pi power (W)": (65.0, 6.4),
        "devices.jitter": 0.0,
        "devices.exchange_latency_s": 0.0,
        "devices.variation": 0.0,
    },
    "s2fl": {"options.s2fl.lockstep_barrier": False},
    "ringsfl": {"options.ringsfl.pipeline": "ideal"},
    "parallelsfl": {"options.parallelsfl.beta_c": "upload"},
}


def _key(decision) -> str:
    return decision.field if decision.field != "-" else decision.name


@pytest.mark.parametrize("preset", ["s2fl_table1", "jetson80", "ringsfl_testbed"])
def test_every_paper_preset_defaults_to_its_papers_model(preset):
    card = PRESET_CARDS[preset](as_config({"devices": {"preset": preset}}))
    printed = {_key(d): d for d in card}
    assert set(PAPER[preset]) <= set(printed)  # every written-out decision is on the card
    for key, paper in PAPER[preset].items():
        assert printed[key].paper == paper, key
        assert printed[key].value == paper and printed[key].follows_paper, key
    for d in card:  # the rest print no paper model and say why
        if d.paper is None:
            assert d.source.startswith(("assumption:", "none", "reading:")), d.name


@pytest.mark.parametrize("algorithm", ["s2fl", "ringsfl", "parallelsfl", "mergesfl"])
def test_every_paper_algorithm_defaults_to_its_papers_model(algorithm):
    preset = {"ringsfl": "ringsfl_testbed", "s2fl": "s2fl_table1"}.get(algorithm, "jetson80")
    cfg = as_config({"algorithm": algorithm, "devices": {"preset": preset}})
    card = {_key(d): d for d in model_card(cfg)}
    for key, paper in PAPER.get(algorithm, {}).items():
        assert card[key].value == paper and card[key].follows_paper, key
    assert all(d.source for d in card.values())


def test_every_preset_and_paper_algorithm_has_a_card_and_the_doc_is_current():
    assert set(PRESET_CARDS) == set(PRESETS)
    assert set(PAPER_ALGORITHMS) == {"s2fl", "ringsfl", "mergesfl", "parallelsfl"}
    assert set(BASELINE_ALGORITHMS) == {"locfedmix_sl"}
    doc = (ROOT / "docs" / "model-cards.md").read_text()
    assert doc == cards_markdown(), "regenerate: splitfl list --model-cards > docs/model-cards.md"


def test_validate_prints_the_card_and_flags_a_departure(capsys):
    code = main(
        [
            "validate",
            str(ROOT / "configs" / "quickstart.yaml"),
            "options.s2fl.lockstep_barrier=true",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert (
        "| lock-step barrier within a group | `options.s2fl.lockstep_barrier` | true (differs)"
        in out
    )
    assert "| server link shared by the round's transfers | `devices.contention` | false |" in out


#: Decisions that no paper prints as a model (issue 50 item 9): each is a reading or an
#: assumption, with the conflict or the figure it rests on named in its source.
READINGS = {
    ("jetson80", None): {
        "devices.contention": "reading:",
        "worker FLOP/s, fastest mode (TX2 / NX / AGX), before devices.flops_scale": "1.33 TFLOPs",
        "devices.d2d_rate": "assumption:",
    },
    ("ringsfl_testbed", None): {
        "devices.contention": "reading:",
        "server FLOP/s": "assumption:",
    },
    ("s2fl_table1", "s2fl"): {
        "options.s2fl.warmup_all_devices": "13,453 MB",
        "options.s2fl.warmup_training": "reading:",
        "devices.server_rate": "2.17× to 1.59×",
    },
    ("jetson80", "locfedmix_sl"): {"options.locfedmix_sl.device_update": "local+server"},
}


@pytest.mark.parametrize("preset, algorithm", list(READINGS))
def test_readings_are_marked_as_readings_with_what_they_rest_on(preset, algorithm):
    cfg = as_config({"algorithm": algorithm or "fedavg", "devices": {"preset": preset}})
    card = {_key(d): d for d in model_card(cfg)}
    for key, quoted in READINGS[(preset, algorithm)].items():
        decision = card[key]
        if key != "devices.server_rate":  # S²FL §5.1 prints the rate: only its use is read
            assert decision.paper is None and decision.follows_paper is None, key
            assert decision.source.startswith(("reading:", "assumption:")), key
        assert quoted in decision.source, key


def test_flops_scale_multiplies_every_device_but_not_the_server():
    from splitfl.experiment.runner import prepare

    cfgs = [{"devices": {"preset": "jetson80", "flops_scale": s}} for s in (1.0, 0.25)]
    one, quarter = (
        prepare(as_config({**c, "data": {"num_clients": 8}, "train": {"clients_per_round": 4}})).ctx
        for c in cfgs
    )
    for r in (0, 25):  # modes redrawn every 20 rounds: the schedule is scaled too
        for c in range(8):
            assert quarter.population.at(c, r).flops == 0.25 * one.population.at(c, r).flops
            assert quarter.population.at(c, r).uplink == one.population.at(c, r).uplink
    assert quarter.population.server == one.population.server
    card = {_key(d): d for d in model_card(as_config(cfgs[1]))}
    assert (
        card["devices.flops_scale"].value == 0.25 and not card["devices.flops_scale"].follows_paper
    )
