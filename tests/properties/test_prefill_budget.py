"""The prefill adder's budget (properties/machine.py `fit_to_pages`): a batch entry
takes no more new pages than are left, and one cut short is the longest chunk that
fits, ending on a page boundary."""

from hypothesis import given
from hypothesis import strategies as st

from properties.machine import fit_to_pages
from reference.layout import new_pages


def _pages(start, add, ps):
    return new_pages(start, start + add, ps)


def test_an_entry_that_fits_is_taken_whole():
    assert fit_to_pages(0, 10, 3, 4) == (10, 0)
    assert fit_to_pages(0, 10, 5, 4) == (10, 2)
    assert fit_to_pages(5, 3, 0, 4) == (3, 0)  # the prefix's partial last page has room


def test_an_entry_that_does_not_fit_is_cut_at_a_page_boundary():
    assert fit_to_pages(0, 20, 3, 4) == (12, 0)
    assert fit_to_pages(5, 10, 1, 4) == (7, 0)  # 3 on the prefix's last page, then one page
    assert fit_to_pages(5, 10, 0, 4) == (3, 0)
    assert fit_to_pages(8, 1, 0, 4) == (0, 0)  # an aligned prefix and no page left: nothing


def test_page_size_1_counts_tokens():
    assert fit_to_pages(7, 5, 3, 1) == (3, 0)
    assert fit_to_pages(7, 5, 9, 1) == (5, 4)


@given(st.integers(0, 500), st.integers(1, 500), st.integers(0, 50), st.sampled_from([1, 2, 3, 16, 48, 256]))
def test_budget_is_kept_and_a_chunk_is_the_longest_that_fits(start, add, pages, ps):
    tokens, left = fit_to_pages(start, add, pages, ps)
    assert 0 <= tokens <= add
    assert _pages(start, tokens, ps) == pages - left and left >= 0
    if tokens < add:
        assert left == 0
        assert _pages(start, tokens + 1, ps) > pages  # one more token needs another page
