"""The vanilla GAN the way the earliest PyTorch tutorials wrote it: no nn.Module and no DataLoader. The weights are
`Variable(torch.randn(...), requires_grad=True)` tensors handed to the optimizers, G and D are plain functions whose
last line is `F.sigmoid(...)`, the losses are `F.binary_cross_entropy` on D's probabilities, and the batches come
from a reader's `next_batch(64)` as numpy arrays. Gradients are reset by hand after each step. Plain PyTorch, no
gantools.

    python vanilla_gan_functional.py --dataroot DIR [--iters 10000] [--batch-size 64] [--img-size 28]
"""
import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim
from PIL import Image
from torch.autograd import Variable

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
parser.add_argument("--iters", type=int, default=10000)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--img-size", type=int, default=28)
parser.add_argument("--z-dim", type=int, default=100)
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--lr", type=float, default=1e-3)
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
mb_size, Z_dim, h_dim = args.batch_size, args.z_dim, args.hidden
X_dim = data.images.shape[1]


def xavier_init(size):
    in_dim = size[0]
    xavier_stddev = 1. / np.sqrt(in_dim / 2.)
    return Variable(torch.randn(*size) * xavier_stddev, requires_grad=True)


# the generator's weights
Wzh = xavier_init(size=[Z_dim, h_dim])
bzh = Variable(torch.zeros(h_dim), requires_grad=True)
Whx = xavier_init(size=[h_dim, X_dim])
bhx = Variable(torch.zeros(X_dim), requires_grad=True)


def G(z):
    h = F.relu(z @ Wzh + bzh.repeat(z.size(0), 1))
    X = F.sigmoid(h @ Whx + bhx.repeat(h.size(0), 1))
    return X


# the discriminator's weights
Wxh = xavier_init(size=[X_dim, h_dim])
bxh = Variable(torch.zeros(h_dim), requires_grad=True)
Why = xavier_init(size=[h_dim, 1])
bhy = Variable(torch.zeros(1), requires_grad=True)


def D(X):
    h = F.relu(X @ Wxh + bxh.repeat(X.size(0), 1))
    y = F.sigmoid(h @ Why + bhy.repeat(h.size(0), 1))
    return y


G_params = [Wzh, bzh, Whx, bhx]
D_params = [Wxh, bxh, Why, bhy]
params = G_params + D_params


def reset_grad():
    for p in params:
        if p.grad is not None:
            data_ = p.grad.data
            p.grad = Variable(data_.new().resize_as_(data_).zero_())


G_solver = optim.Adam(G_params, lr=args.lr)
D_solver = optim.Adam(D_params, lr=args.lr)

ones_label = Variable(torch.ones(mb_size, 1))
zeros_label = Variable(torch.zeros(mb_size, 1))

for it in range(args.iters):
    # Sample data
    z = Variable(torch.randn(mb_size, Z_dim))
    X, _ = data.next_batch(mb_size)
    X = Variable(torch.from_numpy(X))

    # Dicriminator forward-loss-backward-update
    G_sample = G(z)
    D_real = D(X)
    D_fake = D(G_sample)

    D_loss_real = F.binary_cross_entropy(D_real, ones_label)
    D_loss_fake = F.binary_cross_entropy(D_fake, zeros_label)
    D_loss = D_loss_real + D_loss_fake

    D_loss.backward()
    D_solver.step()

    # Housekeeping - reset gradient
    reset_grad()

    # Generator forward-loss-backward-update
    z = Variable(torch.randn(mb_size, Z_dim))
    G_sample = G(z)
    D_fake = D(G_sample)

    G_loss = F.binary_cross_entropy(D_fake, ones_label)

    G_loss.backward()
    G_solver.step()

    # Housekeeping - reset gradient
    reset_grad()

    # Print and plot every now and then
    if it % 1000 == 0:
        print('Iter-{}; D_loss: {}; G_loss: {}'.format(it, D_loss.data.numpy(), G_loss.data.numpy()))
