"""`GR00T_TEST_REQUIRE=port,simulator,cluster,root` (set in .ci/run): a test skipped for want of one of these fails
instead, so that CI cannot go green on a machine that quietly stopped running the port hand-off, the simulated
devices, the cluster or the tests that need root. A skip names what it lacks by starting its reason with the
capability in brackets (`needs`); a pytest plugin (tests/conftest.py `pytest_plugins`)."""

from __future__ import annotations

import os
import re

import pytest

CAPABILITIES = ("port", "simulator", "cluster", "root")
REQUIRED = frozenset(c.strip() for c in os.environ.get("GR00T_TEST_REQUIRE", "").split(",") if c.strip())


def needs(capability: str, reason: str) -> str:
    """A skip reason that names the capability it lacks: `[cluster] workers in mount namespaces need root`."""
    assert capability in CAPABILITIES, capability
    return f"[{capability}] {reason}"


def pytest_configure(config) -> None:
    unknown = REQUIRED - set(CAPABILITIES)
    if unknown:
        raise pytest.UsageError(f"GR00T_TEST_REQUIRE names {', '.join(sorted(unknown))}: expected some of "
                                f"{', '.join(CAPABILITIES)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and REQUIRED) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    lacking = re.match(r"(?:Skipped: )?\[(\w+)\]", reason)
    if lacking and lacking.group(1) in REQUIRED:
        report.outcome = "failed"
        report.longrepr = (f"GR00T_TEST_REQUIRE={','.join(sorted(REQUIRED))} requires {lacking.group(1)}, which "
                           f"this run lacks: {reason}")
