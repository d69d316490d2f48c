"""Pearson's chi-square test for the distribution tests of speculative decoding (issue 21).

P_VALUE_THRESHOLD: a test passes when the p-value is at least 1e-3. The tests run with fixed
seeds (deterministic); a correct rule gives p ~ U(0, 1) over seeds, a broken acceptance rule
p < 1e-30 at the tests' sample sizes, so the threshold separates them by many orders of
magnitude while a correct run fails it one time in a thousand seeds.
"""

import torch

P_VALUE_THRESHOLD = 1e-3
MIN_EXPECTED_COUNT = 5


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Counts [C] against probabilities [C]; cells expected below MIN_EXPECTED_COUNT are pooled
    into one; a count where the target puts no mass fails at once."""
    total = observed.sum()
    expected = expected_probs.double() * total
    small = expected < MIN_EXPECTED_COUNT
    obs = torch.cat([observed[~small].double(), observed[small].double().sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    assert (obs[~keep] == 0).all(), "a count where the target puts no mass"
    statistic = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         statistic / 2))
