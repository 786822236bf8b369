"""Attacks by an honest-but-curious server: UnSplit and the inverse network on smashed data,
label inference on cut-layer gradients; their metrics (MSE, PSNR, SSIM, AUC) by hand."""

import math

import pytest
import torch
from torch import nn

from label_toy import two_class_head_gradients as _two_class_head_gradients
from splitfl.data.base import load_dataset
from splitfl.privacy.labels import direction_scores, label_leak_auc, norm_scores
from splitfl.privacy.metrics import psnr, reconstruction_scores, roc_auc, ssim
from splitfl.privacy.reconstruct import (
    invert,
    total_variation,
    train_inverse_network,
    unsplit_attack,
)

# ----------------------------------------------------------------------------- metrics


def test_psnr_and_ssim_by_hand():
    x = torch.zeros(1, 1, 4, 4)
    x[..., 0, 0] = 2.0  # range L = 2
    x_hat = x + 0.1  # MSE = 0.01
    assert psnr(x, x_hat) == pytest.approx(10 * math.log10(4 / 0.01))
    assert psnr(x, x) == math.inf
    assert ssim(x, x) == pytest.approx(1.0)
    # constant images a, b: variances and covariance vanish, SSIM = (2ab + C1)/(a² + b² + C1)
    a, b = torch.full((1, 1, 5, 5), 0.3), torch.full((1, 1, 5, 5), 0.7)
    c1 = (0.01 * 1.0) ** 2
    assert ssim(a, b, value_range=1.0) == pytest.approx((2 * 0.21 + c1) / (0.09 + 0.49 + c1))
    noisy = x + torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    assert ssim(x, noisy) < 0.5


def test_ssim_of_signed_images_does_not_reward_an_inverted_image():
    """Eq. (13)'s luminance term assumes intensities ≥ 0: signed inputs are shifted by the
    true inputs' minimum, so −x no longer scores near 1 against x."""
    ramp = torch.linspace(-1, 1, 16)
    x = (ramp[:, None] * ramp[None, :]).reshape(1, 1, 16, 16)  # a saddle spanning [-1, 1]
    assert ssim(x, x) == pytest.approx(1.0)
    assert ssim(x, -x) < 0  # 0.96 before the shift
    # constant images −0.5 vs 0.5 (L = 1) become 0 vs 1: SSIM = C1 / (1 + C1)
    a, b = torch.full((1, 1, 5, 5), -0.5), torch.full((1, 1, 5, 5), 0.5)
    c1 = (0.01 * 1.0) ** 2
    assert ssim(a, b, value_range=1.0) == pytest.approx(c1 / (1 + c1))
    # images that are already non-negative are unchanged
    assert ssim(a + 0.8, b + 0.8, value_range=1.0) == pytest.approx(
        (2 * 0.3 * 1.3 + c1) / (0.09 + 1.69 + c1)
    )


def test_roc_auc_matches_hand_counts_and_scikit_learn():
    from sklearn.metrics import roc_auc_score

    scores = torch.tensor([0.9, 0.1, 0.4, 0.4, 0.8, 0.2])
    labels = torch.tensor([1, 0, 1, 0, 0, 1], dtype=torch.bool)
    # positive/negative pairs ranked right: (0.9 > all 3), (0.4 > 0.1, tie 0.4), (0.2 > 0.1)
    assert roc_auc(scores, labels) == pytest.approx((3 + 1.5 + 1) / 9)
    assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))
    with pytest.raises(ValueError, match="both"):
        roc_auc(scores, torch.ones(6, dtype=torch.bool))


# ----------------------------------------------------------------------------- UnSplit


def test_unsplit_inverts_a_linear_device_part_exactly():
    """f(x) = Wx + b with W of orthonormal columns: the objective is convex, its unique
    minimiser is x itself (no TV/L2 prior); L-BFGS reaches it to float64 rounding."""
    torch.manual_seed(0)
    x = (torch.rand(4, 1, 8, 8) * 2 - 1).double()
    part = nn.Sequential(nn.Flatten(), nn.Linear(64, 96)).double()
    nn.init.orthogonal_(part[1].weight)
    before = [p.detach().clone() for p in part.parameters()]
    result = unsplit_attack(
        part, part(x).detach(), (1, 8, 8), iterations=2, lambda_tv=0, lambda_l2=0,
        optimizer="lbfgs",
    )  # fmt: skip
    assert (result.inputs - x).abs().max() < 1e-12
    assert all(torch.equal(a, p) for a, p in zip(before, part.parameters(), strict=True))


