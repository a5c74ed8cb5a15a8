"""Orthonormal Hadamard matrices of the sizes models have, for rotations (transforms/hadamard_rotations.py).

A Hadamard matrix ``H`` of order ``n`` has entries +-1 and ``H H^T = n I``; ``H / sqrt(n)`` is
orthogonal and spreads every coordinate over all ``n``, which is why rotating a weight's input
space by it flattens outlier channels before rounding. Orders are built as Kronecker products
``H_m (x) H_{2^k}`` (Sylvester doubling) from a base order ``m`` that Paley's constructions give
for a prime ``q``:

- Paley I: order ``q + 1`` for ``q = 3 (mod 4)`` (12, 20, 44, 60, 68, 84, 108, 132, 140, ...);
- Paley II: order ``2 (q + 1)`` for ``q = 1 (mod 4)`` (12, 28, 36, 60, 76, 108, 148, ...).

So 576 = 36 x 16 (SmolLM2's hidden size), 640 = 20 x 32, 3584 = 28 x 128, 11008 = 5504 x 2 and
every power of two are covered; an order with no such decomposition (e.g. 172 = 43 x 4, or 100)
is refused by ``hadamard_base``. Prime powers, which Paley's constructions also allow, are left out: they
need finite-field arithmetic and no hidden size seen so far asks for them.
"""

from __future__ import annotations

import functools

import torch


def _is_prime(q: int) -> bool:
    return q > 1 and all(q % d for d in range(2, int(q ** 0.5) + 1))


def _jacobsthal(q: int) -> torch.Tensor:
    """``Q[i, j] = chi(j - i)`` with ``chi`` the quadratic character mod the prime ``q``."""
    squares = {(x * x) % q for x in range(1, q)}
    chi = torch.tensor([0] + [1 if a in squares else -1 for a in range(1, q)], dtype=torch.float64)
    idx = torch.arange(q)
    return chi[(idx[None, :] - idx[:, None]) % q]


def _paley_kind(m: int) -> str | None:
    """Which construction gives order ``m``: "trivial" (1, 2), "I", "II", or None."""
    if m in (1, 2):
        return "trivial"
    if _is_prime(m - 1) and (m - 1) % 4 == 3:
        return "I"
    if m % 2 == 0 and _is_prime(m // 2 - 1) and (m // 2 - 1) % 4 == 1:
        return "II"
    return None


def _paley_base(m: int) -> torch.Tensor:
    """A Hadamard matrix of order ``m`` from Paley's constructions over a prime (``_paley_kind``)."""
    kind = _paley_kind(m)
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if m == 2:
        return torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    q = m - 1
    if kind == "I":   # I + [[0, 1^T], [-1, Q]]
        s = torch.zeros(m, m, dtype=torch.float64)
        s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, _jacobsthal(q)
        return torch.eye(m, dtype=torch.float64) + s
    if kind == "II":
        q = m // 2 - 1
        c = torch.zeros(m // 2, m // 2, dtype=torch.float64)
        c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, 1.0, _jacobsthal(q)
        zero = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
        sign = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
        return torch.kron(c, sign) + torch.kron((c == 0).double(), zero)
    raise ValueError(f"no Paley construction of order {m}")


def hadamard_base(n: int) -> int | None:
    """The smallest base order ``m`` with ``n = m * 2^k`` and a Paley matrix of order ``m``, or None where quantkit builds no Hadamard matrix of order ``n``.

    >>> hadamard_base(576), hadamard_base(4096), hadamard_base(11008), hadamard_base(172)
    (36, 1, 5504, None)
    """
    if n < 1:
        return None
    odd = n
    while odd % 2 == 0:
        odd //= 2
    m = odd   # the smallest base first: the most of the matrix is Sylvester's
    while m <= n:
        if _paley_kind(m) is not None:
            return m
        m *= 2
    return None


@functools.lru_cache(maxsize=16)
def _hadamard(n: int) -> torch.Tensor:
    m = hadamard_base(n)
    if m is None:
        raise ValueError(f"no Hadamard matrix of order {n} (not 2^k times a Paley order)")
    h = _paley_base(m)
    sylvester = torch.ones(1, 1, dtype=torch.float64)
    for _ in range((n // m).bit_length() - 1):
        sylvester = torch.kron(sylvester, torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64))
    return torch.kron(h, sylvester)


def hadamard(n: int, seed: int | None = None) -> torch.Tensor:
    """An orthogonal ``[n, n]`` float64 matrix ``diag(s) H / sqrt(n)``: ``s`` random signs drawn
    from ``seed`` (QuaRot's randomised Hadamard), all +1 when ``seed`` is None."""
    return signed_hadamard(signs(n, seed))


def signs(n: int, seed: int | None) -> torch.Tensor:
    """``n`` random signs (float64 +-1) drawn from ``seed``; all +1 when ``seed`` is None."""
    if seed is None:
        return torch.ones(n, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=g, dtype=torch.float64) * 2 - 1


def signed_hadamard(s: torch.Tensor) -> torch.Tensor:
    """``diag(s) H / sqrt(n)`` for signs ``s`` of length ``n``."""
    n = s.numel()
    return s.double()[:, None] * (_hadamard(n) / n ** 0.5)
