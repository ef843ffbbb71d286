"""A DCGAN on a folder of face images read by a Dataset of its own, the way people write one for CelebA or FFHQ:
the files listed once, each opened with PIL in `__getitem__` and put through the PyTorch DCGAN tutorial's transforms
(optionally with a random horizontal flip), no DataLoader workers, BCEWithLogitsLoss. Plain PyTorch, no gantools.

    python faces_folder.py --dataroot DIR [--flip] [--image-size 32] [--batch-size 64]
"""
import argparse
import os

import torch
import torch.nn as nn
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True, help="a folder of images (class sub-folders give labels)")
parser.add_argument("--image-size", type=int, default=32, help="G makes 32 x 32 images")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--nz", type=int, default=64, help="size of the latent vector")
parser.add_argument("--width", type=int, default=32, help="channels of G's last and D's first layer")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--flip", action="store_true", help="a random horizontal flip per image")
args = parser.parse_args()


class FaceFolder(Dataset):
    def __init__(self, root, transform=None):
        self.transform = transform
        self.files = []
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        for label, name in enumerate(classes):
            folder = os.path.join(root, name)
            for f in sorted(os.listdir(folder)):
                if f.lower().endswith((".png", ".jpg", ".jpeg")):
                    self.files.append((os.path.join(folder, f), label))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, idx):
        path, label = self.files[idx]
        img = Image.open(path).convert("RGB")
        if self.transform:
            img = self.transform(img)
        return img, label


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
transform = transforms.Compose([
    transforms.Resize(args.image_size),
    transforms.CenterCrop(args.image_size),
    *([transforms.RandomHorizontalFlip()] if args.flip else []),
    transforms.ToTensor(),
    transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
])
dataset = FaceFolder(args.dataroot, transform=transform)
dataloader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=0, drop_last=True)

w = args.width
generator = nn.Sequential(
    nn.ConvTranspose2d(args.nz, w * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(w * 4), nn.ReLU(True),   # 4 x 4
    nn.ConvTranspose2d(w * 4, w * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(w * 2), nn.ReLU(True),     # 8 x 8
    nn.ConvTranspose2d(w * 2, w, 4, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(True),             # 16 x 16
    nn.ConvTranspose2d(w, 3, 4, 2, 1, bias=False), nn.Tanh(),                                        # 32 x 32
).to(device)
discriminator = nn.Sequential(
    nn.Conv2d(3, w, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
    nn.Conv2d(w, w * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(w * 2), nn.LeakyReLU(0.2, inplace=True),
    nn.Conv2d(w * 2, w * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(w * 4), nn.LeakyReLU(0.2, inplace=True),
    nn.Conv2d(w * 4, 1, 4, 1, 0, bias=False), nn.Flatten(),
).to(device)
criterion = nn.BCEWithLogitsLoss()
opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))

for epoch in range(args.epochs):
    for imgs, _ in dataloader:
        real = imgs.to(device)
        ones = torch.ones(real.size(0), 1, device=device)
        zeros = torch.zeros(real.size(0), 1, device=device)
        fake = generator(torch.randn(real.size(0), args.nz, 1, 1, device=device))

        opt_d.zero_grad()
        loss_d = criterion(discriminator(real), ones) + criterion(discriminator(fake.detach()), zeros)
        loss_d.backward()
        opt_d.step()

        opt_g.zero_grad()
        loss_g = criterion(discriminator(fake), ones)
        loss_g.backward()
        opt_g.step()
    print(f"epoch {epoch}: loss_d {loss_d.item():.3f} loss_g {loss_g.item():.3f}")
