"""Installs queue instead of failing on dpkg's lock (devstack/debian_packages.py):
CI's test processes start the container engine's, Ceph's and the browser's
installs side by side on a machine that has none of them."""

from __future__ import annotations

import fcntl
import time

import pytest

from devstack import debian_packages


def test_an_install_queued_behind_another_gives_up_after_its_bound_in_one_line(
        monkeypatch, tmp_path) -> None:
    lock = tmp_path / "apt-install.lock"
    monkeypatch.setattr(debian_packages, "_lock_path", lambda: lock)
    monkeypatch.setattr(debian_packages, "can_install", lambda: True)
    with open(lock, "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another install under way
        started = time.monotonic()
        with pytest.raises(debian_packages.InstallError) as raised:
            debian_packages.install(["tokenmill-no-such-package"], timeout_s=1)
        waited = time.monotonic() - started
    assert str(raised.value) == (f"apt-get install tokenmill-no-such-package: another install "
                                 f"held {lock} for 1 s")
    assert 1 <= waited < 30, waited  # it waited its bound, then gave up


def test_an_install_where_tokenmill_does_not_install_says_what_to_run(monkeypatch) -> None:
    monkeypatch.setattr(debian_packages, "can_install", lambda: False)
    with pytest.raises(debian_packages.InstallError,
                       match="^apt-get install podman runc: tokenmill installs packages "
                             "itself only as root on Debian$"):
        debian_packages.install(["podman", "runc"])
