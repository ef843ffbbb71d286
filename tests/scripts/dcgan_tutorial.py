"""A DCGAN trained the way the PyTorch tutorial does it (beginner/dcgan_faces_tutorial), at 32 px: an ImageFolder
with per-image PIL transforms, a D ending in Sigmoid with BCELoss, fp32, .item() every step, D not frozen in G's
step. Plain PyTorch, no gantools. Each flag below applies one fix `gantools doctor` may suggest.

    python dcgan_tutorial.py --dataroot DIR [--workers 0] [--preload] [--logits] [--bf16] [--no-item] [--freeze-d]
                             [--fused] [--channels-last]
"""
import argparse
import random

import torch
import torch.nn as nn
import torch.optim as optim
import torchvision.datasets as dset
import torchvision.transforms as transforms

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--nc", type=int, default=3)
parser.add_argument("--nz", type=int, default=100)
parser.add_argument("--ngf", type=int, default=64)
parser.add_argument("--ndf", type=int, default=64)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--beta1", type=float, default=0.5)
# one flag per fix
parser.add_argument("--preload", action="store_true", help="decode the images once, keep them on the device")
parser.add_argument("--logits", action="store_true", help="no final Sigmoid in D, BCEWithLogitsLoss")
parser.add_argument("--bf16", action="store_true", help="bf16 autocast around the forward passes")
parser.add_argument("--no-item", action="store_true", help="keep the losses on the device, read them every 50 steps")
parser.add_argument("--freeze-d", action="store_true", help="no weight gradients for D in G's step")
parser.add_argument("--fused", action="store_true", help="fused Adam")
parser.add_argument("--channels-last", action="store_true", help="G and D in channels_last")
args = parser.parse_args()

random.seed(999)
torch.manual_seed(999)
device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

dataset = dset.ImageFolder(root=args.dataroot,
                           transform=transforms.Compose([
                               *([transforms.Grayscale()] if args.nc == 1 else []),
                               transforms.Resize(args.image_size),
                               transforms.CenterCrop(args.image_size),
                               transforms.ToTensor(),
                               transforms.Normalize((0.5,) * args.nc, (0.5,) * args.nc),
                           ]))
if args.preload:  # decoded once, uint8 on the device; each batch indexed and normalised there
    images = torch.stack([(x * 127.5 + 127.5).round().to(torch.uint8) for x, _ in dataset]).to(device)

    class DeviceBatches:
        def __len__(self):
            return len(images) // args.batch_size

        def __iter__(self):
            order = torch.randperm(len(images), device=device)
            for b in range(len(self)):
                idx = order[b * args.batch_size:(b + 1) * args.batch_size]
                yield images[idx].float().div_(127.5).sub_(1), None

    dataloader = DeviceBatches()
else:
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                             num_workers=args.workers)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self, nz, ngf, nc):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),       # 4 x 4
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),  # 8 x 8
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),      # 16 x 16
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),           # 32 x 32
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self, ndf, nc, sigmoid=True):
        super().__init__()
        layers = [
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),                    # 16 x 16
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),               # 8 x 8
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),           # 4 x 4
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),                 # 1 x 1
        ]
        if sigmoid:
            layers.append(nn.Sigmoid())
        self.main = nn.Sequential(*layers)

    def forward(self, input):
        return self.main(input)


netG = Generator(args.nz, args.ngf, args.nc).to(device)
netG.apply(weights_init)
netD = Discriminator(args.ndf, args.nc, sigmoid=not args.logits).to(device)
netD.apply(weights_init)

criterion = nn.BCEWithLogitsLoss() if args.logits else nn.BCELoss()
fixed_noise = torch.randn(64, args.nz, 1, 1, device=device)
real_label, fake_label = 1.0, 0.0
if args.channels_last:
    netG, netD = netG.to(memory_format=torch.channels_last), netD.to(memory_format=torch.channels_last)
fused = {"fused": True} if args.fused else {}
optimizerD = optim.Adam(netD.parameters(), lr=args.lr, betas=(args.beta1, 0.999), **fused)
optimizerG = optim.Adam(netG.parameters(), lr=args.lr, betas=(args.beta1, 0.999), **fused)
autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
prob = torch.sigmoid if args.logits else (lambda x: x)

G_losses, D_losses = [], []
stats = torch.zeros(5, device=device)
iters = 0
print("Starting Training Loop...")
for epoch in range(args.epochs):
    for i, data in enumerate(dataloader, 0):
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real_cpu = data[0].to(device)
        b_size = real_cpu.size(0)
        label = torch.full((b_size,), real_label, dtype=torch.float, device=device)
        with autocast:
            output = netD(real_cpu).view(-1).float()
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = prob(output).mean()
        noise = torch.randn(b_size, args.nz, 1, 1, device=device)
        with autocast:
            fake = netG(noise)
            output = netD(fake.detach()).view(-1).float()
        label.fill_(fake_label)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = prob(output).mean()
        errD = errD_real + errD_fake
        optimizerD.step()

        # (2) Update G network: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        if args.freeze_d:
            netD.requires_grad_(False)
        with autocast:
            output = netD(fake).view(-1).float()
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = prob(output).mean()
        optimizerG.step()
        netD.requires_grad_(True)

        if args.no_item:
            stats += torch.stack([errD, errG, D_x, D_G_z1, D_G_z2]).detach()
            if i % 50 == 0:
                print("[%d/%d][%d/%d]\tLoss_D: %.4f\tLoss_G: %.4f\tD(x): %.4f\tD(G(z)): %.4f / %.4f"
                      % (epoch, args.epochs, i, len(dataloader), *(stats / max(i % 50, 1)).tolist()))
                stats.zero_()
        else:
            D_x, D_G_z1, D_G_z2 = D_x.item(), D_G_z1.item(), D_G_z2.item()
            if i % 50 == 0:
                print("[%d/%d][%d/%d]\tLoss_D: %.4f\tLoss_G: %.4f\tD(x): %.4f\tD(G(z)): %.4f / %.4f"
                      % (epoch, args.epochs, i, len(dataloader), errD.item(), errG.item(), D_x, D_G_z1, D_G_z2))
            G_losses.append(errG.item())
            D_losses.append(errD.item())
        iters += 1
