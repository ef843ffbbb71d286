"""The vanilla GAN of many MNIST tutorials: MLP G and D on flattened images (G's output is (B, 784), not an image
batch), Sigmoid + BCELoss, everything inside main() with the device chosen there, a loss line continued with a
backslash, .item() printed each epoch. Plain PyTorch, no gantools.

    python vanilla_gan_main.py --dataroot DIR [--epochs 20] [--batch-size 64] [--img-size 28] [--hidden 256]
"""
import argparse

import torch
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from torch import nn


class Generator(nn.Module):
    def __init__(self, nz, hidden, pixels):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(nz, hidden), nn.ReLU(), nn.Linear(hidden, pixels), nn.Tanh())

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden, pixels):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(pixels, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1), nn.Sigmoid())

    def forward(self, x):
        return self.net(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--img-size", type=int, default=28)
    parser.add_argument("--nz", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    transform = transforms.Compose([transforms.Grayscale(), transforms.Resize(args.img_size), transforms.ToTensor(),
                                    transforms.Normalize((0.5,), (0.5,))])
    loader = torch.utils.data.DataLoader(datasets.ImageFolder(args.dataroot, transform=transform),
                                         batch_size=args.batch_size, shuffle=True)
    pixels = args.img_size * args.img_size
    G = Generator(args.nz, args.hidden, pixels).to(device)
    D = Discriminator(args.hidden, pixels).to(device)
    g_opt = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    d_opt = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    loss_fn = nn.BCELoss()

    for epoch in range(args.epochs):
        for images, _ in loader:
            real = images.view(images.size(0), -1).to(device)
            ones = torch.ones(real.size(0), 1, device=device)
            zeros = torch.zeros(real.size(0), 1, device=device)
            fake = G(torch.randn(real.size(0), args.nz, device=device))

            d_opt.zero_grad()
            d_loss = loss_fn(D(real), ones) + \
                loss_fn(D(fake.detach()), zeros)
            d_loss.backward()
            d_opt.step()

            g_opt.zero_grad()
            g_loss = loss_fn(D(fake), ones)
            g_loss.backward()
            g_opt.step()
        print("[Epoch %d/%d] [D loss: %f] [G loss: %f]" % (epoch, args.epochs, d_loss.item(), g_loss.item()))


if __name__ == "__main__":
    main()
