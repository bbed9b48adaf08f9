"""Fixtures the pytest integration tests share (pytest loads this file by
itself): a fresh mount per test, and the two ordinary test users.

A test that fails with the `mount` fixture gets the mount's diagnostics in
its report (workload status, the restore file, the daemon's log, the newest
CRIU logs); with KEEP_WORK=1 in the environment its work dir is kept."""

import os

import pytest

from gpuckpt_testing.mount import Mount
from gpuckpt_testing.users import USERS, User


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    item.gpuckpt_failed = True
    mount = getattr(item, "funcargs", {}).get("mount")
    if isinstance(mount, Mount):
        try:
            report.sections.append(("gpuckpt diagnostics", mount.diagnostics()))
        except Exception as e:  # pylint: disable=broad-except
            report.sections.append(("gpuckpt diagnostics", f"could not be gathered: {e}"))


@pytest.fixture
def mount(request):
    """gpuckptfs on a fresh store, unmounted after the test."""
    m = Mount(f"gpuckpt-{request.module.__name__}.")
    try:
        yield m
    finally:
        failed = getattr(request.node, "gpuckpt_failed", False)
        m.close(keep=failed and bool(os.environ.get("KEEP_WORK")))


@pytest.fixture(scope="module")
def users():
    """The two ordinary users (made when absent)."""
    return User(USERS[0]), User(USERS[1])
