#!/usr/bin/env python3
"""Round trips of the `allot` CLI against a real `allotd serve`, as a person sees them:
process start, connect, one RPC, print. Prints p50/p90/p99/max in milliseconds for
`allot submit`, `allot queue` (500 pending workloads) and `allot share`, first over
TLS with a token (what a cluster runs), then over plain HTTP/2 on loopback
(`[tls] plaintext_loopback`, same allotd state) for comparison.

    scripts/bench-cli.py [BIN_DIR] [--runs N]

BIN_DIR holds allotd, allot and allot-agent (default target/release). To compare two
builds, run it once per BIN_DIR on the same machine.
"""
import os, shutil, socket, statistics, subprocess, sys, tempfile, time

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    runs = 50
    if "--runs" in sys.argv:
        runs = int(sys.argv[sys.argv.index("--runs") + 1])
        args = [a for a in args if a != str(runs)]
    bin_dir = os.path.abspath(args[0] if args else "target/release")
    allotd, allot = os.path.join(bin_dir, "allotd"), os.path.join(bin_dir, "allot")
    d = tempfile.mkdtemp(prefix="allot-bench-cli-")
    port = free_port()
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    conf = os.path.join(d, "allotd.toml")
    def write_conf(plain):
        with open(conf, "w") as f:
            f.write(f'[server]\nlisten = "127.0.0.1:{port}"\nmetrics_listen = ""\n'
                    f'state_dir = "{d}/state"\n'
                    f'[tls]\nplaintext_loopback = {"true" if plain else "false"}\n'
                    f'[roles]\nadmins = ["{me}"]\n'
                    '[[group]]\nname = "demo-a"\nweight = 1\nopen = true\n'
                    '[[group]]\nname = "demo-b"\nweight = 1\nopen = true\n')
    def start():
        return subprocess.Popen([allotd, "serve", "--config", conf],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def admin(*a):
        for _ in range(200):
            out = subprocess.run([allotd, *a, "--config", conf], capture_output=True, text=True)
            if out.returncode == 0:
                return out.stdout.strip()
            time.sleep(0.05)
        sys.exit(f"allotd {' '.join(a)}: {out.stderr}")
    write_conf(False)
    srv = start()
    agent = None
    try:
        token = admin("tokens", "create", "--user", me)
        ca = os.path.join(d, "state", "pki", "ca.pem")
        sock = os.path.join(d, "agent.sock")
        with open(os.path.join(d, "agent.toml"), "w") as f:
            f.write(f'[agent]\nsocket = "{sock}"\nstate_dir = "{d}/agent"\n'
                    f'allocator = "https://127.0.0.1:{port}"\nhost = "bench-node"\n'
                    'allow_root = true\n'
                    '[health]\nsource = "fake:8"\n')
        enroll = admin("nodes", "enroll", "bench-node")
        subprocess.run([os.path.join(bin_dir, "allot-agent"), "--config",
                        os.path.join(d, "agent.toml"), "enroll", "--server",
                        f"https://127.0.0.1:{port}", "--token", enroll, "--ca", ca],
                       check=True, stdout=subprocess.DEVNULL)
        agent = subprocess.Popen([os.path.join(bin_dir, "allot-agent"), "--config",
                                  os.path.join(d, "agent.toml")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        env = dict(os.environ, ALLOT_SERVER=f"https://127.0.0.1:{port}", ALLOT_CA=ca,
                   ALLOT_TOKEN=token, ALLOT_SOCKET=sock)
        def run(*a):
            return subprocess.run([allot, *a], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode
        for _ in range(400):
            out = subprocess.run([allot, "nodes"], env=env, capture_output=True, text=True)
            if "bench-node" in out.stdout:
                break
            time.sleep(0.05)
        # The host is drained so that every submission stays pending (nothing runs).
        if run("nodes", "drain", "bench-node", "--reason", "bench") != 0:
            sys.exit("cannot drain the bench node")
        agent.terminate(); agent.wait(10); agent = None
        submit = ["submit", "--project", "demo-a", "--gpus", "1", "--", "sleep", "60"]
        for _ in range(500):
            run(*submit)
        out = subprocess.run([allot, "queue", "--json"], env=env, capture_output=True, text=True)
        if out.stdout.count('"pending"') < 500:
            sys.exit(f"only {out.stdout.count('pending')} workloads pending")
        def timed(*a):
            ts = []
            for _ in range(runs):
                t0 = time.perf_counter()
                rc = run(*a)
                ts.append((time.perf_counter() - t0) * 1000)
                if rc != 0:
                    sys.exit(f"allot {' '.join(a)} failed")
            ts.sort()
            return ts
        def report(label):
            print(f"allot round trips, {label} ({bin_dir}, {runs} runs each, 500+ pending workloads)")
            for name, a in [("submit", submit), ("queue", ["queue"]), ("share", ["share"])]:
                ts = timed(*a)
                p = lambda q: ts[min(len(ts) - 1, int(len(ts) * q))]
                print(f"  {name:<7} p50 {statistics.median(ts):6.1f} ms   p90 {p(0.9):6.1f} ms"
                      f"   p99 {p(0.99):6.1f} ms   max {ts[-1]:6.1f} ms")
        report("TLS + token")
        # The same state, served plain on loopback.
        srv.terminate(); srv.wait(10)
        write_conf(True)
        srv = start()
        env["ALLOT_SERVER"] = f"http://127.0.0.1:{port}"
        for _ in range(200):
            if run("share") == 0:
                break
            time.sleep(0.05)
        report("plain HTTP/2 on loopback + token")
    finally:
        if agent:
            agent.terminate()
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
        shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
    main()
