"""Fixtures the pytest integration tests share (pytest loads this file by
itself): a fresh mount per test, and the two ordinary test users."""

import pytest

from harness import USERS, Mount, User


@pytest.fixture
def mount(request):
    """gpuckptfs on a fresh store, unmounted after the test."""
    m = Mount(f"gpuckpt-{request.module.__name__}.")
    try:
        yield m
    finally:
        m.close()


@pytest.fixture(scope="module")
def users():
    """The two ordinary users (made when absent)."""
    return User(USERS[0]), User(USERS[1])
