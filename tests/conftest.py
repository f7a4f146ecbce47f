"""The suite's order: the fast layers first (unit, then Spark, then end to end, as
``testpaths`` lists them), and within the slow layers the longest modules first, so that the
parallel workers of ``make test`` (pytest-xdist, one module per worker at a time) do not end
waiting on one long module started last."""

from __future__ import annotations

import pytest

# Modules of more than ~30 s (measured with --durations), longest first.
LONGEST_FIRST = (
    "tests/spark/test_cluster.py",
    "tests/e2e/test_quotas.py",
    "tests/e2e/test_demo.py",
    "tests/e2e/test_security.py",
    "tests/e2e/test_storage_rate.py",
    "tests/e2e/test_drill_soak.py",
    "tests/e2e/test_capture.py",
    "tests/e2e/test_shared_quotas.py",
    "tests/e2e/test_strict_pacing.py",
    "tests/e2e/test_strict_pacing_shared.py",
    "tests/e2e/test_forged_records.py",
    "tests/e2e/test_install.py",
    "tests/e2e/test_shadow_quotas.py",
    "tests/e2e/test_request_quota.py",
    "tests/e2e/test_drill_faults.py",
    "tests/e2e/test_quota_admin.py",
    "tests/spark/test_jobs.py",
    "tests/spark/test_multi_process.py",
    "tests/spark/test_tune.py",
    "tests/e2e/test_image_context.py",
    "tests/e2e/test_first_writes.py",
    "tests/e2e/test_storage.py",
    "tests/e2e/test_drill_fuzz.py",
    "tests/e2e/test_drill_churn.py",
)
_RANK = {path: i for i, path in enumerate(LONGEST_FIRST)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def layer(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        if path.startswith("tests/unit/"):
            return (0, 0)
        return (1, _RANK.get(path, len(_RANK)))

    items.sort(key=layer)  # (stable: each module's tests keep their order)
