"""The doctor's finding about a gradient penalty taken at every D step (`penalties` sees and times it), and lazy
regularisation, its alternative: StyleGAN2 (Karras et al. 2020, "Analyzing and Improving the Image Quality of
StyleGAN", section 3.1 and appendix B) computes R1 only once every k = 16 minibatches, in a D step of its own,
weighted by k so that on average it pulls as hard, and corrects that optimizer for the extra step it takes every k
(`lazy_adam`). Lazy regularisation changes what your loop computes, by design: the finding says so, and `--try`
holds it to finite losses only (`lazy.LazyPenalty`), FID being its quality check (`--fid`)."""
from __future__ import annotations

from ...core.losses import LAZY_INTERVAL
from ...core.techniques import GAN_VARIANTS
from ...measuring.protocol import amdahl
from ..watching.frames import shown
from ..watching.penalties import PENALTY
from .report import MIN_GAIN, MIN_SHARE, DoctorReport, Finding

LEARN = GAN_VARIANTS.removesuffix(".ipynb")  # R1 and its lazy form in gantools' trainer (`r1_interval`)


def lazy_adam(lr: float, betas: tuple, k: int = LAZY_INTERVAL) -> tuple[float, tuple]:
    """StyleGAN2's correction of an Adam that takes a regularisation step of its own every `k` steps: k + 1 steps
    where there were k, so each is made smaller and its moments decay per minibatch as before.

    Args:
        lr: the optimizer's learning rate.
        betas: its (beta1, beta2).
        k: the lazy interval.

    Returns:
        (lr * c, (beta1 ** c, beta2 ** c)) with c = k / (k + 1) (stylegan2-ada-pytorch's `mb_ratio`).
    """
    c = k / (k + 1)
    return lr * c, tuple(b ** c for b in betas)


def gradient_penalty_every_step(r: DoctorReport, facts) -> Finding | None:
    gp = r.settings.get("gradient_penalty") or {}
    ms, step = r.phases_ms.get(PENALTY, 0.0), r.step_time_ms
    d_opt = r.optimizers.get("D", {})
    d_steps = d_opt.get("steps_per_iteration") or 1.0  # rounded to 0.01 (`analysis.analyse`)
    if not gp or gp["calls_per_iteration"] < d_steps - 0.01 or ms / step < MIN_SHARE:
        return None
    k = LAZY_INTERVAL
    gain = amdahl(step, ms * (1 - 1 / k))
    if gain < MIN_GAIN:
        return None
    d = r.models.get("D", {}).get("name", "D")
    sites = "; ".join(f"{x['where']} `{x['code']}` ({x['per_step']:g}/it)" for x in gp["sites"][:3])
    return Finding(
        "gradient-penalty-every-step", f"{d}'s gradient penalty is computed at every D step",
        f"torch.autograd.grad(create_graph=True) on {d}'s input at every D step ({_times(gp['calls_per_iteration'])} "
        f"per iteration, {d} stepping {_times(d_steps)}): {sites}; the gradient through {d} and its own backward (the "
        f"double backward) take {ms:.1f} ms of a {step:.1f} ms iteration ({100 * ms / step:.0f}%; {d}'s forward on "
        "the penalty's input and its first-order backward not counted)",
        f"a gradient penalty (R1, R2, WGAN-GP's) differentiates {d} twice at every D step. StyleGAN2's lazy "
        f"regularisation (Karras et al. 2020, sec. 3.1 and appendix B) computes R1 once every {k} D steps instead, "
        f"weighted by {k}, in a step of its own, with D's Adam corrected for that extra step (lr * c, betas ** c, "
        f"c = {k}/{k + 1}), and reports that it does not hurt the results. It changes what your loop computes, by "
        "design: hold it to FID (gantools doctor --try --fid). No paper measured WGAN-GP's penalty, its critic's "
        "only Lipschitz constraint, taken lazily. The estimate assumes the penalty's measured time is spent once in "
        f"{k} D steps",
        _change(r, gp, d, k), LEARN, gain)


def _times(n: float) -> str:
    return "once" if n == 1 else f"{n:g} times"


def _change(r: DoctorReport, gp: dict, d: str, k: int) -> str:
    """StyleGAN2's recipe in your names: your penalty's line, D's optimizer at its line with the corrected values."""
    site = gp["sites"][0]
    at = f"{shown(site['at'][0])}:{site['at'][1]}" if site.get("at") else site["where"]
    o = r.optimizers.get("D", {})
    name, cls, settings = o.get("name", "optimizerD"), o.get("class", "Adam"), o.get("settings", {})
    lr, betas = settings.get("lr"), settings.get("betas")
    if isinstance(lr, float) and isinstance(betas, (list, tuple)) and all(isinstance(b, float) for b in betas):
        new_lr, new_betas = lazy_adam(lr, tuple(betas), k)
        values = f"lr={new_lr:.3g}, betas=({', '.join(f'{b:.4g}' for b in new_betas)})"
    else:
        values = f"lr=lr * {k} / {k + 1}, betas=(beta1 ** ({k} / {k + 1}), beta2 ** ({k} / {k + 1}))"
    built = o.get("built_at")
    where = f"  # at {shown(built[0])}:{built[1]}: lr * c, betas ** c" if built else "  # lr * c, betas ** c"
    return (f"# every D step: D's loss without the penalty; every {k}th D step, the penalty in a step of its own:\n"
            "d_steps = 0  # before the loop; d_steps += 1 at each D step (or your own count of D steps)\n"
            f"if d_steps % {k} == 0:\n"
            f"    {name}.zero_grad()\n"
            f"    # your penalty's lines, on a {d} call of their own: {at}\n"
            f"    #   {site['code']}\n"
            "    penalty = ...  # the value those lines compute\n"
            f"    ({k} * penalty).backward()  # weighted by {k}: as strong on average\n"
            f"    {name}.step()\n"
            f"# {d}'s optimizer, for the {k + 1} steps it now takes every {k} D steps (c = {k}/{k + 1}):\n"
            f"{name} = torch.optim.{cls}(..., {values}){where}\n"
            f"# or the penalty added to D's loss every {k}th D step, times {k}, with no step of its own and no "
            "correction: what --try measures")


RULES = (gradient_penalty_every_step,)
