"""The PyTorch tutorial's DCGAN (beginner/dcgan_faces_tutorial) as a plain DistributedDataParallel script, the way
people write one when they outgrow a GPU: the process group from torchrun's environment, G and D each wrapped in
DDP, a DistributedSampler, and optional gradient accumulation over micro-batches. Plain PyTorch, no gantools. CPU
processes talk over gloo, GPUs over NCCL.

    torchrun --nproc_per_node 2 dcgan_ddp.py --dataroot DIR [--no-sampler] [--accum N] [--no-sync]
             [--find-unused] [--workers 0]
"""
import argparse
import contextlib
import os
import random

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import torchvision.datasets as dset
import torchvision.transforms as transforms
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--batch-size", type=int, default=128, help="per process")
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--nc", type=int, default=3)
parser.add_argument("--nz", type=int, default=100)
parser.add_argument("--ngf", type=int, default=64)
parser.add_argument("--ndf", type=int, default=64)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--beta1", type=float, default=0.5)
parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
parser.add_argument("--no-sampler", action="store_true", help="a plain shuffled DataLoader on every process")
parser.add_argument("--no-sync", action="store_true", help="no all-reduce for the micro-batches that do not step")
parser.add_argument("--find-unused", action="store_true", help="DDP(..., find_unused_parameters=True)")
args = parser.parse_args()

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ.get("LOCAL_RANK", 0))
device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
random.seed(999)
torch.manual_seed(999)

dataset = dset.ImageFolder(root=args.dataroot,
                           transform=transforms.Compose([
                               transforms.Resize(args.image_size),
                               transforms.CenterCrop(args.image_size),
                               transforms.ToTensor(),
                               transforms.Normalize((0.5,) * args.nc, (0.5,) * args.nc),
                           ]))
sampler = None if args.no_sampler else DistributedSampler(dataset, shuffle=True)
dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None,
                                         sampler=sampler, num_workers=args.workers, drop_last=True)


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
    def __init__(self, ndf, nc):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),                    # 16 x 16
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),               # 8 x 8
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),           # 4 x 4
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),                 # 1 x 1
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input)


generator = Generator(args.nz, args.ngf, args.nc).to(device)
generator.apply(weights_init)
discriminator = Discriminator(args.ndf, args.nc).to(device)
discriminator.apply(weights_init)
device_ids = [local_rank] if cuda else None
netG = DDP(generator, device_ids=device_ids, find_unused_parameters=args.find_unused)
netD = DDP(discriminator, device_ids=device_ids, find_unused_parameters=args.find_unused)

criterion = nn.BCELoss()
real_label, fake_label = 1.0, 0.0
optimizerD = optim.Adam(netD.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=args.lr, betas=(args.beta1, 0.999))


def skip_sync(model, last):
    """DDP's no_sync() for a micro-batch that does not step (with --no-sync); a plain block otherwise."""
    return model.no_sync() if args.no_sync and not last else contextlib.nullcontext()


if rank == 0:
    print(f"Starting Training Loop on {world_size} processes...")
for epoch in range(args.epochs):
    if sampler is not None:
        sampler.set_epoch(epoch)
    for i, data in enumerate(dataloader, 0):
        real_cpu = data[0].to(device)
        micro = real_cpu.size(0) // args.accum

        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z))), over accum micro-batches
        netD.zero_grad()
        for k in range(args.accum):
            real = real_cpu[k * micro:(k + 1) * micro]
            label = torch.full((micro,), real_label, dtype=torch.float, device=device)
            with skip_sync(netD, last=False):  # D's real half never steps alone
                output = netD(real).view(-1)
                errD_real = criterion(output, label) / args.accum
                errD_real.backward()
            noise = torch.randn(micro, args.nz, 1, 1, device=device)
            fake = netG(noise)
            label.fill_(fake_label)
            with skip_sync(netD, last=k == args.accum - 1):
                output = netD(fake.detach()).view(-1)
                errD_fake = criterion(output, label) / args.accum
                errD_fake.backward()
            errD = errD_real + errD_fake
        optimizerD.step()

        # (2) Update G network: maximize log(D(G(z))), over accum micro-batches
        netG.zero_grad()
        for k in range(args.accum):
            label = torch.full((micro,), real_label, dtype=torch.float, device=device)
            noise = torch.randn(micro, args.nz, 1, 1, device=device)
            with skip_sync(netG, last=k == args.accum - 1), skip_sync(netD, last=k == args.accum - 1):
                output = netD(netG(noise)).view(-1)
                errG = criterion(output, label) / args.accum
                errG.backward()
        optimizerG.step()

        if i % 50 == 0 and rank == 0:
            print("[%d/%d][%d/%d]\tLoss_D: %.4f\tLoss_G: %.4f"
                  % (epoch, args.epochs, i, len(dataloader), errD.item(), errG.item()))

dist.destroy_process_group()
