"""Exact rejection sampling (engine.speculative.spec_decode.rejection_sample): the emitted tokens follow the
target's distribution whatever the draft's, plus the edge cases, greedy rules and validation.

Statistical tests use Pearson's chi-square goodness of fit against the exact target law. Each
test compares the statistic with the chi-square critical value at significance 1e-4 for its
degrees of freedom (cells with expected count > 0, minus 1), computed below from the
regularised incomplete gamma function (no scipy here): for a correct sampler each comparison
fails with probability 1e-4 over the choice of seed, and this file makes 25 such comparisons,
so a correct implementation fails it for at most 25 * 1e-4 = 0.25% of seeds (union bound; the
one binomial check adds 1.1e-5). The
seeds are fixed, so a run is deterministic. Cells with expected count 0 must have observed
count exactly 0 (tested separately, and excluded from the degrees of freedom).

Volume (10^5 draws per case) goes through ``_rejection_core``, the vectorised core that
``rejection_sample`` itself calls with B = 1; test_public_function_equals_the_core checks that
the public function and the core agree draw for draw, and one chi-square test runs the public
function alone.
"""
from __future__ import annotations

import math

import pytest
import torch

from engine.core.config import SamplingParams
from engine.core.sampling import sample_one, sampling_probs
from engine.speculative.spec_decode import (
    RESIDUAL_TOP,
    RejectionResult,
    _draw,
    _rejection_core,
    one_hot_draft_probs,
    probs_from_logits,
    rejection_sample,
)

pytestmark = pytest.mark.usefixtures("torch_single_thread")

SIGNIFICANCE = 1e-4
N = 100_000


# -- chi-square without scipy -----------------------------------------------------------------

def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x): series below a + 1, Lentz continued fraction above."""
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return 1.0 - total * math.exp(log_front)
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(log_front) * h


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df)."""
    return _gamma_q(df / 2, x / 2)


def chi2_critical(df: int, significance: float = SIGNIFICANCE) -> float:
    """x with chi2_sf(x, df) == significance (bisection)."""
    lo, hi = 0.0, 10.0 * df + 100
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > significance else (lo, mid)
    return (lo + hi) / 2


def test_chi2_helper_matches_published_tables():
    assert chi2_critical(1, 0.05) == pytest.approx(3.841, abs=1e-3)
    assert chi2_critical(10, 0.01) == pytest.approx(23.209, abs=1e-3)
    assert chi2_critical(7, 1e-4) == pytest.approx(29.878, abs=1e-3)
    assert chi2_critical(63, 1e-4) == pytest.approx(113.6, abs=0.2)  # Wilson-Hilferty: 113.65


def assert_follows(tokens: torch.Tensor, probs: torch.Tensor, what: str) -> float:
    """Chi-square goodness of fit of integer samples ``tokens`` to ``probs`` [V]; returns the statistic."""
    probs = probs.double() / probs.double().sum()
    counts = torch.bincount(tokens.flatten(), minlength=probs.numel()).double()
    assert counts.numel() == probs.numel(), f"{what}: a sample outside the vocabulary"
    n = counts.sum()
    assert n > 1000, f"{what}: too few samples ({int(n)}) for the test"
    expected = probs * n
    zero = expected == 0
    assert counts[zero].sum() == 0, f"{what}: tokens with probability 0 were emitted: {counts[zero]}"
    stat = float(((counts[~zero] - expected[~zero]) ** 2 / expected[~zero]).sum())
    df = int((~zero).sum()) - 1
    assert float(expected[~zero].min()) >= 5, f"{what}: a cell too small for chi-square"
    assert stat < chi2_critical(df), f"{what}: chi2 {stat:.1f} >= critical {chi2_critical(df):.1f} (df {df})"
    return stat


# -- helpers: random p, q and many verifications through the core -----------------------------

def random_probs(rows: int, vocab: int, g: torch.Generator, top_k: int = 0) -> torch.Tensor:
    """Random distributions [rows, V] through the engine's own transform (T = 1, optional top-k)."""
    logits = torch.randn(rows, vocab, generator=g)
    return probs_from_logits(logits, 1.0, top_k, 1.0)


