"""training/step.py's choice of the largest batch: the fewest batches an optimizer step can be made of."""

import math

import pytest

from training.step import fewest_batches


@pytest.mark.parametrize("limit", [25000, 24999, 12500, 9000, 4096, 391])
def test_the_batch_is_the_largest_even_share_of_the_step_that_fits(limit):
    """Against the definition: the largest ceil(25,000 / k) at most `limit`, found in O(log 64) trials."""
    tried = []

    def fits(tokens):
        tried.append(tokens)
        return tokens <= limit

    expected = max(math.ceil(25000 / k) for k in range(1, 65) if math.ceil(25000 / k) <= limit)
    assert fewest_batches(25000, fits) == expected
    assert len(tried) <= 7


def test_a_step_of_which_not_even_a_64th_fits_is_a_one_line_error():
    with pytest.raises(SystemExit, match="^error: not even a batch of 391 tokens fits this device's memory"):
        fewest_batches(25000, lambda tokens: tokens < 391)
