"""The chart's pod on a real kernel (root only; skipped otherwise, failed under
WARMPATH_REQUIRE_BPF=1): the agent with exactly the capability set the chart renders, and in
the pod's cgroup layout, emulated with setpriv and unshare. Only a child cgroup this test
creates is attached to, the VIP is a loopback address, and everything is removed afterwards."""

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import BIN, wait_until
from test_chart import agent_container, helm, render  # noqa: F401 (helm: the fixture)


# === the capability set, on a real kernel (root only) ===

CAP_BITS = {"NET_ADMIN": 12, "PERFMON": 38, "BPF": 39}


def bpf_gate():
    """Why the kernel check cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    if not shutil.which("setpriv"):
        return "needs setpriv (util-linux)"
    with open("/proc/self/mounts") as f:
        mounts = [line.split() for line in f]
    if not any(m[1] == "/sys/fs/bpf" and m[2] == "bpf" for m in mounts):
        return "needs bpffs at /sys/fs/bpf"
    if not any(m[2] == "cgroup2" for m in mounts):
        return "needs a cgroup v2 hierarchy"
    return None


@pytest.fixture
def kernel(start_sim):
    """A child cgroup to attach to, a simulator, and a way to run the agent with only some
    capabilities, as the chart's pod runs it; everything removed afterwards."""
    why = bpf_gate()
    if why:
        if os.environ.get("WARMPATH_REQUIRE_BPF") == "1":
            pytest.fail(f"the capability check {why}")
        pytest.skip(f"the capability check {why}")
    with open("/proc/self/mounts") as f:
        root = next(line.split()[1] for line in f if line.split()[2] == "cgroup2")
    cgroup = os.path.join(root, f"wp-chart-caps-{os.getpid()}")
    pins = f"/sys/fs/bpf/wp-chart-caps-{os.getpid()}"
    os.mkdir(cgroup)
    started = []
    sim = start_sim()

    def agent(caps, log, pod=False):
        """The agent with only `caps`. `pod`: as in the chart's container, in a cgroup
        namespace of its own cgroup (`agent/`), with a cgroup2 mount rooted there where the
        runtime puts it, and the host's hierarchy bound elsewhere (the chart's
        /run/warmpath/cgroup); clients then run in `client/`."""
        listen, admin = free_port(), free_port()
        vip = "127.77.23.1:8000"
        bounding = ",".join(["-all"] + [f"+{c.lower()}" for c in caps])
        target = cgroup
        prefix = []
        if pod:
            for child in ("agent", "client"):
                os.makedirs(os.path.join(cgroup, child), exist_ok=True)
            hostview = log.parent / f"host-cgroup-{log.stem}"
            hostview.mkdir()
            target = os.path.join(hostview, os.path.relpath(cgroup, root))
            # The runtime's cgroup2 mount goes over a tmpfs (a cgroup2 mount straight over the
            # host's is refused: same superblock on its own mount point).
            inner = (f'mount --bind {root} {hostview} && mount -t tmpfs tmpfs {root} && '
                     f'mount -t cgroup2 cgroup2 {root} && exec "$@"')
            prefix = ["sh", "-c", f"echo $$ > {cgroup}/agent/cgroup.procs && exec unshare -C -m "
                      f"--propagation private -- sh -c '{inner}' sh \"$@\"", "sh"]
        cmd = prefix + ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "--", BIN, "agent",
                        "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}", "--endpoint",
                        sim.url(), "--redirect", f"{vip}=127.0.0.1:{listen}", "--cgroup", target, "--pin-dir", pins]
        out = open(log, "w")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
        started.append(proc)

        def outcome():
            assert proc.poll() is None, open(log).read()[-2000:]
            text = open(log).read()
            return next((w for w in ("interception attached", "interception off") if w in text), None)

        return proc, vip, wait_until("interception attached or off", outcome, timeout=30)

    def cleanup(caps):
        bounding = ",".join(["-all"] + [f"+{c.lower()}" for c in caps])
        return subprocess.run(["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "--", BIN, "agent",
                               "--cleanup", "--pin-dir", pins], capture_output=True, text=True, timeout=60)

    agent.cgroup, agent.pins, agent.cleanup = cgroup, pins, cleanup
    try:
        yield agent
    finally:
        for proc in started:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.path.exists(pins):
            subprocess.run([BIN, "agent", "--cleanup", "--pin-dir", pins], capture_output=True, timeout=60)
        for leaf in [os.path.join(cgroup, c) for c in ("agent", "client") if os.path.isdir(os.path.join(cgroup, c))] + [cgroup]:
            with open(os.path.join(leaf, "cgroup.procs")) as f:
                for pid in f.read().split():
                    with open(os.path.join(root, "cgroup.procs"), "w") as parent:
                        parent.write(pid)
            os.rmdir(leaf)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dial_from(cgroup, vip):
    """GET /v1/models on the VIP from a process in `cgroup`: its connect is the one rewritten."""
    script = (f"import urllib.request; open('{cgroup}/cgroup.procs', 'w').write(str(__import__('os').getpid())); "
              f"print(urllib.request.urlopen('http://{vip}/v1/models', timeout=5).status)")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)


