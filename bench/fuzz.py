"""Hostile input at scale: ≥ 200k mutated messages over the recorded corpora of every format.

The harness and the seeded mutator are ``tests/formats/fuzz_corpus.py`` (the suite's
``test_fuzz.py`` runs the same on 15k messages); this script puts ``tests/formats`` on ``sys.path`` to
import it. Every message is decoded alone, with ``ignore-parse-errors`` and a dead-letter list, and
the script prints what became of them and checks (exit status 1 when one fails):

- raw exceptions: 0 (a message that raised instead of ending as an outcome);
- messages slower than ``--slow-ms`` (100 ms): 0, the slowest named;
- accounting: messages == with changes + dead letters + side outputs + filtered + tombstones + empty;
- dead letters byte-exact: each keeps the exact value and key bytes and the coordinates it was read at.

By default it runs as production does: an exception that is not the record's fault becomes a dead
letter ("internal error"), listed by type. ``--strict`` sets ``CDCFLOW_STRICT_DECODE=1`` as the test
suite does, so those raise and are listed with a minimized input.

    .venv/bin/python bench/fuzz.py [--messages 250000] [--seed 12] [--strict] [--only canal-json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "formats"))

from cdcflow.formats.base import STRICT_DECODE_ENV  # noqa: E402
from cdcflow.formats.errors import excerpt  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=250_000)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--big", type=int, default=1_000_000, help="longest value / deepest nesting, bytes")
    parser.add_argument("--slow-ms", type=float, default=100.0)
    parser.add_argument("--strict", action="store_true", help="raise internal errors (as the test suite)")
    parser.add_argument("--only", help="one format")
    args = parser.parse_args()
    if args.strict:
        os.environ[STRICT_DECODE_ENV] = "1"
    else:
        os.environ.pop(STRICT_DECODE_ENV, None)

    import fuzz_corpus

    targets = [t for t in fuzz_corpus.targets() if args.only in (None, t.format)]
    mutator = fuzz_corpus.Mutator(args.seed, big=args.big)
    each, extra = divmod(args.messages, len(targets))
    tally = fuzz_corpus.Tally()
    per_format: dict[str, fuzz_corpus.Tally] = {}
    started = time.perf_counter()
    for number, target in enumerate(targets):
        result = fuzz_corpus.run_target(
            target, each + (number < extra), mutator, slow_after=args.slow_ms / 1000, keep_slow=10
        )
        tally.add(result)
        per_format.setdefault(target.format, fuzz_corpus.Tally()).add(result)
    elapsed = time.perf_counter() - started

    mode = "strict (internal errors raise)" if args.strict else "production (internal errors dead-lettered)"
    print(f"{len(targets)} decoder configurations, seed {args.seed}, {mode}, {elapsed:.1f} s")
    print("\n".join(fuzz_corpus.summary_lines(tally)))
    print(f"{'format':<24}{'messages':>9}{'changes':>9}{'dead':>8}{'internal':>9}{'raised':>7}")
    for name, part in sorted(per_format.items()):
        m = part.metrics
        print(
            f"{name:<24}{part.sent:>9,}{m.changed_messages:>9,}{m.dead_letters:>8,}{m.internal_errors:>9,}"
            f"{len(part.raised):>7,}"
        )
    must = " (must be 0)" if tally.slow_count else ""
    print(f"messages slower than {args.slow_ms:g} ms (CPU time): {tally.slow_count}{must}")
    print("  slowest:")
    for cpu, wall, target_name, origin in tally.slow[:5]:
        print(f"  {cpu * 1000:6.1f} ms CPU ({wall * 1000:.0f} ms wall)  {target_name}  {origin}")
    accounted = not tally.unaccounted and tally.metrics.unaccounted() == 0
    accounted = accounted and tally.metrics.messages + len(tally.raised) == tally.sent
    print(
        f"accounting: {tally.metrics.messages:,} decoded == {tally.metrics.accounted():,} with an outcome; "
        f"{len(tally.raised):,} raised: {'ok' if accounted else 'BROKEN'}"
    )
    for line in tally.unaccounted[:5]:
        print(f"  {line}")
    print(f"dead letters byte-exact with their coordinates: {'ok' if not tally.not_exact else 'BROKEN'}")
    for line in tally.not_exact[:5]:
        print(f"  {line}")
    if tally.internal_reasons:
        print("internal errors (dead-lettered; each is a cdcflow bug):")
        for reason, count in Counter(tally.internal_reasons).most_common(15):
            print(f"  {count:>6,}  {reason}")
    if tally.raised:
        print(f"raw exceptions: {len(tally.raised)} (must be 0)")
        by_name = {t.name: t for t in targets}
        firsts: dict[tuple[str, str, str], fuzz_corpus.Failure] = {}
        kinds = Counter((f.format, f.error, f.where) for f in tally.raised)
        for failure in tally.raised:
            firsts.setdefault((failure.format, failure.error, failure.where), failure)
        for kind, count in kinds.most_common(20):
            failure = firsts[kind]
            smallest = fuzz_corpus.minimize(by_name[failure.target], failure)
            print(
                f"  {count:>5} x {failure.format}: {failure.error} at {failure.where}: {failure.text[:120]}"
            )
            print(f"          input ({failure.target}): {excerpt(smallest, 240)}")
    ok = accounted and not tally.raised and not tally.slow_count and not tally.not_exact
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
