#!/usr/bin/env python3
"""Round trips of the `allot` CLI against a real `allotd serve`, as a person sees them:
process start, connect, one RPC, print. Prints p50/p90/max in milliseconds for
`allot submit`, `allot queue` (500 pending workloads) and `allot share`.

    scripts/bench-cli.py [BIN_DIR] [--runs N]

BIN_DIR holds allotd and allot (default target/release). To compare two builds, run
it once per BIN_DIR on the same machine.
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
    with open(os.path.join(d, "allotd.toml"), "w") as f:
        f.write(f'[server]\nlisten = "127.0.0.1:{port}"\nmetrics_listen = ""\n'
                f'state_dir = "{d}/state"\n'
                '[[group]]\nname = "demo-a"\nweight = 1\n[[group]]\nname = "demo-b"\nweight = 1\n')
    srv = subprocess.Popen([allotd, "serve", "--config", os.path.join(d, "allotd.toml")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = os.path.join(d, "agent.sock")
    with open(os.path.join(d, "agent.toml"), "w") as f:
        f.write(f'[agent]\nsocket = "{sock}"\nstate_dir = "{d}/agent"\n'
                f'allocator = "http://127.0.0.1:{port}"\nhost = "bench-node"\n'
                'allow_root = true\n'
                '[health]\nsource = "fake:8"\n')
    agent = subprocess.Popen([os.path.join(bin_dir, "allot-agent"), "--config",
                              os.path.join(d, "agent.toml")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ, ALLOT_SERVER=f"http://127.0.0.1:{port}", ALLOT_SOCKET=sock)
    def run(*a):
        return subprocess.run([allot, *a], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode
    try:
        for _ in range(400):
            out = subprocess.run([allot, "nodes"], env=env, capture_output=True, text=True)
            if "bench-node" in out.stdout:
                break
            time.sleep(0.05)
        # The host is drained so that every submission stays pending (nothing runs).
        if run("nodes", "drain", "bench-node", "--reason", "bench") != 0:
            sys.exit("cannot drain the bench node")
        time.sleep(1)
        submit = ["submit", "--project", "demo-a", "--gpus", "1", "--", "sleep", "60"]
        for _ in range(500):
            run(*submit)
        out = subprocess.run([allot, "queue", "--json"], env=env, capture_output=True, text=True)
        pending = out.stdout.count('"pending"')
        if pending < 500:
            sys.exit(f"only {pending} workloads pending")
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
        print(f"allot round trips ({bin_dir}, {runs} runs each, 500 pending workloads)")
        for name, a in [("submit", submit), ("queue", ["queue"]), ("share", ["share"])]:
            ts = timed(*a)
            print(f"  {name:<7} p50 {statistics.median(ts):6.1f} ms   p90 {ts[int(len(ts) * 0.9) - 1]:6.1f} ms   max {ts[-1]:6.1f} ms")
    finally:
        agent.terminate()
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
        shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
    main()
