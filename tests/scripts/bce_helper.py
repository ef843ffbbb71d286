"""A GAN whose BCE loss is computed in a helper function, as Lightning's GAN example and many scripts write it
(`def adversarial_loss(pred, target): return criterion(pred, target)`), called with D's output positionally and by
keyword; the helper also hands back the mean of D's probabilities, which the loop logs as D(x) and D(G(z)). MLPs on
flattened images, D ending in nn.Sigmoid, the loop at the module's top level. Plain PyTorch, no gantools.

    python bce_helper.py --dataroot DIR [--epochs 20] [--batch-size 64] [--img-size 28]
"""
import argparse

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--img-size", type=int, default=28)
parser.add_argument("--nz", type=int, default=64)
parser.add_argument("--hidden", type=int, default=256)
args = parser.parse_args()


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


criterion = nn.BCELoss()


def adversarial_loss(pred, target):
    """BCE of D's probabilities against the target, and their mean (what D says of the batch, for the log)."""
    return criterion(pred.view(-1), target), pred.mean()


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
transform = transforms.Compose([transforms.Grayscale(), transforms.Resize(args.img_size), transforms.ToTensor(),
                                transforms.Normalize((0.5,), (0.5,))])
loader = torch.utils.data.DataLoader(datasets.ImageFolder(args.dataroot, transform=transform),
                                     batch_size=args.batch_size, shuffle=True)
pixels = args.img_size * args.img_size
G = Generator(args.nz, args.hidden, pixels).to(device)
D = Discriminator(args.hidden, pixels).to(device)
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))

for epoch in range(args.epochs):
    for images, _ in loader:
        real = images.view(images.size(0), -1).to(device)
        b = real.size(0)
        fake = G(torch.randn(b, args.nz, device=device))

        opt_d.zero_grad()
        real_loss, p_real = adversarial_loss(D(real), torch.ones(b, device=device))
        fake_loss, _ = adversarial_loss(D(fake.detach()), torch.zeros(b, device=device))
        d_loss = real_loss + fake_loss
        d_loss.backward()
        opt_d.step()

        opt_g.zero_grad()
        g_loss, p_gen = adversarial_loss(target=torch.ones(b, device=device), pred=D(fake))
        g_loss.backward()
        opt_g.step()
    print("[Epoch %d/%d] [D loss: %f] [G loss: %f] [D(x): %.4f] [D(G(z)): %.4f]"
          % (epoch, args.epochs, d_loss.item(), g_loss.item(), p_real.item(), p_gen.item()))
