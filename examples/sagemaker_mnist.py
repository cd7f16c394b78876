"""An MNIST-style training script written for SageMaker's distributed data
parallel library, as its PyTorch guide lays one out (smdistributed's
`distributed` API and DistributedDataParallel, DistributedSampler with the
library's world size and rank, Adadelta with StepLR, a checkpoint saved on
rank 0). It runs unchanged on torch-smddp through the compatibility package
(compat/sagemaker), launched with torchrun instead of SageMaker's launcher:

    PYTHONPATH=compat/sagemaker torchrun --nproc-per-node 2 examples/sagemaker_mnist.py

Two things differ from the guide's script, both for this machine, not for
the library: the images are synthetic MNIST-shaped data (no download), and
the device is the CPU where there is no GPU.
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR

# Import distributed data parallel library PyTorch API
import smdistributed.dataparallel.torch.distributed as dist
# Import distributed data parallel library PyTorch DDP
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP

# Initialize distributed data parallel library
dist.init_process_group()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_mnist(n, seed):
    """MNIST-shaped data whose label is readable from the image: each class
    lights its own 8x8 patch."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 1, 28, 28, generator=g) * 0.3
    for i, y in enumerate(labels.tolist()):
        r, c = divmod(y, 5)
        images[i, 0, 2 + 12 * r:10 + 12 * r, 1 + 5 * c:6 + 5 * c] += 2.0
    return torch.utils.data.TensorDataset(images, labels)


def train(model, device, loader, optimizer, epoch, rank):
    model.train()
    total = 0.0
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        total += loss.item()
    if rank == 0:
        print(f"epoch {epoch} train loss {total / len(loader):.4f}", flush=True)


def test(model, device, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            correct += (model(data.to(device)).argmax(1) == target.to(device)).sum().item()
    print(f"test accuracy {correct / len(loader.dataset):.4f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "/tmp/smddp_mnist"))
    args = parser.parse_args()
    torch.manual_seed(1)

    # Scale batch size by world size
    batch_size = max(args.batch_size // dist.get_world_size(), 1)
    local_rank = dist.get_local_rank()
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        # Pin each GPU to a single distributed data parallel library process.
        torch.cuda.set_device(local_rank)

    train_dataset = synthetic_mnist(2048, seed=0)
    # Set num_replicas and rank in DistributedSampler
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=dist.get_world_size(), rank=rank)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=batch_size, sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(synthetic_mnist(512, seed=1), batch_size=256)

    # Wrap the PyTorch model with distributed data parallel library's DDP
    model = DDP(Net().to(device))
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        train(model, device, train_loader, optimizer, epoch, rank)
        if rank == 0:
            test(model, device, test_loader)
        scheduler.step()

    # Save model on master node.
    if dist.get_rank() == 0:
        os.makedirs(args.model_dir, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pt"))


if __name__ == "__main__":
    main()
