"""Prompt-lookup drafts (engine.speculative.spec_decode.ngram_propose): vLLM's NgramProposer rule -- the
longest suffix n-gram (n in [min, max]) with an earlier occurrence, its EARLIEST occurrence, and
up to k tokens that followed it -- by hand and against a brute-force reference."""
from __future__ import annotations

import random

import pytest

from engine.speculative.spec_decode import ngram_propose


def reference(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The rule written out directly: for n from hi down to lo, every window tokens[s:s+n] equal
    to the last n tokens with s + n <= len - 1 (something follows it), the smallest s wins."""
    length = len(tokens)
    if k == 0:
        return []
    for n in range(hi, lo - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n:]
        for s in range(0, length - n):
            if tokens[s:s + n] == suffix:
                return tokens[s + n:s + n + k]
    return []


def test_a_repeat_is_found_and_its_continuation_proposed():
    #        0  1  2  3  4  5  6  7  8
    tokens = [5, 6, 7, 8, 9, 1, 2, 5, 6]
    assert ngram_propose(tokens, 3) == [7, 8, 9]
    assert ngram_propose(tokens, 10) == [7, 8, 9, 1, 2, 5, 6]  # cut at the end of the context


def test_vllm_docstring_example():
    # vLLM's propose() docstring: [1,2,3,4,2,3], min 2, max 3, k 4 -> [4, 2, 3]
    assert ngram_propose([1, 2, 3, 4, 2, 3], 4, 2, 3) == [4, 2, 3]


def test_the_longest_n_gram_is_preferred():
    # suffix [1, 2, 3]: the 2-gram [2, 3] first occurs at 0 (-> 40), the 3-gram [1, 2, 3] at 3 (-> 50)
    tokens = [2, 3, 40, 1, 2, 3, 50, 9, 1, 2, 3]
    assert ngram_propose(tokens, 2, 2, 3) == [50, 9]
    assert ngram_propose(tokens, 2, 2, 2) == [40, 1]  # max 2: only 2-grams


def test_the_earliest_occurrence_wins():
    tokens = [1, 2, 10, 1, 2, 20, 1, 2]
    assert ngram_propose(tokens, 1) == [10]


def test_no_match_is_empty():
    assert ngram_propose([1, 2, 3, 4, 5], 3) == []
    assert ngram_propose([1, 2, 3, 1, 5, 3], 3) == []  # 1-grams repeat, but min is 2
    assert ngram_propose([1, 2, 3, 1, 5, 3], 3, 1, 4) == [1, 5, 3]  # with min 1, [3] at 2
    assert ngram_propose([], 3) == [] and ngram_propose([7], 3) == [] and ngram_propose([7, 7], 3) == []
    assert ngram_propose([1, 2, 1, 2], 0) == []


def test_the_match_is_never_the_suffix_itself_but_may_overlap_it():
    assert ngram_propose([3, 4, 3, 4], 2) == [3, 4]  # [3, 4] at 0, then [3, 4]
    assert ngram_propose([9, 9, 9], 4) == [9]  # [9, 9] at 0 overlaps the suffix at 1
    assert ngram_propose([1, 2, 3], 4) == []  # only the suffix itself


def test_matches_the_brute_force_reference():
    rng = random.Random(0)
    for trial in range(3000):
        length = rng.randrange(0, 40)
        vocab = rng.choice([2, 3, 5, 20])
        tokens = [rng.randrange(vocab) for _ in range(length)]
        lo = rng.randrange(1, 4)
        hi = rng.randrange(lo, 7)
        k = rng.randrange(0, 6)
        assert ngram_propose(tokens, k, lo, hi) == reference(tokens, k, lo, hi), (tokens, k, lo, hi)


def test_any_sequence_type_and_a_long_context():
    assert ngram_propose((1, 2, 9, 1, 2), 1) == [9]
    rng = random.Random(1)
    tokens = [rng.randrange(1000) for _ in range(4096)]
    tokens += tokens[100:104]  # a 4-gram from early in the context
    assert ngram_propose(tokens, 5) == tokens[104:109]
    same = [7] * 4096  # worst case for candidates: stops at the first full-length match
    assert ngram_propose(same, 4) == [7, 7, 7, 7]


@pytest.mark.parametrize("args, field", [
    ((-1, 2, 4), "k"), ((1.5, 2, 4), "k"), ((True, 2, 4), "k"),
    ((2, 0, 4), "prompt_lookup_min"), ((2, 2, 0), "prompt_lookup_max"),
    ((2, 5, 4), "prompt_lookup_min"),
])
def test_bad_arguments(args, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ngram_propose([1, 2, 3], *args)
