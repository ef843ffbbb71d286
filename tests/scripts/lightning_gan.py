"""A GAN trained by Lightning's Trainer, in the shape of Lightning's own GAN example: a LightningModule with manual
optimization (`self.automatic_optimization = False`, `opt_g, opt_d = self.optimizers()`, `self.toggle_optimizer`,
`self.manual_backward`), G and D as `self.generator` and `self.discriminator` (MLPs, D ending in nn.Sigmoid, the loss
F.binary_cross_entropy), two Adam optimizers from `configure_optimizers`, and a LightningDataModule whose
`train_dataloader` reads an ImageFolder of PNGs. Plain PyTorch and Lightning, no gantools.

    python lightning_gan.py --dataroot DIR [--accelerator auto] [--max_epochs 5] [--batch_size 64] [--img_size 28]
"""
import argparse
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T


class ImageFolderData(L.LightningDataModule):
    def __init__(self, root, img_size, batch_size, num_workers):
        super().__init__()
        self.root, self.batch_size, self.num_workers = root, batch_size, num_workers
        self.transform = T.Compose([T.Grayscale(), T.Resize(img_size), T.CenterCrop(img_size), T.ToTensor(),
                                    T.Normalize((0.5,), (0.5,))])
        self.dims = (1, img_size, img_size)

    def setup(self, stage=None):
        self.train_set = torchvision.datasets.ImageFolder(self.root, transform=self.transform)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                                           num_workers=self.num_workers)


class Generator(nn.Module):
    def __init__(self, latent_dim, hidden, img_shape):
        super().__init__()
        self.img_shape = img_shape

        def layer(n_in, n_out, normalize=True):
            out = [nn.Linear(n_in, n_out)]
            if normalize:
                out.append(nn.BatchNorm1d(n_out, 0.8))
            out.append(nn.LeakyReLU(0.2, inplace=True))
            return out

        self.model = nn.Sequential(
            *layer(latent_dim, hidden, normalize=False),
            *layer(hidden, hidden * 2),
            *layer(hidden * 2, hidden * 4),
            nn.Linear(hidden * 4, math.prod(img_shape)),
            nn.Tanh(),
        )

    def forward(self, z):
        return self.model(z).view(z.size(0), *self.img_shape)


class Discriminator(nn.Module):
    def __init__(self, hidden, img_shape):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(math.prod(img_shape), hidden * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(hidden * 2, hidden),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(hidden, 1),
            nn.Sigmoid(),
        )

    def forward(self, img):
        return self.model(img.flatten(1))


class GAN(L.LightningModule):
    def __init__(self, img_shape, latent_dim=100, hidden=128, lr=2e-4, b1=0.5, b2=0.999):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim, hidden, img_shape)
        self.discriminator = Discriminator(hidden, img_shape)

    def forward(self, z):
        return self.generator(z)

    def adversarial_loss(self, y_hat, y):
        return F.binary_cross_entropy(y_hat, y)

    def training_step(self, batch, batch_idx):
        imgs, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(imgs.size(0), self.hparams.latent_dim).type_as(imgs)
        real = torch.ones(imgs.size(0), 1).type_as(imgs)
        fake = torch.zeros(imgs.size(0), 1).type_as(imgs)

        # the generator: make D call its images real
        self.toggle_optimizer(opt_g)
        generated = self(z)
        g_loss = self.adversarial_loss(self.discriminator(generated), real)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        # the discriminator: real images against the generator's
        self.toggle_optimizer(opt_d)
        real_loss = self.adversarial_loss(self.discriminator(imgs), real)
        fake_loss = self.adversarial_loss(self.discriminator(generated.detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)

    def configure_optimizers(self):
        lr, b1, b2 = self.hparams.lr, self.hparams.b1, self.hparams.b2
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d], []

    def on_train_epoch_end(self):
        seen = self.trainer.callback_metrics
        print("[Epoch %d/%d] [D loss: %f] [G loss: %f]"
              % (self.current_epoch, self.trainer.max_epochs, seen["d_loss"], seen["g_loss"]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataroot", required=True, help="a folder of class sub-folders of images")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--max_epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_workers", type=int, default=0)
    parser.add_argument("--img_size", type=int, default=28)
    parser.add_argument("--latent_dim", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()

    data = ImageFolderData(args.dataroot, args.img_size, args.batch_size, args.num_workers)
    model = GAN(data.dims, latent_dim=args.latent_dim, hidden=args.hidden)
    trainer = L.Trainer(max_epochs=args.max_epochs, accelerator=args.accelerator, devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, data)


if __name__ == "__main__":
    main()
