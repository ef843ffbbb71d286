"""A DCGAN-shaped GAN with R1 on every D step, as people write one from Mescheder et al. 2018 and StyleGAN2's loss:
the non-saturating loss on logits (F.softplus), the real batch made to require gradients, R1 = gamma / 2 *
E[||grad D(x)||^2] through torch.autograd.grad(create_graph=True), added to D's loss before one backward; a D with no
BatchNorm (the penalty is per image). Plain PyTorch, no gantools.

    python r1_dcgan.py --dataroot DIR [--epochs 5] [--batch-size 64] [--nz 64] [--ngf 64] [--ndf 64] [--gamma 10]
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.datasets as dset
import torchvision.transforms as transforms

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--nz", type=int, default=64)
parser.add_argument("--ngf", type=int, default=64)
parser.add_argument("--ndf", type=int, default=64)
parser.add_argument("--gamma", type=float, default=10.0, help="R1 weight")
parser.add_argument("--lr", type=float, default=0.0002)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dataset = dset.ImageFolder(args.dataroot, transform=transforms.Compose([
    transforms.Resize(32), transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]))
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)


class Generator(nn.Module):
    def __init__(self, nz, ngf):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            # state size. (ngf*4) x 4 x 4
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            # state size. (ngf*2) x 8 x 8
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
            # state size. (ngf) x 16 x 16
            nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, ndf):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(3, ndf, 4, 2, 1), nn.LeakyReLU(0.2),
            # state size. (ndf) x 16 x 16
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1), nn.LeakyReLU(0.2),
            # state size. (ndf*2) x 8 x 8
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1), nn.LeakyReLU(0.2),
            # state size. (ndf*4) x 4 x 4
            nn.Conv2d(ndf * 4, 1, 4, 1, 0))

    def forward(self, x):
        return self.main(x).view(-1)


G = Generator(args.nz, args.ngf).to(device)
D = Discriminator(args.ndf).to(device)
opt_g = torch.optim.Adam(G.parameters(), lr=args.lr, betas=(0.0, 0.99))
opt_d = torch.optim.Adam(D.parameters(), lr=args.lr, betas=(0.0, 0.99))

for epoch in range(args.epochs):
    for i, (real, _) in enumerate(loader):
        real = real.to(device)
        z = torch.randn(real.size(0), args.nz, 1, 1, device=device)

        # D step: non-saturating loss, R1 on the real images
        fake = G(z)
        real.requires_grad_(True)
        d_real = D(real)
        d_fake = D(fake.detach())
        loss_d = F.softplus(-d_real).mean() + F.softplus(d_fake).mean()
        grad = torch.autograd.grad(d_real.sum(), real, create_graph=True)[0]
        r1 = grad.pow(2).sum([1, 2, 3]).mean()
        opt_d.zero_grad()
        (loss_d + args.gamma / 2 * r1).backward()
        opt_d.step()

        # G step
        loss_g = F.softplus(-D(fake)).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()

        if i % 50 == 0:
            print(f"[{epoch}/{args.epochs}][{i}/{len(loader)}] [D loss: {loss_d.item():.4f}] "
                  f"[G loss: {loss_g.item():.4f}] [R1: {r1.item():.4f}]")
