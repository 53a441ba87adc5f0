#!/usr/bin/env python3
"""Writes input.txt: a deterministic text of about 3 MB for the word-count
example. Words are drawn from a 5,000-word made-up vocabulary with a Zipf
distribution (a few words very common, most rare), with capitals and
punctuation so that tokenizing matters. Same output on every machine."""
import sys

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "be", "da", "fe", "gi", "ho", "ju", "pe", "qua", "ri", "su", "te", "wo"]


def lcg(seed):
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield state >> 11


def main(path="input.txt", target_bytes=3_000_000):
    rng = lcg(844)
    vocab = []
    for i in range(5000):
        n, w = i, ""
        while True:
            w += SYLLABLES[n % len(SYLLABLES)]
            n //= len(SYLLABLES)
            if n == 0:
                break
        vocab.append(w)
    # Zipf(1) by inverse CDF over precomputed cumulative weights.
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    total = sum(weights)
    cdf, acc = [], 0.0
    for w in weights:
        acc += w / total
        cdf.append(acc)

    def word():
        u = next(rng) / float(1 << 53)
        lo, hi = 0, len(cdf) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if cdf[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        return vocab[lo]

    out, size = [], 0
    while size < target_bytes:
        n = 6 + next(rng) % 10
        words = [word() for _ in range(n)]
        words[0] = words[0].capitalize()
        if next(rng) % 7 == 0:
            words[n // 2] += ","
        line = " ".join(words) + ("." if next(rng) % 3 else "!") + "\n"
        out.append(line)
        size += len(line)
    with open(path, "w") as f:
        f.writelines(out)


if __name__ == "__main__":
    main(*sys.argv[1:2])