def core_samples(p: torch.Tensor, q: torch.Tensor | None, n: int, g: torch.Generator,
                 drafts: torch.Tensor | None = None, greedy: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n verifications of the same p [k+1, V] / q [k, V]: drafts x_i ~ q_i (or the fixed
    ``drafts`` [k]), then the core. -> tokens [n, k+1], num_accepted [n], drafts [n, k]."""
    k = p.shape[0] - 1
    vocab = p.shape[1]
    if drafts is None:
        assert q is not None
        x = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], dim=1) \
            if k else torch.zeros(n, 0, dtype=torch.int64)
    else:
        x = drafts.expand(n, k).clone()
    out_t, out_n = [], []
    for start in range(0, n, 25_000):  # chunks keep the [B, k+1, V] float64 copies small
        b = min(25_000, n - start)
        xb = x[start:start + b]
        qb = one_hot_draft_probs(xb, vocab) if q is None else q.expand(b, k, vocab)
        u = torch.rand(b, k, generator=g, dtype=torch.float64)
        e = torch.empty(b, vocab, dtype=torch.float64).exponential_(generator=g)
        tokens, num_acc, _, _ = _rejection_core(p.expand(b, k + 1, vocab), qb, xb, u, e, greedy)
        out_t.append(tokens)
        out_n.append(num_acc)
    return torch.cat(out_t), torch.cat(out_n), x


CASES = [(8, 1, 11), (12, 2, 12), (16, 4, 13), (10, 3, 14)]  # (V, k, seed)


@pytest.mark.parametrize("vocab, k, seed", CASES)
def test_every_emitted_position_follows_the_target(vocab, k, seed):
    """Position j's token, among the verifications that emit one there, follows p_j: the first
    emitted token follows p_1 (all n), and with each p_j fixed (not depending on the earlier
    tokens, as in this synthetic test) every later position follows its own p_j; the bonus
    position follows p_{k+1}. 4 cases x (k + 1) positions = 14 comparisons."""
    g = torch.Generator().manual_seed(seed)
    p = random_probs(k + 1, vocab, g)
    q = random_probs(k, vocab, g)
    tokens, num_acc, _ = core_samples(p, q, N, g)
    assert ((tokens >= 0).sum(-1) == num_acc + 1).all()
    for j in range(k + 1):
        emitted = tokens[:, j] >= 0
        assert_follows(tokens[emitted, j], p[j], f"position {j}")
    # power: the drafts alone (accept everything) are far from p, so the test can fail
    x = torch.multinomial(q[0], N, replacement=True, generator=g)
    counts = torch.bincount(x, minlength=vocab).double()
    stat = float(((counts - N * p[0].double()) ** 2 / (N * p[0].double())).sum())
    assert stat > 100 * chi2_critical(vocab - 1)


def test_sparse_distributions_after_top_k():
    """p and q truncated by top-k (zeros in both, different supports): zero-probability tokens
    are never emitted and every position follows p (3 comparisons)."""
    g = torch.Generator().manual_seed(21)
    p = random_probs(3, 16, g, top_k=6)
    q = random_probs(2, 16, g, top_k=5)
    tokens, _, _ = core_samples(p, q, N, g)
    for j in range(3):
        emitted = tokens[:, j] >= 0
        assert_follows(tokens[emitted, j], p[j], f"position {j}")


def test_joint_of_the_first_two_generated_tokens_is_p1_times_p2():
    """k = 2 over a generation: the first two tokens of the stream follow p1(t1) * p2(t2). When a
    step emits only one token, the next step (drafts from q2, q3; targets p2, p3, p4) supplies
    t2, as the engine would. p_n depends on the position n only. 1 comparison over V^2 = 64
    cells (63 degrees of freedom)."""
    vocab, k = 8, 2
    g = torch.Generator().manual_seed(31)
    p = random_probs(4, vocab, g)  # p1..p4 by absolute position
    q = random_probs(3, vocab, g)  # q1..q3
    tokens, num_acc, _ = core_samples(p[:3], q[:2], N, g)
    t1, t2 = tokens[:, 0].clone(), tokens[:, 1].clone()
    short = num_acc == 0  # only one token this step
    second, _, _ = core_samples(p[1:4], q[1:3], int(short.sum()), g)
    t2[short] = second[:, 0]
    assert (t2 >= 0).all()
    assert_follows(t1 * vocab + t2, torch.outer(p[0], p[1]).flatten(), "pair (t1, t2)")
    # and within one step, the second emitted token follows p2 whatever the first was
    two = num_acc >= 1
    assert_follows(tokens[two, 1], p[1], "second token of a step")


def test_public_function_follows_the_target():
    """The public function alone, 4,000 calls (V = 8, k = 2): the first emitted token follows p_1
    (1 comparison)."""
    g = torch.Generator().manual_seed(41)
    p = random_probs(3, 8, g)
    q = random_probs(2, 8, g)
    first = []
    for _ in range(4000):
        x = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
        first.append(rejection_sample(p, q, x, g).token_ids[0])
    assert_follows(torch.tensor(first), p[0], "first token (public function)")


@pytest.mark.parametrize("greedy", [False, True])
def test_public_function_equals_the_core(greedy):
    """Same draws -> same tokens: rejection_sample(seed s) equals the core batched over 300
    verifications fed the draws _draw makes for seed s."""
    g = torch.Generator().manual_seed(51)
    k, vocab = 3, 10
    p = random_probs(k + 1, vocab, g)
    q = random_probs(k, vocab, g)
    xs = torch.stack([torch.multinomial(q[i], 300, replacement=True, generator=g) for i in range(k)], dim=1)
    public, us, es = [], [], []
    for s in range(300):
        public.append(rejection_sample(p, q, xs[s], torch.Generator().manual_seed(s), greedy=greedy))
        u, e = _draw(k, vocab, torch.Generator().manual_seed(s))
        us.append(u)
        es.append(e)
    tokens, num_acc, _, _ = _rejection_core(p.expand(300, k + 1, vocab), q.expand(300, k, vocab), xs,
                                            torch.stack(us), torch.stack(es), greedy)
    for s, r in enumerate(public):
        assert r.num_accepted == int(num_acc[s])
        assert r.token_ids == tuple(t for t in tokens[s].tolist() if t >= 0)
    assert len({r.num_accepted for r in public}) > 1 or greedy  # both outcomes were exercised


# -- edge cases ---------------------------------------------------------------------------------

def test_q_equal_p_accepts_every_draft_and_the_bonus_follows_p_last():
    """q == p: p(x)/q(x) == 1 for every draft the draft could sample, so acceptance is exactly 1.0
    and the bonus token follows p_{k+1} (1 comparison)."""
    g = torch.Generator().manual_seed(61)
    k, vocab = 3, 12
    p = random_probs(k + 1, vocab, g)
    tokens, num_acc, x = core_samples(p, p[:k], N, g)
    assert (num_acc == k).all()
    assert torch.equal(tokens[:, :k], x)
    assert_follows(tokens[:, k], p[k], "bonus")
    r = rejection_sample(p, p[:k].clone(), x[0], g)
    assert r.outcomes == ("accepted",) * k and r.final_kind == "bonus" and r.accept_prob == (1.0,) * k


def test_disjoint_supports_reject_the_first_draft_and_recover_from_p():
    """q's support outside p's: p(x_1) == 0 rejects always; the residual max(0, p - q) is p itself
    (1 comparison)."""
    g = torch.Generator().manual_seed(71)
    vocab, k = 10, 2
    logits = torch.randn(k + 1, vocab, generator=g)
    logits[:, :4] = float("-inf")  # p on tokens 4..9
    p = logits.softmax(-1)
    q_logits = torch.randn(k, vocab, generator=g)
    q_logits[:, 4:] = float("-inf")  # q on tokens 0..3
    q = q_logits.softmax(-1)
    tokens, num_acc, _ = core_samples(p, q, N, g)
    assert (num_acc == 0).all()
    assert_follows(tokens[:, 0], p[0], "recovered")
    r = rejection_sample(p, q, [1, 2], g)
    assert r.outcomes == ("rejected", "unverified") and r.final_kind == "recovered"
    assert r.accept_prob[0] == 0.0 and r.draft_p[0] == 0.0
    assert [t for t, _ in r.residual_top] == torch.topk(p[0], RESIDUAL_TOP).indices.tolist()
    assert sum(v for _, v in r.residual_top) <= 1 + 1e-9


def test_one_hot_q_accepts_with_probability_p_of_the_draft():
    """draft_probs=None (n-gram): a fixed draft x is accepted with probability p(x): the count of
    acceptances is within 4.4 standard deviations of N p(x) (two-sided normal tail 1.1e-5); the
    recovered token follows p with x zeroed, and the first emitted token follows p (2 comparisons)."""
    g = torch.Generator().manual_seed(81)
    vocab = 8
    p = random_probs(2, vocab, g)
    x = int(torch.argmax(p[0]))  # a likely draft, so both outcomes are frequent
    tokens, num_acc, _ = core_samples(p, None, N, g, drafts=torch.tensor([x]))
    px = float(p[0, x])
    accepted = int((num_acc == 1).sum())
    assert abs(accepted - N * px) <= 4.4 * math.sqrt(N * px * (1 - px))
    residual = p[0].clone()
    residual[x] = 0
    assert_follows(tokens[num_acc == 0, 0], residual, "recovered (one-hot q)")
    # over drafts x ~ p itself (an oracle drafter), the emitted first token still follows p
    xs = torch.multinomial(p[0], N, replacement=True, generator=g)
    q1 = one_hot_draft_probs(xs[:, None], vocab)
    u = torch.rand(N, 1, generator=g, dtype=torch.float64)
    e = torch.empty(N, vocab, dtype=torch.float64).exponential_(generator=g)
    out, _, _, _ = _rejection_core(p.expand(N, 2, vocab), q1, xs[:, None], u, e, False)
    assert_follows(out[:, 0], p[0], "first token (one-hot q, drafts ~ p)")


def test_none_draft_probs_is_one_hot_q():
    """draft_probs=None gives exactly the result of an explicit one-hot q, draw for draw."""
    g = torch.Generator().manual_seed(91)
    p = random_probs(3, 9, g)
    for s in range(50):
        a = rejection_sample(p, None, [3, 5], torch.Generator().manual_seed(s))
        b = rejection_sample(p, one_hot_draft_probs(torch.tensor([3, 5]), 9), [3, 5], torch.Generator().manual_seed(s))
        assert a == b
        assert a.draft_q == (1.0, 1.0)


def test_q_zero_at_the_draft_rejects_and_an_empty_residual_samples_p():
    """q(x) == 0 rejects even when p(x) > 0. With p == q and q(x) == p(x) == 0 the residual is
    all zeros (measure zero for a draft sampled from q): the recovered token comes from p."""
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    for s in range(20):
        r = rejection_sample(p, q, [0], torch.Generator().manual_seed(s))
        assert r.outcomes == ("rejected",) and r.token_ids == (0,)  # residual (0.5, 0, 0, 0)
        assert r.accept_prob == (0.0,)
    q_same = p[:1].clone()
    seen = set()
    for s in range(40):
        r = rejection_sample(p, q_same, [3], torch.Generator().manual_seed(s))
        assert r.outcomes == ("rejected",) and r.final_kind == "recovered"
        seen.add(r.token_ids[0])
        assert r.residual_top == ((0, 0.5), (1, 0.5))  # p itself (the fallback); ties: lower id first
    assert seen == {0, 1}


def test_k_zero_samples_p1():
    """k == 0: one token from p_1 (1 comparison) and the record of an empty verification."""
    g = torch.Generator().manual_seed(101)
    p = random_probs(1, 10, g)
    tokens, num_acc, _ = core_samples(p, p[:0], N, g)
    assert (num_acc == 0).all()
    assert_follows(tokens[:, 0], p[0], "k = 0")
    r = rejection_sample(p, None, [], g)
    assert r.num_accepted == 0 and r.outcomes == () and r.final_kind == "bonus" and len(r.token_ids) == 1
    assert rejection_sample(p, None, [], None, greedy=True).token_ids == (int(p[0].argmax()),)


def test_the_record():
    """p, q, acceptance probabilities and the residual's top entries, checked by hand."""
    p = torch.tensor([[0.1, 0.6, 0.3, 0.0], [0.2, 0.2, 0.2, 0.4]])
    q = torch.tensor([[0.0, 0.2, 0.8, 0.0]])
    # x = 2: p/q = 0.375; residual max(0, p - q) = (0.1, 0.4, 0, 0) -> (0.2, 0.8)
    results = [rejection_sample(p, q, [2], torch.Generator().manual_seed(s)) for s in range(60)]
    assert all(r.draft_p == pytest.approx((0.3,)) and r.draft_q == pytest.approx((0.8,)) for r in results)
    assert all(r.accept_prob == pytest.approx((0.375,)) for r in results)
    rejected = [r for r in results if r.num_accepted == 0]
    accepted = [r for r in results if r.num_accepted == 1]
    assert rejected and accepted
    for r in rejected:
        assert [t for t, _ in r.residual_top] == [1, 0]
        assert [v for _, v in r.residual_top] == pytest.approx([0.8, 0.2])
        assert r.token_ids[0] in (0, 1) and r.rejected_at == 0 and r.token_kinds == ("recovered",)
    for r in accepted:
        assert r.token_ids[0] == 2 and r.residual_top == () and r.token_kinds == ("accepted", "bonus")
        assert r.rejected_at is None
    assert isinstance(results[0], RejectionResult)
    with pytest.raises(AttributeError):
        results[0].num_accepted = 3  # type: ignore[misc]  # frozen


# -- greedy -------------------------------------------------------------------------------------

def test_greedy_rules():
    p = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.0, 1.0]])  # ignored by greedy
    r = rejection_sample(p, q, [1, 0], None, greedy=True)
    assert r.token_ids == (1, 0, 2) and r.final_kind == "bonus" and r.num_accepted == 2
    r = rejection_sample(p, q, [1, 2], None, greedy=True)
    assert r.token_ids == (1, 0) and r.outcomes == ("accepted", "rejected") and r.final_kind == "recovered"
    r = rejection_sample(p, None, [0, 0], None, greedy=True)
    assert r.token_ids == (1,) and r.outcomes == ("rejected", "unverified")
    assert r.accept_prob == (0.0, 1.0) and r.residual_top == ()


