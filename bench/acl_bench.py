"""Cost of an ACL decision at the proxy (issue 28's "fast" target).

With 1,000, 10,000 and 100,000 ACL bindings loaded (the shape of a multi-tenant cluster: each
tenant a principal with LITERAL and PREFIXED topic bindings, its group prefix, a few DENYs, and
some ``User:*`` wildcards), the time of one decision:

- on a cache miss: every question new (a new topic name each time), so the index is walked;
- on a cache hit: the same questions again.

Target: a decision on a cache miss with 100,000 bindings under 20 us, and no growth with the
number of bindings (the index looks up a few keys whatever their number).

Run: python bench/acl_bench.py [--questions N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.authorizer.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kafka_quota_proxy.authorizer.standard import StandardAuthorizer

Op = AclOperation
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
TARGET_US = 20.0


def tenants_acls(n: int, rng: random.Random) -> tuple[list[AclBinding], int]:
    """About ``n`` bindings: 10 per tenant (the number of tenants is returned)."""
    tenants = max(1, n // 10)
    out: list[AclBinding] = []
    for t in range(tenants):
        who = f"User:tenant-{t}"
        prefix = f"t{t}."
        out += [
            AclBinding(TOPIC, prefix, PatternType.PREFIXED, who, "*", Op.WRITE, ALLOW),
            AclBinding(TOPIC, prefix, PatternType.PREFIXED, who, "*", Op.READ, ALLOW),
            AclBinding(TOPIC, f"{prefix}audit", PatternType.LITERAL, who, "*", Op.WRITE, DENY),
            AclBinding(TOPIC, f"shared.{t % 50}", PatternType.LITERAL, who, "*", Op.READ, ALLOW),
            AclBinding(GROUP, prefix, PatternType.PREFIXED, who, "*", Op.READ, ALLOW),
            AclBinding(TOPIC, f"{prefix}in.", PatternType.PREFIXED, who, "*", Op.DESCRIBE,
                       ALLOW),
            AclBinding(TOPIC, f"{prefix}out.", PatternType.PREFIXED, who, "*", Op.CREATE,
                       ALLOW),
            AclBinding(TOPIC, f"legacy-{t}", PatternType.LITERAL, who, "10.0.0.1", Op.ALL,
                       ALLOW),
            AclBinding(GROUP, f"{prefix}admin", PatternType.LITERAL, who, "*", Op.DELETE,
                       ALLOW),
            AclBinding(TOPIC, f"{prefix}tmp-", PatternType.PREFIXED, who, "*", Op.DELETE,
                       ALLOW),
        ]
    out += [AclBinding(TOPIC, "public.", PatternType.PREFIXED, "User:*", "*", Op.READ, ALLOW),
            AclBinding(GROUP, "*", PatternType.LITERAL, "User:*", "*", Op.DESCRIBE, ALLOW)]
    rng.shuffle(out)
    return out, tenants


def questions(k: int, tenants: int, rng: random.Random
              ) -> list[tuple[str, str, AclOperation, ResourceType, str]]:
    """``k`` distinct questions a tenant's clients ask (mostly their own topics)."""
    out = []
    for i in range(k):
        t = rng.randrange(tenants)
        kind = rng.random()
        if kind < 0.6:
            q = (f"User:tenant-{t}", "10.0.0.2", Op.WRITE, TOPIC, f"t{t}.events-{i}")
        elif kind < 0.8:
            q = (f"User:tenant-{t}", "10.0.0.2", Op.READ, TOPIC, f"t{rng.randrange(tenants)}.x{i}")
        elif kind < 0.9:
            q = (f"User:tenant-{t}", "10.0.0.2", Op.READ, GROUP, f"t{t}.group-{i}")
        else:
            q = (f"User:tenant-{t}", "10.0.0.2", Op.DESCRIBE, TOPIC, f"public.feed-{i}")
        out.append(q)
    return out


def per_decision_us(authorizer: StandardAuthorizer,
                    asked: list[tuple[str, str, AclOperation, ResourceType, str]]) -> float:
    started = time.perf_counter()
    for q in asked:
        authorizer.authorize(*q)
    return (time.perf_counter() - started) / len(asked) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(7)
    print(f"ACL decisions, {args.questions:,} distinct questions per round, median of 5 rounds")
    print(f"  {'bindings':>9}  {'miss us':>8}  {'hit us':>7}  {'load s':>7}")
    worst = 0.0
    for n in (1_000, 10_000, 100_000):
        acls, tenants = tenants_acls(n, rng)
        started = time.perf_counter()
        authorizer = StandardAuthorizer(acls, super_users=["User:admin"])
        load_s = time.perf_counter() - started
        misses, hits = [], []
        for _ in range(5):
            asked = questions(args.questions, tenants, rng)
            authorizer._changed()  # (an empty cache: every question a miss)
            misses.append(per_decision_us(authorizer, asked))
            hits.append(per_decision_us(authorizer, asked))
        miss, hit = statistics.median(misses), statistics.median(hits)
        worst = max(worst, miss) if n == 100_000 else worst
        print(f"  {len(authorizer):>9,}  {miss:>8.2f}  {hit:>7.2f}  {load_s:>7.2f}")
    verdict = "PASS" if worst < TARGET_US else "FAIL"
    print(f"target: a decision on a cache miss with 100,000 bindings < {TARGET_US:g} us: "
          f"{verdict} ({worst:.2f} us)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
