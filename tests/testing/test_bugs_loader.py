"""testing.bugs_loader: loaders that replay the same Poisson batches, silently (the accountant's
history is that of a correct run), and the audit's proof of them on the digits CNN."""

from __future__ import annotations

import pytest
import torch
from conftest import make_private_setup

from dpaudit_torch.testing import bugs, bugs_loader
from dpaudit_torch.testing.harness import digits_training, run_audited
from dpaudit_torch.testing.training import Training

LOADER_BUGS = ["loader-reseeded", "loader-reseeded-every-3-epochs",
               "loader-reseeded-other-epoch-length", "loader-global-seed"]


def _epochs(dl, n: int) -> list[list[tuple[int, ...]]]:
    """The batches (sorted index tuples) of ``n`` passes over the loader's batch sampler."""
    return [[tuple(sorted(b)) for b in dl.batch_sampler] for _ in range(n)]


def test_registered_as_setup_bugs() -> None:
    assert [b for b in bugs.names("setup") if b.startswith("loader-")] == LOADER_BUGS
    assert bugs_loader.RESEED_EVERY_EPOCHS == 3


@pytest.mark.parametrize(("name", "every", "steps"), [
    ("loader-reseeded", 1, 8), ("loader-reseeded-every-3-epochs", 3, 8),
    ("loader-reseeded-other-epoch-length", 1, 12), ("loader-global-seed", 1, 8)])
def test_the_same_poisson_batches_come_back(name: str, every: int, steps: int) -> None:
    s = make_private_setup(seed=3, noise_seed=None)  # N = 256, q = 1/8: 8 batches per epoch
    q = s.loader.sample_rate
    opt, dl = bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, name)
    assert opt is s.optimizer and bugs.applied_bug(opt) == name
    assert dl.sample_rate == q and dl.dataset is s.loader.dataset and len(dl) == steps
    ep = _epochs(dl, 2 * every + 1)
    assert all(len(e) == steps for e in ep)
    for e in range(every):  # the first `every` epochs are distinct, then they come back
        assert all(ep[e] != ep[f] for f in range(every) if f != e)
        assert ep[e + every] == ep[e]
    sizes = [len(b) for e in ep for b in e]
    assert len(set(sizes)) > 3  # Poisson sizes, not fixed ones
    # a fresh Poisson loader of the same seed does not repeat
    fresh = make_private_setup(seed=3).loader
    a, b = _epochs(fresh, 2)
    assert a != b


def test_the_global_seed_variant_keeps_the_noise_fresh() -> None:
    s = make_private_setup(seed=4, noise_seed=None)
    assert s.optimizer.generator is None
    opt, dl = bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, "loader-global-seed")
    assert dl.batch_sampler.sampler.generator is None  # the sampler on the global generator
    assert isinstance(opt.generator, torch.Generator)  # the noise on its own, never reset
    noise = []
    for _ in range(2):  # two epochs: the same batches, other noise
        for x, y in dl:
            s.optimizer.zero_grad()
            s.criterion(s.model(x), y).backward()
            opt.step()
            noise.append(opt.params[0].grad.detach().clone())
            break
    assert not torch.equal(noise[0], noise[1])
    assert s.engine.accountant.history == [(1.0, dl.sample_rate, 2)]  # silent


def test_refused_without_a_poisson_loader() -> None:
    s = make_private_setup(poisson=False)
    with pytest.raises(ValueError, match="Poisson loader .*DataLoader"):
        bugs.apply_setup_bug(s.engine, s.optimizer, s.loader, "loader-reseeded")


def _proven_by(name: str, seed: int, deadline: int) -> None:
    tr = digits_training(seed)  # 1437 digits, q = 1/23: 23 steps per epoch
    opt, dl = bugs.apply_setup_bug(tr.engine, tr.optimizer, tr.data_loader, name)
    tr = Training(engine=tr.engine, model=tr.model, optimizer=opt, data_loader=dl)
    rep = run_audited(tr, deadline, stop=True, seed=seed, auditor_kw={"alpha": 1e-3})
    assert rep.violation and rep.violation_step <= deadline
    found = [f for f in rep.findings if f["monitor"] == "sampling"]
    assert any("not drawn afresh" in f["message"] for f in found)


def test_a_reseeded_loader_is_proven_within_two_epochs_on_the_digits_cnn() -> None:
    """The power check on the digits CNN at the proof level alpha = 1e-3: epoch 2 replays
    epoch 1, and the violation is decided before epoch 2 ends (step 46)."""
    _proven_by("loader-reseeded", 0, 46)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "deadline"), [
    ("loader-reseeded", 46), ("loader-global-seed", 46),
    ("loader-reseeded-every-3-epochs", 69 + 23),  # epoch 4 replays epoch 1
    ("loader-reseeded-other-epoch-length", 34 + 23)])  # epochs of 34 steps
@pytest.mark.parametrize("seed", [1, 2])
def test_every_variant_is_proven_within_the_first_replayed_epoch(name: str, seed: int,
                                                                      deadline: int) -> None:
    _proven_by(name, seed, deadline)
