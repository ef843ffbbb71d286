"""A GAN whose D applies its sigmoid in forward, `torch.sigmoid(...)` on the value it returns (no nn.Sigmoid module),
as many tutorials write it, and which logs what D says each epoch: D(x), D(G(z)) and D's accuracy (the share of real
images above 0.5, of fakes below). MLPs on flattened images, BCELoss, the loop at the module's top level. Plain
PyTorch, no gantools.

    python sigmoid_in_forward.py --dataroot DIR [--epochs 20] [--batch-size 64] [--img-size 28]
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
        self.features = nn.Sequential(nn.Linear(pixels, hidden), nn.LeakyReLU(0.2))
        self.score = nn.Linear(hidden, 1)

    def forward(self, x):
        return torch.sigmoid(self.score(self.features(x))).view(-1)


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
bce = nn.BCELoss()

for epoch in range(args.epochs):
    for images, _ in loader:
        real = images.view(images.size(0), -1).to(device)
        b = real.size(0)
        fake = G(torch.randn(b, args.nz, device=device))

        opt_d.zero_grad()
        p_real = D(real)
        p_fake = D(fake.detach())
        d_loss = bce(p_real, torch.ones(b, device=device)) + bce(p_fake, torch.zeros(b, device=device))
        d_loss.backward()
        opt_d.step()
        accuracy = ((p_real > 0.5).float().mean() + (p_fake < 0.5).float().mean()) / 2

        opt_g.zero_grad()
        p_gen = D(fake)
        g_loss = bce(p_gen, torch.ones(b, device=device))
        g_loss.backward()
        opt_g.step()
    print("[Epoch %d/%d] [D loss: %f] [G loss: %f] [D(x): %.4f] [D(G(z)): %.4f] [D accuracy: %.4f]"
          % (epoch, args.epochs, d_loss.item(), g_loss.item(), p_real.mean().item(), p_gen.mean().item(),
             accuracy.item()))
