"""UnSplit by the paper's server that knows only the device part's architecture (Erdogan et
al., WPES 2022, Alg. 1): a re-drawn part (``reinitialised``), model stealing, and the result
brought into the auxiliary data's range with its sign (``align_to_domain``)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from splitfl.privacy.metrics import reconstruction_scores
from splitfl.privacy.reconstruct import align_to_domain, reinitialised, unsplit_attack

#: Seven-segment strokes (row, column) on an 8×8 grid and the segments of each digit 0–9.
SEGMENTS = {
    "a": [(1, c) for c in range(2, 6)], "g": [(4, c) for c in range(2, 6)],
    "d": [(6, c) for c in range(2, 6)], "f": [(r, 2) for r in range(1, 5)],
    "b": [(r, 5) for r in range(1, 5)], "e": [(r, 2) for r in range(4, 7)],
    "c": [(r, 5) for r in range(4, 7)],
}  # fmt: skip
DIGITS = ("abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg")


def glyph_digits(n: int, seed: int) -> torch.Tensor:
    """``n`` digits-like 8×8 images in [-1, 1] (the embedded digits' range): a random digit's
    seven-segment strokes, shifted by up to a pixel, of random ink, with a little noise,
    blurred by the [1, 2, 1]² / 16 kernel and scaled to peak at 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, 1, 8, 8)
    for i in range(n):
        digit = DIGITS[int(torch.randint(10, (1,), generator=g))]
        dr, dc = (int(v) for v in torch.randint(-1, 2, (2,), generator=g))
        ink = 0.6 + 0.4 * float(torch.rand((), generator=g))
        for r, c in (rc for s in digit for rc in SEGMENTS[s]):
            x[i, 0, min(7, max(0, r + dr)), min(7, max(0, c + dc))] = ink
    x = (x + 0.05 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    k = torch.tensor([1.0, 2.0, 1.0])
    x = F.conv2d(x, (k[:, None] * k[None, :] / 16)[None, None], padding=1)
    return 2 * x / x.amax((1, 2, 3), keepdim=True) - 1


def _correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.corrcoef(torch.stack([p.flatten(), q.flatten()]))[0, 1]
                        for p, q in zip(a, b, strict=True)])  # fmt: skip


def test_reinitialised_redraws_each_module_as_a_fresh_one_under_its_seed():
    torch.manual_seed(0)
    part = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():
        part[1].running_mean += 3.0
        part[1].weight += 1.0
        part[1].bias += 1.0
    before = {k: v.clone() for k, v in part.state_dict().items()}
    rng = torch.get_rng_state()
    clone = reinitialised(part, 7)
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's random state is untouched
    assert all(torch.equal(v, part.state_dict()[k]) for k, v in before.items())
    torch.manual_seed(7)  # by hand: fresh modules drawn in the same order from seed 7
    fresh = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Linear(6, 2))
    for key, value in fresh.state_dict().items():
        assert torch.equal(clone.state_dict()[key], value), key
    for name, p in part.named_parameters():
        assert not torch.equal(clone.get_parameter(name), p), name
    again, other = reinitialised(part, 7), reinitialised(part, 8)
    assert torch.equal(again[0].weight, clone[0].weight)
    assert not torch.equal(other[0].weight, clone[0].weight)


def test_align_to_domain_by_hand():
    """Each image min-max scaled into the auxiliary range [-1, 1], its sign chosen by its
    correlation with the auxiliary mean image: x̂ = ±(2x + 3) both give x back."""
    x = torch.tensor([[[[1.0, -1.0], [0.5, -1.0]]], [[[1.0, -1.0], [-1.0, 0.0]]]])
    aux = x  # mean image [[1, -1], [-0.25, -0.5]]: both images correlate positively with it
    torch.testing.assert_close(align_to_domain(2 * x + 3, aux), x)
    torch.testing.assert_close(align_to_domain(-(2 * x + 3), aux), x)
    flat = align_to_domain(torch.full((1, 1, 2, 2), 0.3), aux)
    assert torch.equal(flat, torch.full((1, 1, 2, 2), -1.0))  # no range: the low end
    y = align_to_domain(torch.tensor([[[[0.0, 4.0], [1.0, 2.0]]]]), aux * 3)  # range [-3, 3]
    assert y.min() == -3 and y.max() == 3


@pytest.mark.parametrize(("seed", "sign"), [(1, 1), (3, -1)])
def test_the_estimated_part_attack_beats_the_auxiliary_mean_image(seed, sign):
    """A conv3×3 + ReLU device part the server never sees: from a re-drawn part and model
    stealing (100 iterations of 5 input and 5 part steps, lr 0.02), UnSplit with the TV
    prior recovers digits-like images far better than the auxiliary mean image (the best
    guess without the smashed data). The two draws' raw reconstructions have opposite signs
    (correlation with the truth 0.99 and −0.96 or beyond), so both branches of the sign
    choice are exercised. Measured over draws 0–7: MSE 0.007–0.066, SSIM 0.90–0.99 (the mean
    image 0.300 and 0.443)."""
    aux, x = glyph_digits(256, 1), glyph_digits(8, 2)
    torch.manual_seed(100)
    part = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
    clone = reinitialised(part, seed)
    assert not torch.equal(clone[0].weight, part[0].weight)
    raw = unsplit_attack(
        clone, part(x).detach(), (1, 8, 8), iterations=100, lr=0.02, lambda_tv=0.1,
        lambda_l2=0.0, input_iters=5, model_iters=5,
    ).inputs  # fmt: skip
    assert torch.equal(clone[0].weight, reinitialised(part, seed)[0].weight)  # a copy stepped
    assert bool((sign * _correlation(raw, x) > 0.9).all())
    scores = reconstruction_scores(x, align_to_domain(raw, aux))
    guess = reconstruction_scores(x, aux.mean(0, keepdim=True).expand_as(x))
    assert guess["mse"] > 0.25 and guess["ssim"] < 0.5  # measured: 0.300 and 0.443
    assert scores["mse"] < 0.25 * guess["mse"]  # measured: 0.012 (draw 1), 0.031 (draw 3)
    assert scores["ssim"] > guess["ssim"] + 0.4  # measured: 0.983, 0.959