def test_greedy_ties_take_the_lowest_index_like_the_engine_sampler():
    """Tied logits: probs_from_logits(T=0) is one-hot at torch.argmax (lowest index), the token
    engine/core/sampling.py's greedy path emits; a draft of the higher tied index is rejected."""
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [2.0, 2.0, 0.0, 0.0]])
    p = probs_from_logits(logits, 0.0, 0, 1.0)
    greedy = SamplingParams(temperature=0.0)
    assert [int(p[i].argmax()) for i in range(2)] == [sample_one(logits[i], greedy, None) for i in range(2)] == [1, 0]
    assert rejection_sample(p, None, [2], None, greedy=True).token_ids == (1,)
    assert rejection_sample(p, None, [1], None, greedy=True).token_ids == (1, 0)
    # on tied probabilities (not one-hot) the same rule
    flat = torch.full((2, 4), 0.25)
    assert rejection_sample(flat, None, [3], None, greedy=True).token_ids == (0,)
    # the sampled rule on one-hot p gives the greedy tokens too (p(x) is 1 or 0)
    for s in range(10):
        assert rejection_sample(p, None, [1], torch.Generator().manual_seed(s)).token_ids == (1, 0)


# -- reproducibility ----------------------------------------------------------------------------

def test_seeded_generator_replays_and_consumes_a_fixed_count():
    g = torch.Generator().manual_seed(111)
    p = random_probs(5, 16, g)
    q = random_probs(4, 16, g)
    runs = [[rejection_sample(p, q, [1, 2, 3, 4], gen) for _ in range(30)]
            for gen in (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))]
    assert runs[0] == runs[1]
    # the stream advances by the same amount whatever the outcome: k uniforms + V exponentials
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    rejection_sample(p, p[:4].clone(), [int(p[i].argmax()) for i in range(4)], a)  # all accepted
    rejection_sample(p, one_hot_draft_probs(torch.tensor([0, 0, 0, 0]), 16), [0, 0, 0, 0], b)
    assert torch.equal(a.get_state(), b.get_state())


