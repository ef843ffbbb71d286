"""A DCGAN trained with Hugging Face Accelerate, the way its examples write a loop: an Accelerator, G, D, both
optimizers and the DataLoader through accelerator.prepare, accelerator.backward for each loss, the loop in main().
Plain PyTorch and Accelerate, no gantools.

    python accelerate_dcgan.py --dataroot DIR [--cpu] [--mixed_precision no|fp16|bf16] [--batch_size 64] [--ngf 64]
"""
import argparse

import torch
import torch.nn as nn
import torchvision.datasets as dset
import torchvision.transforms as transforms
from accelerate import Accelerator
from accelerate.utils import set_seed


class Generator(nn.Module):
    def __init__(self, nz, ngf, nc):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, ndf, nc):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),
        )

    def forward(self, x):
        return self.main(x).view(-1)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


def training_function(args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    set_seed(args.seed)

    dataset = dset.ImageFolder(
        root=args.dataroot,
        transform=transforms.Compose([
            transforms.Resize(args.image_size),
            transforms.CenterCrop(args.image_size),
            transforms.ToTensor(),
            transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        ]),
    )
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                             num_workers=args.num_workers, drop_last=True)

    netG = Generator(args.nz, args.ngf, 3)
    netG.apply(weights_init)
    netD = Discriminator(args.ndf, 3)
    netD.apply(weights_init)
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=args.lr, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=args.lr, betas=(0.5, 0.999))

    netG, netD, optimizerG, optimizerD, dataloader = accelerator.prepare(
        netG, netD, optimizerG, optimizerD, dataloader
    )

    for epoch in range(args.num_epochs):
        for step, (real, _) in enumerate(dataloader):
            b_size = real.size(0)

            # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
            optimizerD.zero_grad()
            label = torch.full((b_size,), 1.0, device=accelerator.device)
            output = netD(real)
            errD_real = criterion(output, label)
            accelerator.backward(errD_real)

            noise = torch.randn(b_size, args.nz, 1, 1, device=accelerator.device)
            fake = netG(noise)
            label.fill_(0.0)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            accelerator.backward(errD_fake)
            optimizerD.step()

            # (2) Update G: maximize log(D(G(z)))
            optimizerG.zero_grad()
            label.fill_(1.0)
            output = netD(fake)
            errG = criterion(output, label)
            accelerator.backward(errG)
            optimizerG.step()

            if step % args.log_every == 0:
                accelerator.print(
                    f"epoch {epoch} step {step}: loss_D {(errD_real + errD_fake).item():.4f} "
                    f"loss_G {errG.item():.4f}"
                )

    accelerator.wait_for_everyone()
    if args.output_dir:
        accelerator.save(accelerator.unwrap_model(netG).state_dict(), f"{args.output_dir}/netG.pt")


def main():
    parser = argparse.ArgumentParser(description="A simple DCGAN training script with Accelerate.")
    parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"],
                        help="Whether to use mixed precision. Choose between fp16 and bf16 (bfloat16).")
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--num_epochs", type=int, default=25)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_workers", type=int, default=0)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--nz", type=int, default=100)
    parser.add_argument("--ngf", type=int, default=64)
    parser.add_argument("--ndf", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--log_every", type=int, default=50)
    parser.add_argument("--output_dir", type=str, default=None)
    args = parser.parse_args()
    training_function(args)


if __name__ == "__main__":
    main()
