#!/usr/bin/env python3
"""DP-SGD on MNIST with Opacus, written the way Opacus's own examples/mnist.py is.

A plain Opacus training script: it does not import dpaudit_torch. Audit it unchanged with

    dpaudit run --out mnist_audit -- python examples/mnist_opacus.py --epochs 1

(docs/auditor.md, "Auditing an unmodified script: dpaudit run"). With ``--data-root DIR``
holding torchvision's MNIST files (``DIR/MNIST/raw``) it trains on MNIST; without, or when the
files are not there, on torchvision's FakeData of MNIST's shape (1 x 28 x 28, 10 classes), so
that it runs offline. Nothing is downloaded. The default run (FakeData, 1 epoch of 2,048 images
at batch size 64: 32 steps) takes a few seconds on a CPU.

Under a DDP launcher (``torchrun --nproc_per_node 2 examples/mnist_opacus.py``) every rank
trains its shard with Opacus's ``DifferentiallyPrivateDistributedDataParallel`` (gloo on CPU,
nccl on CUDA).
"""

import argparse
import os
import sys
import warnings

import numpy as np
import torch
from opacus import PrivacyEngine
from torch import nn, optim
from torch.nn import functional as F  # noqa: N812 - the usual name

try:  # this script stays free of dpaudit_torch (dpaudit run audits it unmodified)
    from torchvision import datasets, transforms
except ImportError:
    sys.stderr.write("examples/mnist_opacus.py needs torchvision, not installed here: pip install "
                     "'dpaudit-torch[examples]' (from a clone of the repository: "
                     ".venv/bin/pip install -e '.[examples]')\n")
    sys.exit(2)

# Mean and standard deviation of the MNIST training images
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


class SampleConvNet(nn.Module):
    """Two strided convolutions and two linear layers (about 26,000 parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, 2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 1)  # [B, 16, 13, 13]
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 1)  # [B, 32, 4, 4]
        x = F.relu(self.fc1(x.flatten(1)))  # [B, 32]
        return self.fc2(x)  # [B, 10]


def mnist_or_fake(args, train):
    """MNIST from ``--data-root`` if its files are there, else FakeData of MNIST's shape."""
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))])
    if args.data_root:
        try:
            return datasets.MNIST(args.data_root, train=train, download=False, transform=tf)
        except RuntimeError:  # "Dataset not found"
            if train:
                print(f"no MNIST files under {args.data_root}: training on FakeData")
    size = args.fake_size if train else max(args.fake_size // 4, 1)
    return datasets.FakeData(size=size, image_size=(1, 28, 28), num_classes=10, transform=tf,
                             random_offset=0 if train else 10**6)


def train(args, model, device, train_loader, optimizer, privacy_engine, epoch):
    model.train()
    criterion = nn.CrossEntropyLoss()
    losses = []
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if args.rank == 0:
        if privacy_engine is not None:
            epsilon = privacy_engine.get_epsilon(args.delta)
            print(f"Train Epoch: {epoch} \t Loss: {np.mean(losses):.6f} "
                  f"(ε = {epsilon:.2f}, δ = {args.delta})")
        else:
            print(f"Train Epoch: {epoch} \t Loss: {np.mean(losses):.6f}")


def test(model, device, test_loader):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    n = len(test_loader.dataset)
    print(f"Test set: Average loss: {loss / n:.4f}, "
          f"Accuracy: {correct}/{n} ({100.0 * correct / n:.2f}%)")
    return correct / n


def main():
    parser = argparse.ArgumentParser(description="Opacus MNIST example",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-b", "--batch-size", type=int, default=64, metavar="B",
                        help="Batch size (expected, Poisson sampling)")
    parser.add_argument("--test-batch-size", type=int, default=1024, metavar="TB",
                        help="Batch size for testing")
    parser.add_argument("-n", "--epochs", type=int, default=1, metavar="N",
                        help="Number of epochs to train")
    parser.add_argument("-r", "--n-runs", type=int, default=1, metavar="R",
                        help="Number of runs to average on (each calls make_private)")
    parser.add_argument("--lr", type=float, default=0.1, metavar="LR", help="Learning rate")
    parser.add_argument("--sigma", type=float, default=1.0, metavar="S", help="Noise multiplier")
    parser.add_argument("-c", "--max-per-sample-grad_norm", type=float, default=1.0, metavar="C",
                        help="Clip per-sample gradients to this norm")
    parser.add_argument("--delta", type=float, default=1e-5, metavar="D", help="Target delta")
    parser.add_argument("--device", type=str, default="cpu", help="Torch device")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the model and the sampling")
    parser.add_argument("-j", "--workers", type=int, default=0, help="Data loader workers")
    parser.add_argument("--save-model", action="store_true", default=False,
                        help="Save the trained model")
    parser.add_argument("--disable-dp", action="store_true", default=False,
                        help="Disable privacy training and just train with vanilla SGD")
    parser.add_argument("--secure-rng", action="store_true", default=False,
                        help="Enable Secure RNG to have trustworthy privacy guarantees")
    parser.add_argument("--data-root", type=str, default=None,
                        help="Where MNIST is stored (torchvision layout); FakeData without it")
    parser.add_argument("--fake-size", type=int, default=2048, help="FakeData training images")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module="opacus")  # "secure RNG turned off"
    warnings.filterwarnings("ignore", message="Full backward hook")  # torch, about Opacus's hooks

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.rank = int(os.environ.get("RANK", "0"))
    if world_size > 1:  # torchrun: one process per rank
        import torch.distributed as dist

        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        if args.device.startswith("cuda"):
            args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    device = torch.device(args.device)

    torch.manual_seed(args.seed)
    train_set = mnist_or_fake(args, train=True)
    test_loader = torch.utils.data.DataLoader(
        mnist_or_fake(args, train=False), batch_size=args.test_batch_size,
        num_workers=args.workers)
    run_results = []
    for run in range(args.n_runs):
        model = SampleConvNet().to(device)
        if world_size > 1:
            from opacus.distributed import DifferentiallyPrivateDistributedDataParallel

            model = DifferentiallyPrivateDistributedDataParallel(model)
        optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0)
        # every rank its own sampling stream (Opacus's distributed Poisson sampler draws each
        # rank's batch with the loader's generator)
        generator = torch.Generator().manual_seed(args.seed + 1000 * run + 7919 * args.rank)
        train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size,
                                                   num_workers=args.workers, generator=generator)
        privacy_engine = None
        if not args.disable_dp:
            privacy_engine = PrivacyEngine(secure_mode=args.secure_rng)
            model, optimizer, train_loader = privacy_engine.make_private(
                module=model,
                optimizer=optimizer,
                data_loader=train_loader,
                noise_multiplier=args.sigma,
                max_grad_norm=args.max_per_sample_grad_norm,
            )
        for epoch in range(1, args.epochs + 1):
            train(args, model, device, train_loader, optimizer, privacy_engine, epoch)
        if args.rank == 0:
            run_results.append(test(model, device, test_loader))

    if len(run_results) > 1:
        print(f"Accuracy averaged over {len(run_results)} runs: "
              f"{np.mean(run_results) * 100:.2f}% ± {np.std(run_results) * 100:.2f}%")
    if args.save_model and args.rank == 0:
        name = f"mnist_cnn_{args.lr}_{args.sigma}_{args.max_per_sample_grad_norm}.pt"
        torch.save(model.state_dict(), name)
    if world_size > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
