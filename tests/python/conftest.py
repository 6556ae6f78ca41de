"""Fixtures: real `warmpath sim` processes on loopback, stopped after each test."""

import json
import os
import subprocess
import time

import pytest

BIN = os.environ.get("WARMPATH_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "target", "debug", "warmpath"))


class Sim:
    def __init__(self, proc, ready):
        self.proc = proc
        self.engines = ready["engines"]

    def url(self, i=0):
        return "http://" + self.engines[i]["http"]

    def events(self, i=0):
        return self.engines[i]["kv_events"]

    def replay(self, i=0):
        return self.engines[i]["kv_replay"]


@pytest.fixture
def start_sim():
    started = []

    def start(*flags):
        cmd = [BIN, "sim", "--port", "0", "--profile", "tiny", *flags]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        line = proc.stdout.readline()
        assert line, f"{cmd} exited with {proc.wait()}"
        return Sim(proc, json.loads(line))

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_until(what, check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def start_agent():
    """A `warmpath agent` routing proxy in front of a simulator, both real processes."""
    started = []

    def start(sim, *flags):
        import socket

        def free():
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            return port

        listen, admin = free(), free()
        cmd = [BIN, "agent", "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}", "--explain", *flags]
        for e in sim.engines:
            cmd += ["--endpoint", "http://" + e["http"]]
            if e["kv_events"]:
                cmd += ["--kv-events", e["kv_events"]]
            if e["kv_replay"]:
                cmd += ["--kv-replay", e["kv_replay"]]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        import urllib.request

        def ready():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as r:
                    return r.status == 200
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                return False

        wait_until("agent ready", ready)
        start.proc = proc
        start.admin = f"http://127.0.0.1:{admin}"
        return f"http://127.0.0.1:{listen}"

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