def test_unsplit_on_a_relu_conv_part_far_above_the_baseline():
    """A conv + ReLU device part on real digits: the authors' Adam recovers the images
    (PSNR > 30 dB, SSIM > 0.95) where the attack's own start (all 0.5) scores < 6 dB."""
    torch.manual_seed(0)
    x = load_dataset("digits").test.x[:8]
    part = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
    result = unsplit_attack(
        part, part(x).detach(), (1, 8, 8), iterations=60, lr=0.1, lambda_tv=0, lambda_l2=0
    )
    scores = reconstruction_scores(x, result.inputs)
    baseline = reconstruction_scores(x, torch.full_like(x, 0.5))
    assert scores["psnr"] > 30 and scores["ssim"] > 0.95
    assert baseline["psnr"] < 6 and baseline["ssim"] < 0.1
    assert result.loss_history[-1] < 1e-2 * result.loss_history[0]


def test_unsplit_stealing_steps_a_clone_and_total_variation_by_hand():
    x = torch.tensor([[[[0.0, 1.0], [2.0, 4.0]]]])
    # vertical diffs 2, 3 -> 13 / 2 elements; horizontal 1, 2 -> 5 / 2
    assert float(total_variation(x)) == pytest.approx(13 / 2 + 5 / 2)
    assert float(total_variation(torch.ones(3, 5))) == 0.0
    torch.manual_seed(0)
    part = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    before = [p.detach().clone() for p in part.parameters()]
    out = unsplit_attack(part, part(x).detach(), (1, 2, 2), iterations=3, model_iters=2)
    assert out.inputs.shape == x.shape and len(out.loss_history) == 3
    assert all(torch.equal(a, p) for a, p in zip(before, part.parameters(), strict=True))


# ----------------------------------------------------------------------------- inverse network


def test_inverse_network_learns_from_auxiliary_data_and_beats_the_mean_image():
    """He et al. 2019's inverse network, trained on 512 auxiliary training digits, inverts
    the smashed data of unseen test digits far better than the auxiliary mean image."""
    torch.manual_seed(0)
    bundle = load_dataset("digits")
    aux, x = bundle.train.x[:512], bundle.test.x[:16]
    part = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
    g, history = train_inverse_network(part, aux, epochs=6, width=16, seed=0)
    assert history[-1] < 0.5 * history[0]
    scores = reconstruction_scores(x, invert(g, part(x)))
    guess = reconstruction_scores(x, aux.mean(0, keepdim=True).expand_as(x))
    assert scores["mse"] < 0.5 * guess["mse"]
    assert scores["ssim"] > guess["ssim"] + 0.2
    again, _ = train_inverse_network(part, aux, epochs=6, width=16, seed=0)
    assert torch.equal(invert(again, part(x)), invert(g, part(x)))  # seeded


def test_inverse_network_for_flat_smashed_data():
    part = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    aux = load_dataset("digits").train.x[:64]
    g, _ = train_inverse_network(part, aux, epochs=1, width=4)
    assert invert(g, part(aux[:3])).shape == (3, 1, 8, 8)


# ----------------------------------------------------------------------------- labels


def test_label_inference_auc_near_one_on_a_two_class_toy():
    grads, y = _two_class_head_gradients()
    assert label_leak_auc(grads, y, method="norm") > 0.95
    assert label_leak_auc(grads, y, method="direction") == pytest.approx(1.0)
    random_scores = torch.rand(len(y), generator=torch.Generator().manual_seed(1))
    assert abs(roc_auc(random_scores, y == 1) - 0.5) < 0.15  # the random-guess baseline


def test_label_scores_by_hand():
    g = torch.tensor([[3.0, 4.0], [-0.6, -0.8], [0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    assert norm_scores(g).tolist() == pytest.approx([5.0, 1.0, 0.0, 1.0])
    torch.testing.assert_close(
        direction_scores(g, 0), torch.tensor([1.0, -1.0, 0.0, 0.6], dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="reference"):
        direction_scores(g, 4)
    with pytest.raises(ValueError, match="method"):
        label_leak_auc(g, torch.tensor([1, 0, 0, 1]), method="cosine")