# -- validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("target, draft, ids, field", [
    (torch.full((3,), 1 / 3), None, [], "target_probs"),  # 1-D
    (torch.full((3, 4), 0.25), None, [1], "target_probs"),  # k + 1 rows expected: 2
    (torch.full((2, 4), 0.25), torch.full((1, 5), 0.2), [1], "draft_probs"),  # V differs
    (torch.full((2, 4), 0.25), torch.full((2, 4), 0.25), [1], "draft_probs"),  # k rows expected
    (torch.full((2, 4), 0.25), None, [4], "draft_token_ids"),  # out of the vocabulary
    (torch.full((2, 4), 0.25), None, [-1], "draft_token_ids"),
    (torch.full((2, 4), 0.25), None, torch.tensor([1.0]), "draft_token_ids"),  # float ids
    (torch.full((2, 4), 0.25), None, torch.tensor([[1]]), "draft_token_ids"),  # 2-D ids
    (torch.randn(2, 4), None, [1], "target_probs"),  # logits, not probabilities
    (torch.full((2, 4), 0.25), torch.full((1, 4), 0.5), [1], "draft_probs"),  # rows sum to 2
    (torch.tensor([[0.5, 0.5, float("nan"), 0.0], [0.25] * 4]), None, [1], "target_probs"),
    (torch.full((2, 4), 1, dtype=torch.int64), None, [1], "target_probs"),  # not floating
    (torch.full((18, 4), 0.25), None, [0] * 17, "draft_token_ids"),  # k > 16
])
def test_bad_input_is_a_value_error_naming_the_argument(target, draft, ids, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        rejection_sample(target, draft, ids, None)


# -- the probability transform ------------------------------------------------------------------

def test_probs_from_logits_is_the_samplers_transform():
    g = torch.Generator().manual_seed(121)
    logits = torch.randn(4, 50, generator=g) * 3
    for t, top_k, top_p in [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.8), (0.8, 5, 0.9)]:
        params = SamplingParams(temperature=t, top_k=top_k, top_p=top_p)
        probs = probs_from_logits(logits, t, top_k, top_p)
        assert probs.shape == (4, 50) and probs.dtype == torch.float32
        for i in range(4):
            assert torch.equal(probs[i], sampling_probs(logits[i], params))
            # the engine's sampler draws from exactly these probabilities
            s = sample_one(logits[i], params, torch.Generator().manual_seed(i))
            assert s == int(torch.multinomial(probs[i], 1, generator=torch.Generator().manual_seed(i)))
        if top_k:
            assert int((probs > 0).sum(-1).max()) <= top_k
    greedy = probs_from_logits(logits, 0.0)
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.equal(greedy.sum(-1), torch.ones(4))
    assert probs_from_logits(logits[:0], 1.0).shape == (0, 50)


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1.0}, "temperature"), ({"temperature": 1.0, "top_k": -2}, "top_k"),
    ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
])
def test_probs_from_logits_bad_knobs(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        probs_from_logits(torch.zeros(2, 5), **kwargs)
    with pytest.raises(ValueError, match="^logits:"):
        probs_from_logits(torch.zeros(5), 1.0)
