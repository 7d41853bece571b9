"""tests/conftest.py's guard fails the tests it is there to fail: one that leaves a file in HOME, one that connects
off the machine even where it catches the refusal, and one that relies on a HOME-derived cache variable; a test
that does none of it passes. Run in a pytest of its own (pytester, a subprocess) with the suite's conftest."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

TESTS = '''
import os, socket
from pathlib import Path

def test_writes_a_cache_into_home():
    (Path.home() / ".cache" / "openrlhf-band").mkdir(parents=True)

def test_connects_off_the_machine_and_swallows_the_refusal():
    sock = socket.socket()
    try:
        sock.connect(("192.0.2.1", 80))  # TEST-NET-1: refused by the guard before anything leaves
    except OSError:
        pass  # a download with a fallback would go on here
    finally:
        sock.close()

def test_sees_a_fresh_home_and_no_cache_variable():
    assert not any(Path.home().iterdir())
    assert "OPENRLHF_BAND_CACHE" not in os.environ and os.environ["PIP_NO_INDEX"] == "1"

def test_loopback_is_allowed():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.socket()
    client.connect(server.getsockname())
    client.close()
    server.close()
'''


def test_the_guard_fails_a_write_into_home_and_a_connection_off_the_machine(pytester, monkeypatch):
    monkeypatch.setenv("OPENRLHF_BAND_CACHE", str(pytester.path / "a-users-cache"))  # unset for the tests
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_guarded=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=4, errors=2)
    output = result.stdout.str()
    assert "ERROR at teardown of test_writes_a_cache_into_home" in output
    assert "wrote into HOME (a unit test writes only under its tmp dirs): ['.cache']" in output
    assert "ERROR at teardown of test_connects_off_the_machine_and_swallows_the_refusal" in output
    assert "tried to reach the network: [\"connect('192.0.2.1', 80)\"]" in output
