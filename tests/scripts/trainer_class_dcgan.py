"""A DCGAN written as a trainer class, as many repositories do: the models, optimizers and loss are attributes
(`self.G`, `self.opt_d`, `self.criterion`), the device is `self.device`, one method per step, Sigmoid + BCELoss, the
losses returned with .item(). Plain PyTorch, no gantools.

    python trainer_class_dcgan.py --dataroot DIR [--epochs 5] [--batch-size 64] [--nz 64] [--width 64]
"""
import argparse

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T


class Generator(nn.Module):
    def __init__(self, nz, width):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, width * 2, 8, 1, 0, bias=False), nn.BatchNorm2d(width * 2), nn.ReLU(True),
            nn.ConvTranspose2d(width * 2, width, 4, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True),
            nn.ConvTranspose2d(width, 1, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, width, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True),
            nn.Conv2d(width, width * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(width * 2), nn.LeakyReLU(0.2, True),
            nn.Conv2d(width * 2, 1, 8, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1)


class GANTrainer:
    def __init__(self, root, batch_size, nz, width):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.nz = nz
        transform = T.Compose([T.Grayscale(), T.Resize(32), T.ToTensor(), T.Normalize((0.5,), (0.5,))])
        self.loader = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=transform),
                                                  batch_size=batch_size, shuffle=True)
        self.G = Generator(nz, width).to(self.device)
        self.D = Discriminator(width).to(self.device)
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.criterion = nn.BCELoss()

    def train_step(self, real):
        b = real.size(0)
        fake = self.G(torch.randn(b, self.nz, 1, 1, device=self.device))
        self.opt_d.zero_grad()
        loss_d = self.criterion(self.D(real), torch.ones(b, device=self.device)) + \
            self.criterion(self.D(fake.detach()), torch.zeros(b, device=self.device))
        loss_d.backward()
        self.opt_d.step()
        self.opt_g.zero_grad()
        loss_g = self.criterion(self.D(fake), torch.ones(b, device=self.device))
        loss_g.backward()
        self.opt_g.step()
        return loss_d.item(), loss_g.item()

    def fit(self, epochs):
        for epoch in range(epochs):
            for x, _ in self.loader:
                loss_d, loss_g = self.train_step(x.to(self.device))
            print("[Epoch %d/%d] [D loss: %f] [G loss: %f]" % (epoch, epochs, loss_d, loss_g))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--nz", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    GANTrainer(args.dataroot, args.batch_size, args.nz, args.width).fit(args.epochs)
