"""The vanilla GAN with no functions at all: the weights are `Variable(torch.randn(...), requires_grad=True)` tensors
handed to the optimizers, and G and D are written out inline in the loop, each time they run, as the earliest
"GAN from scratch" notebooks did. Real and fake go through D as one batch, joined with `torch.cat`. No nn.Module, no
DataLoader (`next_batch` from a numpy reader). Plain PyTorch, no gantools.

    python vanilla_gan_inline.py --dataroot DIR [--iters 10000] [--batch-size 64] [--img-size 28]
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

files = sorted(Path(args.dataroot).rglob("*.png"))
images = np.stack([np.asarray(Image.open(f).convert("L").resize((args.img_size, args.img_size)), dtype=np.float32)
                   .reshape(-1) / 255.0 for f in files])


def next_batch(n):
    return images[np.random.randint(0, len(images), n)]


mb_size, Z_dim, h_dim, X_dim = args.batch_size, args.z_dim, args.hidden, images.shape[1]
Wzh = Variable(torch.randn(Z_dim, h_dim) * 0.1, requires_grad=True)
Whx = Variable(torch.randn(h_dim, X_dim) * 0.1, requires_grad=True)
Wxh = Variable(torch.randn(X_dim, h_dim) * 0.1, requires_grad=True)
Why = Variable(torch.randn(h_dim, 1) * 0.1, requires_grad=True)
G_solver = optim.Adam([Wzh, Whx], lr=args.lr)
D_solver = optim.Adam([Wxh, Why], lr=args.lr)
labels = torch.cat([torch.ones(mb_size, 1), torch.zeros(mb_size, 1)])

for it in range(args.iters):
    # D: real and fake in one batch
    z = torch.randn(mb_size, Z_dim)
    fake = torch.sigmoid(F.relu(z @ Wzh) @ Whx)
    X = torch.cat([torch.from_numpy(next_batch(mb_size)), fake.detach()])
    D_out = F.relu(X @ Wxh) @ Why
    D_loss = F.binary_cross_entropy_with_logits(D_out, labels)
    D_solver.zero_grad()
    D_loss.backward()
    D_solver.step()

    # G
    z = torch.randn(mb_size, Z_dim)
    fake = torch.sigmoid(F.relu(z @ Wzh) @ Whx)
    G_loss = F.binary_cross_entropy_with_logits(F.relu(fake @ Wxh) @ Why, torch.ones(mb_size, 1))
    G_solver.zero_grad()
    G_loss.backward()
    G_solver.step()

    if it % 1000 == 0:
        print('Iter-{}; D_loss: {:.4}; G_loss: {:.4}'.format(it, D_loss.item(), G_loss.item()))
