"""A training loop that fails at its third step, the way real scripts fail: inside a helper of their own."""
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def check(loss, step):
    if step == 2:
        raise ValueError(f"loss {loss.item():.3f} at step {step}: something in my script is wrong")


def train_step(step):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    check(loss, step)


for step in range(100):
    train_step(step)
