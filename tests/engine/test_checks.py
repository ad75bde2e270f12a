"""engine/core/checks.py: one form for argument errors, TypeError for a wrong type and ValueError for a wrong value."""

import numpy as np
import pytest

from engine.core.checks import check_choice, check_int, check_rank


class TestCheckInt:
    def test_numpy_integers_are_ints(self):
        value = check_int("batch_size", np.int64(8), minimum=1)
        assert value == 8 and type(value) is int

    @pytest.mark.parametrize("value", ["8", 8.0, True, None, [8]])
    def test_a_wrong_type_is_a_type_error(self, value):
        with pytest.raises(TypeError, match=r"batch_size should be a positive integer, but got batch_size="):
            check_int("batch_size", value, minimum=1)

    @pytest.mark.parametrize(("minimum", "words"), [(1, "a positive integer"), (0, "a non-negative integer"),
                                                    (2, "an integer >= 2")])
    def test_a_value_below_the_minimum_is_a_value_error_in_torchs_form(self, minimum, words):
        with pytest.raises(ValueError, match=rf"^epochs should be {words}, but got epochs=-1$"):
            check_int("epochs", -1, minimum=minimum)


def test_check_rank_and_check_choice():
    assert check_rank(np.int64(1), 2) == (1, 2)
    with pytest.raises(ValueError, match=r"rank should be in \[0, num_replicas=2\), but got rank=2"):
        check_rank(2, 2)
    with pytest.raises(ValueError, match="num_replicas should be a positive integer, but got num_replicas=0"):
        check_rank(0, 0)
    assert check_choice("uneven", "pad", ("pad", "drop")) == "pad"
    with pytest.raises(ValueError, match="uneven should be one of 'pad', 'drop', but got uneven='spread'"):
        check_choice("uneven", "spread", ("pad", "drop"))
