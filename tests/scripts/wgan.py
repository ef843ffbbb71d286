"""A WGAN in the style of the original paper's code: five critic steps per generator step, each on a fresh batch,
RMSprop and weight clipping. Plain PyTorch, no gantools.

    python wgan.py --dataroot DIR [--n-critic 5] [--batch-size 64] [--width 64]
"""
import argparse

import torch
import torch.nn as nn
import torchvision.datasets as dset
import torchvision.transforms as transforms

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--n-critic", type=int, default=5)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--nz", type=int, default=64)
parser.add_argument("--clip", type=float, default=0.01)
parser.add_argument("--iterations", type=int, default=100000)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
transform = transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32), transforms.ToTensor(),
                                transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
loader = torch.utils.data.DataLoader(dset.ImageFolder(args.dataroot, transform), batch_size=args.batch_size,
                                     shuffle=True, drop_last=True)
w = args.width
generator = nn.Sequential(
    nn.Linear(args.nz, 4 * w * 4 * 4), nn.Unflatten(1, (4 * w, 4, 4)), nn.ReLU(),
    nn.ConvTranspose2d(4 * w, 2 * w, 4, 2, 1), nn.BatchNorm2d(2 * w), nn.ReLU(),
    nn.ConvTranspose2d(2 * w, w, 4, 2, 1), nn.BatchNorm2d(w), nn.ReLU(),
    nn.ConvTranspose2d(w, 3, 4, 2, 1), nn.Tanh()).to(device)
critic = nn.Sequential(
    nn.Conv2d(3, w, 4, 2, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(w, 2 * w, 4, 2, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(2 * w, 4 * w, 4, 2, 1), nn.LeakyReLU(0.2),
    nn.Flatten(), nn.Linear(4 * w * 4 * 4, 1)).to(device)
opt_g = torch.optim.RMSprop(generator.parameters(), lr=5e-5)
opt_c = torch.optim.RMSprop(critic.parameters(), lr=5e-5)


def batches():
    while True:
        for images, _ in loader:
            yield images.to(device)


data = batches()
for it in range(args.iterations):
    for _ in range(args.n_critic):
        real = next(data)
        with torch.no_grad():
            fake = generator(torch.randn(real.size(0), args.nz, device=device))
        loss_c = critic(fake).mean() - critic(real).mean()
        opt_c.zero_grad()
        loss_c.backward()
        opt_c.step()
        for p in critic.parameters():
            p.data.clamp_(-args.clip, args.clip)
    loss_g = -critic(generator(torch.randn(args.batch_size, args.nz, device=device))).mean()
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()
    if it % 100 == 0:
        print(f"iteration {it}: critic {loss_c.item():.4f}, generator {loss_g.item():.4f}")
