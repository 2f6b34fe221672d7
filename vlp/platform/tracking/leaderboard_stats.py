"""The leaderboard's statistics: a line's mean and 95% t-interval over its seeds, a pooled
noise estimate for lines with one seed, and the one rule that marks a line as not
distinguishable from the best (Welch's two-sided t-test at 5%).

    est = estimate([160.0, 165.0, 170.0])      # Estimate(n=3, mean=165.0, var_mean=8.33, df=2)
    est.ci95()                                 # 4.303 · 5 / √3 = 12.42
    welch_p(est, estimate([150.0, 152.0, 154.0]))   # two-sided p of "same mean"

No scipy: Student's t distribution from the regularized incomplete beta function (a
continued fraction), which is all the leaderboard needs and keeps `vlp leaderboard` light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

ALPHA = 0.05            # two-sided: 95% intervals, 5% tests


@dataclass(frozen=True)
class Estimate:
    """A line's mean and the variance of that mean, with the degrees of freedom of the
    variance (0 = no estimate of the noise: no interval, no test)."""
    n: int
    mean: float
    var_mean: float = 0.0
    df: float = 0.0
    pooled: bool = False          # the variance came from other lines' replicates

    def ci95(self) -> float | None:
        """Half-width of the 95% t-interval; None without a noise estimate."""
        if self.df <= 0:
            return None
        return t_quantile(1 - ALPHA / 2, self.df) * math.sqrt(self.var_mean)


def sample_var(values: Sequence[float]) -> float:
    m = sum(values) / len(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def estimate(values: Sequence[float], pooled: tuple[float, float] | None = None) -> Estimate:
    """``values``: a line's per-seed results. With one value, ``pooled`` = (variance of one
    result, its degrees of freedom) from the replicated lines stands in for the spread."""
    n = len(values)
    if n == 0:
        raise ValueError("estimate of no values")
    mean = sum(values) / n
    if n >= 2:
        return Estimate(n, mean, sample_var(values) / n, n - 1.0)
    if pooled is not None and pooled[1] > 0:
        return Estimate(n, mean, pooled[0] / n, pooled[1], pooled=True)
    return Estimate(n, mean)


def pooled_variance(groups: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """(variance of one result, degrees of freedom) pooled over the groups with two or more
    values: Σ (n_i − 1) s_i² / Σ (n_i − 1). None when no group has replicates."""
    groups = [g for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in groups)
    if df == 0:
        return None
    return sum((len(g) - 1) * sample_var(g) for g in groups) / df, float(df)


def welch_p(a: Estimate, b: Estimate) -> float | None:
    """Two-sided p-value of Welch's t-test of equal means (Welch–Satterthwaite degrees of
    freedom); None when either side has no noise estimate."""
    if a.df <= 0 or b.df <= 0:
        return None
    se2 = a.var_mean + b.var_mean
    if se2 <= 0:
        return 1.0 if a.mean == b.mean else 0.0
    t = abs(a.mean - b.mean) / math.sqrt(se2)
    df = se2 ** 2 / (a.var_mean ** 2 / a.df + b.var_mean ** 2 / b.df)
    return t_two_sided_p(t, df)


def indistinguishable(a: Estimate, best: Estimate) -> bool | None:
    """The leaderboard's rule: ``a`` is not distinguishable from the best line when Welch's
    two-sided test does not reject equal means at 5%. None: no noise estimate, no verdict."""
    p = welch_p(a, best)
    return None if p is None else p >= ALPHA


# ---- Student's t --------------------------------------------------------------------------------

def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for T ~ Student's t with ``df`` degrees of freedom: I_x(df/2, 1/2) at
    x = df / (df + t²)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t: bisection on the two-sided tail."""
    if not 0.5 < q < 1.0:
        raise ValueError(f"quantile must be in (0.5, 1), got {q}")
    tail = 2.0 * (1.0 - q)
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), by its continued fraction (modified Lentz),
    on the side of x where the fraction converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h