def test_the_chart_capabilities_are_enough_and_each_is_needed(helm, kernel, tmp_path):
    """The agent as the chart runs it — uid 0 with exactly the rendered capability set —
    loads, attaches, intercepts a VIP for a cgroup and cleans up; without NET_ADMIN or
    PERFMON it cannot load the programs and says why."""
    caps = agent_container(render(helm))["securityContext"]["capabilities"]["add"]
    proc, vip, outcome = kernel(caps, tmp_path / "all.log")
    assert outcome == "interception attached", (tmp_path / "all.log").read_text()[-2000:]
    with open(f"/proc/{proc.pid}/status") as f:
        (eff,) = [int(line.split()[1], 16) for line in f if line.startswith("CapEff:")]
    assert eff == sum(1 << CAP_BITS[c] for c in caps), hex(eff)
    served = dial_from(kernel.cgroup, vip)
    assert served.stdout.strip() == "200", served.stderr
    proc.terminate()
    proc.wait(timeout=10)
    assert os.path.isdir(kernel.pins), "a stopped agent leaves its pins (upgrade)"
    cleaned = kernel.cleanup(caps)
    assert cleaned.returncode == 0, cleaned.stderr
    assert not os.path.exists(kernel.pins)
    for missing, why in [("NET_ADMIN", "Operation not permitted"),
                         ("PERFMON", "variable stack access prohibited for !root")]:
        log = tmp_path / f"no-{missing}.log"
        proc, _, outcome = kernel([c for c in caps if c != missing], log)
        assert outcome == "interception off", log.read_text()[-2000:]
        # Without NET_ADMIN the first refusal may be a program load or the socket map sock_ops
        # keeps (SOCKHASH needs it too); either way the log names the failing step and errno.
        text = log.read_text()
        failed = "BPF_PROG_LOAD" in text or "failed to create map `WARMPATH_SOCKHASH`" in text
        assert failed and why in text, text[-3000:]


def test_in_the_pods_layout_the_agent_excludes_its_own_cgroup(helm, kernel, tmp_path):
    """The chart mounts the host's cgroup v2 hierarchy at /run/warmpath/cgroup and leaves the
    container's own /sys/fs/cgroup in place: in the pod's cgroup namespace, the root of that
    mount is the agent's own cgroup, which it excludes by id, while the programs attach to the
    host's hierarchy. Emulated with unshare; the excluded id must be the agent's cgroup's."""
    caps = agent_container(render(helm))["securityContext"]["capabilities"]["add"]
    proc, vip, outcome = kernel(caps, tmp_path / "pod.log", pod=True)
    log = re.sub(r"\x1b\[[0-9;]*m", "", (tmp_path / "pod.log").read_text())
    assert outcome == "interception attached", log[-2000:]
    (excluded,) = re.findall(r"interception attached.* excluded_id=(\d+)", log)
    assert int(excluded) == os.stat(os.path.join(kernel.cgroup, "agent")).st_ino
    # Not the host's root (what mounting the host hierarchy over /sys/fs/cgroup would give).
    assert int(excluded) != os.stat(os.path.dirname(kernel.cgroup)).st_ino
    served = dial_from(os.path.join(kernel.cgroup, "client"), vip)
    assert served.stdout.strip() == "200", served.stderr
