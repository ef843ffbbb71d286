"""The WGAN as the early PyTorch tutorials wrote it (wiseodd's generative-models, wgan_pytorch.py): MLP G and critic as
nn.Sequential, RMSprop, weight clipping, five critic steps of a fresh real batch each, and a generator step that
draws a real batch (`next_batch`) it never uses. No DataLoader: the batches come from a reader's `next_batch(32)` as
numpy arrays. Plain PyTorch, no gantools.

    python wgan_mlp_next_batch.py --dataroot DIR [--iters 100000] [--batch-size 32] [--img-size 28]
"""
import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn
import torch.optim as optim
from PIL import Image
from torch.autograd import Variable

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
parser.add_argument("--iters", type=int, default=100000)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--img-size", type=int, default=28)
parser.add_argument("--z-dim", type=int, default=10)
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--lr", type=float, default=1e-4)
args = parser.parse_args()


class Reader:
    """The images as one flat numpy array, served in shuffled batches like the old input_data readers."""

    def __init__(self, root, size):
        files = sorted(Path(root).rglob("*.png"))
        self.images = np.stack([np.asarray(Image.open(f).convert("L").resize((size, size)), dtype=np.float32)
                                .reshape(-1) / 255.0 for f in files])
        self.labels = np.zeros(len(files), dtype=np.int64)
        self.order, self.at = np.random.permutation(len(files)), 0

    def next_batch(self, n):
        if self.at + n > len(self.order):
            self.order, self.at = np.random.permutation(len(self.order)), 0
        idx = self.order[self.at:self.at + n]
        self.at += n
        return self.images[idx], self.labels[idx]


data = Reader(args.dataroot, args.img_size)
mb_size, z_dim, h_dim, lr = args.batch_size, args.z_dim, args.hidden, args.lr
X_dim = data.images.shape[1]

G = torch.nn.Sequential(
    torch.nn.Linear(z_dim, h_dim),
    torch.nn.ReLU(),
    torch.nn.Linear(h_dim, X_dim),
    torch.nn.Sigmoid()
)

D = torch.nn.Sequential(
    torch.nn.Linear(X_dim, h_dim),
    torch.nn.ReLU(),
    torch.nn.Linear(h_dim, 1),
)


def reset_grad():
    G.zero_grad()
    D.zero_grad()


G_solver = optim.RMSprop(G.parameters(), lr=lr)
D_solver = optim.RMSprop(D.parameters(), lr=lr)

for it in range(args.iters):
    for _ in range(5):
        # Sample data
        z = Variable(torch.randn(mb_size, z_dim))
        X, _ = data.next_batch(mb_size)
        X = Variable(torch.from_numpy(X))

        # Dicriminator forward-loss-backward-update
        G_sample = G(z)
        D_real = D(X)
        D_fake = D(G_sample)

        D_loss = -(torch.mean(D_real) - torch.mean(D_fake))

        D_loss.backward()
        D_solver.step()

        # Weight clipping
        for p in D.parameters():
            p.data.clamp_(-0.01, 0.01)

        # Housekeeping - reset gradient
        reset_grad()

    # Generator forward-loss-backward-update
    X, _ = data.next_batch(mb_size)
    X = Variable(torch.from_numpy(X))
    z = Variable(torch.randn(mb_size, z_dim))

    G_sample = G(z)
    D_fake = D(G_sample)

    G_loss = -torch.mean(D_fake)

    G_loss.backward()
    G_solver.step()

    # Housekeeping - reset gradient
    reset_grad()

    # Print now and then
    if it % 1000 == 0:
        print('Iter-{}; D_loss: {}; G_loss: {}'.format(it, D_loss.data.numpy(), G_loss.data.numpy()))
